"""Prometheus metrics of consumer shards (Gazette's ``gazette_shard_*``), served at
``/debug/metrics`` of the consumer's port.

Invariants: every series is labelled by the shard's ID (and journal where it concerns one);
counters advance once per completed transaction (its commit and ACKs resolved, in
transaction order), never per message, so the hot path stays free of metric calls.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "SHARD_UP",
    "TXN_SECONDS",
    "TXN_TOTAL",
    "READ_BYTES",
    "READ_HEAD",
    "READ_LAG",
    "READ_MESSAGES",
]

SHARD_UP = Gauge("gazette_shard_up", "Processing status of a shard by this consumer (1 = in status).",
                 ["shard", "status"])
TXN_TOTAL = Counter("gazette_shard_transactions_total", "Total number of consumer transactions.",
                    ["shard"])
READ_MESSAGES = Counter("gazette_shard_read_messages_total",
                        "Total number of messages processed by completed consumer transactions.",
                        ["shard"])
READ_BYTES = Counter("gazette_shard_read_bytes_total",
                     "Total byte-length of messages processed by completed consumer transactions.",
                     ["shard"])
READ_HEAD = Gauge("gazette_shard_read_head",
                  "Read-through offset of the shard's last completed transaction, by journal.",
                  ["shard", "journal"])
READ_LAG = Gauge("gazette_shard_read_lag_bytes",
                 "Bytes of a source journal the shard has yet to process (last seen write head "
                 "minus read-through offset).", ["shard", "journal"])
TXN_SECONDS = Histogram("gazette_shard_txn_seconds",
                        "Duration of consumer transactions from first message to durable commit.",
                        ["shard"], buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))

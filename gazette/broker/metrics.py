"""Prometheus metrics of a broker (served at ``/debug/metrics``, see ``gazette.server.http``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

APPEND_BYTES = Counter("gazette_append_bytes_total", "Bytes committed by Append RPCs served locally.")
APPENDS = Counter("gazette_appends_total", "Append RPCs served locally, by status.", ["status"])
READ_BYTES = Counter("gazette_read_bytes_total", "Bytes sent by Read RPCs served locally.")
COMMIT_SECONDS = Histogram(
    "gazette_append_commit_seconds",
    "Time from an Append's first content chunk to its commit.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

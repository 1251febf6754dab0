"""The consumer's key space: what its values under the allocator's layout decode to.

Items are ShardSpecs, members ConsumerSpecs, assignments ReplicaStatus (an empty value is the
IDLE status). The layout itself is ``gazette.allocator.keys``, shared with brokers.

Invariants: a ShardSpec's id and a ConsumerSpec's ID agree with their keys, or the value is
refused (the keyspace keeps the last good one).
"""

from __future__ import annotations

from typing import Any

from gazette.allocator.keys import layout_decoder, parse_message
from gazette.etcd.keyspace import Decoder
from gazette.protocol import consumer_pb2

__all__ = ["consumer_decoder"]


def _status(key: str, raw: bytes) -> Any:
    return parse_message(consumer_pb2.ReplicaStatus, key, raw)


def consumer_decoder(root: str) -> Decoder:
    """Decodes a consumer keyspace rooted at ``root``."""
    return layout_decoder(root, item_type=consumer_pb2.ShardSpec, item_field="id",
                          member_type=consumer_pb2.ConsumerSpec, assignment=_status)

"""The broker's key space: what its values under the allocator's layout decode to.

Items are JournalSpecs, members BrokerSpecs, assignments the Route the journal's primary last
synchronised (the allocator reads it as "consistent"), None for an empty value. The layout
itself is ``gazette.allocator.keys``, shared with consumers.

Invariants: a JournalSpec's name and a BrokerSpec's ID agree with their keys, or the value is
refused (the keyspace keeps the last good one).
"""

from __future__ import annotations

from typing import Any

from gazette.allocator.keys import layout_decoder, parse_message
from gazette.etcd.keyspace import Decoder
from gazette.protocol import protocol_pb2 as pb

__all__ = ["broker_decoder"]


def _route(key: str, raw: bytes) -> Any:
    return parse_message(pb.Route, key, raw) if raw else None


def broker_decoder(root: str) -> Decoder:
    """Decodes a broker keyspace rooted at ``root``."""
    return layout_decoder(root, item_type=pb.JournalSpec, item_field="name",
                          member_type=pb.BrokerSpec, assignment=_route)

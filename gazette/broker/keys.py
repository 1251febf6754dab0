"""The broker's key space: what its values under the allocator's layout decode to.

Items are JournalSpecs, members BrokerSpecs, assignments the Route the journal's primary last
synchronised (the allocator reads it as "consistent"), None for an empty value. The layout
itself is ``gazette.allocator.keys``, shared with consumers.

Invariants: a JournalSpec's name and a BrokerSpec's ID agree with their keys, or the value is
refused (the keyspace keeps the last good one). Assignments with equal bytes share one decoded
Route (values are read-only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gazette.allocator.keys import layout_decoder, parse_message
from gazette.etcd.keyspace import Decoder
from gazette.protocol import protocol_pb2 as pb

__all__ = ["broker_decoder"]


ROUTES_SHARED = 4096
"""Distinct Route values a decoder shares before it starts its table afresh."""


def _routes() -> Callable[[str, bytes], Any]:
    """A Route decoder that shares one decoded Route among assignments with equal bytes.

    A cluster's routes repeat: with B brokers and replication R there are at most
    B!/(B-R)! orderings of members, whatever the journal count, and a decoded Route costs
    about a kilobyte (its protobuf arena) against a dict entry for a shared one. Keyspace
    values are read-only, so sharing is safe. The table is bounded: past ``ROUTES_SHARED``
    distinct values it is emptied (values already decoded stay shared where they are)."""
    table: dict[bytes, pb.Route] = {}

    def route(key: str, raw: bytes) -> Any:
        if not raw:
            return None
        value = table.get(raw)
        if value is None:
            value = parse_message(pb.Route, key, raw)
            if len(table) >= ROUTES_SHARED:
                table.clear()
            table[raw] = value
        return value

    return route


def broker_decoder(root: str) -> Decoder:
    """Decodes a broker keyspace rooted at ``root``."""
    return layout_decoder(root, item_type=pb.JournalSpec, item_field="name",
                          member_type=pb.BrokerSpec, assignment=_routes())

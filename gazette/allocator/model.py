"""Allocator entities: items, members and assignments, as the allocator sees them.

Their keys (built and parsed by `gazette.allocator.keys`) live under a root prefix:

    {root}/items/{item}                          the item's spec
    {root}/members/{zone}#{suffix}               the member's spec, under the member's lease
    {root}/assign/{item}#{zone}#{suffix}#{slot}  an assignment, under the member's lease

Invariants:

* Names, zones and suffixes hold only characters above '#', so '#' sorts below every
  character of a name and the order of keys equals the order of their parsed tuples:
  assignments sort by (item, zone, suffix), members by (zone, suffix).
* Slot 0 of an item's assignments is its primary; other slots are replicas.
* An `Entry` pairs an entity with the etcd metadata the allocator needs to write
  revision-checked transactions (mod revision, create revision, lease) and the raw value
  (moved verbatim when an assignment changes slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar


@dataclass(frozen=True, slots=True)
class Item:
    """Something to be assigned: a journal, or a shard."""

    name: str
    replication: int  # Desired number of replicas; 0 means "assign nowhere".
    spec: object = None  # The decoded spec (JournalSpec, ShardSpec), for callers.


@dataclass(frozen=True, slots=True)
class Member:
    """A process items may be assigned to: a broker, or a consumer."""

    zone: str
    suffix: str
    limit: int  # Maximum number of assigned items (journal_limit / shard_limit).
    exiting: bool = False  # Signalled to exit: its capacity is shed when the cluster allows.
    spec: object = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """One replica of an item on a member; `slot` 0 is the primary."""

    item: str
    zone: str
    suffix: str
    slot: int
    value: object = None  # Decoded assignment value (a Route, a ReplicaStatus).

    @property
    def member(self) -> tuple[str, str]:
        return (self.zone, self.suffix)


E = TypeVar("E", Item, Member, Assignment)


@dataclass(frozen=True, slots=True)
class Entry(Generic[E]):
    """A decoded allocator entity together with its etcd key metadata."""

    key: str
    decoded: E
    raw: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    lease: int = 0

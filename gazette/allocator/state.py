"""`State`: the allocator's view of one keyspace snapshot, pivoted on the local member.

Invariants:

* `items`, `members` and `assignments` are sorted by key, which (see `model`) is the order
  of item name, of (zone, suffix), and of (item, zone, suffix) respectively.
* `member_total[i]` / `member_primary[i]` count the assignments (resp. slot-0 assignments)
  of existing items held by `members[i]`; assignments naming an absent member or item count
  nowhere (the latter are only ever removed).
* Exiting members are granted `shed[i]` slots of their limit, oldest (lowest create
  revision) first, out of the cluster's excess capacity (member slots beyond item slots),
  and never so many members that fewer remain at full capacity than the largest desired
  replication. `effective_limit(i) = limit - shed[i]`; in the usual case of spare capacity
  an exiting member's effective limit is 0 and its items drain away.
* `zones` are the sorted zones having at least one member of positive effective limit.
* The leader is the member with the lowest (create revision, key).
* `network_key` changes exactly when items, members or their limits change, so a leader can
  keep a solved assignment while only assignments change.
* Extraction is linear in the keyspace. `from_keyspace_yielding` reads the keyspace's lists
  at once (one snapshot, one revision) and then extracts from them, yielding to the event
  loop once it has held it for `HOLD_AT_MOST` seconds (checked every `YIELD_EVERY` entries),
  so that a leader's round never holds the loop for long, nor yields more often than needed
  (on a busy loop each yield waits for everything else that is ready).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gazette.allocator.keys import assignments_prefix, items_prefix, members_key, members_prefix
from gazette.etcd.keyspace import KeySpace, KeyValue

from .model import Assignment, Entry, Item, Member
from .specs import assignment_entry, desired_replication, item_entry, member_entry

YIELD_EVERY = 1000  # entries between pauses of a cooperative extraction: a few milliseconds
HOLD_AT_MOST = 0.025  # seconds a cooperative round holds the event loop before it yields

_T = TypeVar("_T")
Steps = Generator[None, None, _T]  # work that pauses (yields) every YIELD_EVERY entries


def _drain(steps: Steps[_T]) -> _T:
    """Runs `steps` to completion without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def _drain_yielding(steps: Steps[_T]) -> _T:
    """Runs `steps` to completion, letting the event loop run at a pause once `steps` has held
    it for `HOLD_AT_MOST`."""
    held_since = time.perf_counter()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if time.perf_counter() - held_since >= HOLD_AT_MOST:
            await asyncio.sleep(0)
            held_since = time.perf_counter()


IsConsistentFn = Callable[[Entry[Item], Entry[Assignment], Sequence[Entry[Assignment]]], bool]
"""Whether an item's assignment is consistent, given all assignments of the item.

Consistent generally means the replica has synchronised with its peers and the item can
tolerate losing one of its cohort. The allocator never removes a consistent replica if that
would leave fewer consistent replicas than the item's desired replication.
"""


@dataclass(frozen=True, slots=True)
class LocalItem:
    """An item assigned to the local member."""

    item: Entry[Item]
    assignments: Sequence[Entry[Assignment]]  # All assignments of the item.
    index: int  # Index of the local assignment within `assignments`.

    @property
    def assignment(self) -> Entry[Assignment]:
        return self.assignments[self.index]


class EntryCache:
    """Entries decoded for earlier rounds, by (key, mod revision): a key at one revision never
    changes, so a leader's round re-uses every entry its keyspace did not change instead of
    parsing every key again (O(changes) parsing per round, O(n) dictionary look-ups)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], Entry[Any]] = {}

    def extract(self, kvs_and_makers: Sequence[tuple[Sequence[KeyValue], Callable[[KeyValue], Entry[Any]]]],
                ) -> list[list[Entry[Any]]]:
        return _drain(self.extract_steps(kvs_and_makers))

    def extract_steps(
        self, kvs_and_makers: Sequence[tuple[Sequence[KeyValue], Callable[[KeyValue], Entry[Any]]]],
    ) -> Steps[list[list[Entry[Any]]]]:
        """`extract`, pausing every YIELD_EVERY entries (one extraction at a time)."""
        old, new = self._entries, {}
        out: list[list[Entry[Any]]] = []
        n = 0
        for kvs, make in kvs_and_makers:
            entries = []
            for kv in kvs:
                k = (kv.key, kv.mod_revision)
                e = old.get(k)
                if e is None:
                    e = make(kv)
                new[k] = e
                entries.append(e)
                n += 1
                if n % YIELD_EVERY == 0:
                    yield
            out.append(entries)
        self._entries = new  # only what this round used: the cache holds one snapshot
        return out


@dataclass(slots=True)
class State:
    """See the module docstring."""

    root: str
    local_key: str
    is_consistent: IsConsistentFn
    revision: int
    items: list[Entry[Item]]
    members: list[Entry[Member]]
    assignments: list[Entry[Assignment]]

    member_keys: list[str] = field(default_factory=list)
    item_names: list[str] = field(default_factory=list)
    assignments_of: dict[str, list[Entry[Assignment]]] = field(default_factory=dict)
    local_index: int = -1
    local_items: list[LocalItem] = field(default_factory=list)
    zones: list[str] = field(default_factory=list)
    zone_slots: list[int] = field(default_factory=list)
    item_slots: int = 0
    member_slots: int = 0
    member_total: list[int] = field(default_factory=list)
    member_primary: list[int] = field(default_factory=list)
    shed: list[int] = field(default_factory=list)
    network_key: tuple[object, ...] = ()

    @classmethod
    def build(
        cls,
        root: str,
        local_key: str,
        is_consistent: IsConsistentFn,
        items: Sequence[Entry[Item]],
        members: Sequence[Entry[Member]],
        assignments: Sequence[Entry[Assignment]],
        revision: int = 0,
        *,
        presorted: bool = False,
    ) -> State:
        def by_key(entries: Sequence[Entry[Any]]) -> list[Entry[Any]]:
            return list(entries) if presorted else sorted(entries, key=lambda e: e.key)

        s = cls(
            root=root,
            local_key=local_key,
            is_consistent=is_consistent,
            revision=revision,
            items=by_key(items),
            members=by_key(members),
            assignments=by_key(assignments),
        )
        _drain(s._extract())
        return s

    @classmethod
    def from_keyspace(
        cls, ks: KeySpace, local_key: str, is_consistent: IsConsistentFn,
        replication: Callable[[object], int] = desired_replication,
        cache: EntryCache | None = None,
    ) -> State:
        """Extracts a State from the keyspace's current snapshot (specs per `specs`); with a
        `cache` kept across rounds, only entries changed since the last round are decoded."""
        return _drain(cls._from_keyspace(ks, local_key, is_consistent, replication, cache))

    @classmethod
    async def from_keyspace_yielding(
        cls, ks: KeySpace, local_key: str, is_consistent: IsConsistentFn,
        replication: Callable[[object], int] = desired_replication,
        cache: EntryCache | None = None,
    ) -> State:
        """`from_keyspace`, of the snapshot current at the call, letting the event loop run
        whenever it has held it for `HOLD_AT_MOST` seconds."""
        return await _drain_yielding(cls._from_keyspace(ks, local_key, is_consistent,
                                                        replication, cache))

    @classmethod
    def _from_keyspace(
        cls, ks: KeySpace, local_key: str, is_consistent: IsConsistentFn,
        replication: Callable[[object], int], cache: EntryCache | None,
    ) -> Steps[State]:
        root, revision = ks.root, ks.revision
        # The three lists are read now, before any pause: they are one snapshot.
        groups: list[tuple[Sequence[KeyValue], Callable[[KeyValue], Entry[Any]]]] = [
            (ks.prefixed(items_prefix(root)), lambda kv: item_entry(root, kv, replication)),
            (ks.prefixed(members_prefix(root)), lambda kv: member_entry(root, kv)),
            (ks.prefixed(assignments_prefix(root)), lambda kv: assignment_entry(root, kv)),
        ]
        items, members, assignments = yield from (cache or EntryCache()).extract_steps(groups)
        # A keyspace range is in key order: no sorting needed.
        s = cls(root=root, local_key=local_key, is_consistent=is_consistent, revision=revision,
                items=items, members=members, assignments=assignments)
        yield from s._extract()
        return s

    def _extract(self) -> Steps[None]:
        self.member_keys = [m.key for m in self.members]
        self.item_names = [i.decoded.name for i in self.items]
        n = len(self.members)
        self.member_total = [0] * n
        self.member_primary = [0] * n
        self.shed = [0] * n
        self.local_index = self.find_member(self.local_key)

        by_item: dict[str, list[Entry[Assignment]]] = {}
        for count, a in enumerate(self.assignments, 1):
            by_item.setdefault(a.decoded.item, []).append(a)
            if count % YIELD_EVERY == 0:
                yield
        self.assignments_of = by_item

        max_replication = 0
        # (zone, suffix) -> (member key, member index or -1): members_key validates, so it runs
        # once per member rather than once per assignment.
        member_of: dict[tuple[str, str], tuple[str, int]] = {}
        local_key, member_total, member_primary = self.local_key, self.member_total, self.member_primary
        for count, it in enumerate(self.items, 1):
            r = it.decoded.replication
            self.item_slots += r
            max_replication = max(max_replication, r)
            asn = by_item.get(it.decoded.name)
            if asn:
                for index, a in enumerate(asn):
                    d = a.decoded
                    pair = (d.zone, d.suffix)
                    found = member_of.get(pair)
                    if found is None:
                        key = members_key(self.root, *pair)
                        found = member_of[pair] = (key, self.find_member(key))
                    key, ind = found
                    if key == local_key:
                        self.local_items.append(LocalItem(it, asn, index))
                    if ind >= 0:
                        member_total[ind] += 1
                        if d.slot == 0:
                            member_primary[ind] += 1
            if count % YIELD_EVERY == 0:
                yield

        self.member_slots = sum(max(0, m.decoded.limit) for m in self.members)

        # Grant shed capacity to exiting members, oldest first, from the cluster's excess.
        excess = max(0, self.member_slots - self.item_slots)
        exiting = sorted(
            (i for i, m in enumerate(self.members) if m.decoded.exiting),
            key=lambda i: (self.members[i].create_revision, self.members[i].key),
        )
        max_shedding = max(0, n - max_replication)
        for count, i in enumerate(exiting):
            if count == max_shedding or excess == 0:
                break
            shed = min(max(0, self.members[i].decoded.limit), excess)
            self.shed[i] = shed
            self.member_slots -= shed
            excess -= shed

        zone_slots: dict[str, int] = {}
        for i, m in enumerate(self.members):
            if (limit := self.effective_limit(i)) > 0:
                zone_slots[m.decoded.zone] = zone_slots.get(m.decoded.zone, 0) + limit
        self.zones = sorted(zone_slots)
        self.zone_slots = [zone_slots[z] for z in self.zones]

        self.network_key = (
            tuple((m.key, self.effective_limit(i)) for i, m in enumerate(self.members)),
            tuple((it.key, it.decoded.replication) for it in self.items),
        )

    def find_member(self, key: str) -> int:
        """Index of the member with `key` in `members`, or -1."""
        i = bisect.bisect_left(self.member_keys, key)
        return i if i < len(self.member_keys) and self.member_keys[i] == key else -1

    def find_item(self, name: str) -> int:
        """Index of the item named `name` in `items`, or -1."""
        i = bisect.bisect_left(self.item_names, name)
        return i if i < len(self.item_names) and self.item_names[i] == name else -1

    def member_of(self, a: Assignment) -> int:
        """Index of the member holding assignment `a`, or -1 if that member is gone."""
        return self.find_member(members_key(self.root, a.zone, a.suffix))

    def effective_limit(self, i: int) -> int:
        return max(0, self.members[i].decoded.limit - self.shed[i])

    @property
    def local_member(self) -> Entry[Member] | None:
        return self.members[self.local_index] if self.local_index >= 0 else None

    @property
    def leader_key(self) -> str | None:
        """Key of the member with the lowest (create revision, key), or None if none."""
        if not self.members:
            return None
        return min(self.members, key=lambda m: (m.create_revision, m.key)).key

    @property
    def is_leader(self) -> bool:
        return self.leader_key == self.local_key

    @property
    def should_exit(self) -> bool:
        """True once the local member is exiting and holds no assignments."""
        m = self.local_member
        return m is not None and m.decoded.exiting and not self.local_items

    def load_ratio(self, a: Assignment, counts: Sequence[int]) -> float:
        """counts[member] / effective limit of the member holding `a` (inf if none)."""
        i = self.member_of(a)
        if i < 0:
            return float("inf")
        limit = self.effective_limit(i)
        return counts[i] / limit if limit > 0 else float("inf")


def leader_view(ks: KeySpace, local_key: str) -> tuple[Entry[Member] | None, bool]:
    """(local member entry or None, whether it leads), reading only the member keys."""
    root = ks.root
    members = [member_entry(root, kv) for kv in ks.prefixed(members_prefix(root))]
    local = next((m for m in members if m.key == local_key), None)
    if local is None:
        return None, False
    leader = min(members, key=lambda m: (m.create_revision, m.key))
    return local, leader.key == local_key

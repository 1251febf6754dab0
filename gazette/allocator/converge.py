"""One convergence round: the allowed steps from the current assignments towards the desired.

For every item the round computes assignments to add, remove and keep, then constrains them:

* Removals: an item keeps at least `replication` consistent replicas. Candidates are taken
  in decreasing member load ratio; a consistent one is removed only while more than
  `replication` consistent replicas remain, an inconsistent one only while at least that
  many do. So an inconsistent item (fewer consistent replicas than desired) loses nothing:
  replacements are added first, and the old replica goes once the new one reports itself
  consistent.
* Primary: if no kept assignment holds slot 0, one is promoted, preferring a consistent
  replica, then the member with the lowest primary load ratio.
* Additions: never beyond a member's effective limit, counting the assignments it still
  holds (so a full member first sheds, then takes). An item with no assignments gets its
  primary (slot 0) on the added member with the lowest primary load ratio, as a promotion
  does: the solver's order would give every new item's primary to the same member (at
  40,000 journals, two thirds of the primaries and their pulses and route writes went to
  one of three brokers, and none to the only broker of the other zone).
* New items: at most `NEW_ITEMS_PER_ROUND` items without assignments get theirs in one
  round; the rest wait for the next. A large apply assigned at once starts every replica,
  refresh and pulse of tens of thousands of journals on each broker within seconds; in waves,
  each broker's transient objects of one wave are freed before the next, instead of
  interleaving in its heap with the replicas that outlive them.
* Packing: when nothing is added or removed, one replica per round moves to the lowest free
  slot, keeping slots contiguous.

Every write is revision-checked: removals compare the item's and the assignment's mod
revisions (the item's replication may have grown); additions compare the member's (its limit
may have shrunk) and are written under the member's lease; moves compare the moved key.
Assignments of items which no longer exist are removed after checking the item is absent.
The ops of one item form one checkpoint: they are applied in a single etcd transaction.
A round yields to the event loop once it has held it for `state.HOLD_AT_MOST` seconds
(checked every `CHECK_EVERY` items), so that tens of thousands of items never hold the loop
for long in one go.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gazette.allocator.keys import assignment_key, items_key
from gazette.etcd.txn import Cmp, Delete, Op, Put

from . import state as state_module
from .model import Assignment, Entry, Item
from .solver import Desired
from .state import State

CHECK_EVERY = 100  # items between checks of how long the round has held the loop
NEW_ITEMS_PER_ROUND = 10000  # items first assigned by one round (see the module docstring)


class CheckpointTxn(Protocol):
    """Collects comparisons and ops; a checkpoint's ops are applied together or not at all."""

    def when(self, *cmps: Cmp) -> None: ...
    def then(self, *ops: Op) -> None: ...
    async def checkpoint(self) -> None: ...


def mod_unchanged(e: Entry[Any]) -> Cmp:
    return Cmp(e.key, "mod", e.mod_revision)


@dataclass(slots=True)
class Counters:
    """Ops queued by a round, by kind."""

    added: int = 0
    removed: int = 0
    promoted: int = 0
    packed: int = 0
    deferred: int = 0  # new items left to later rounds (`NEW_ITEMS_PER_ROUND`)


async def converge(txn: CheckpointTxn, state: State, desired: Sequence[Desired],
                   new_items: int = NEW_ITEMS_PER_ROUND) -> Counters:
    """Queues one round of allowed changes into `txn`, first assigning at most `new_items`
    items. Mutates `state`'s member counts."""
    counters = Counters()
    by_item: dict[str, list[Desired]] = {}
    for d in desired:
        by_item.setdefault(d.item, []).append(d)

    held_since = time.perf_counter()
    for n, it in enumerate(state.items, 1):
        name = it.decoded.name
        current = state.assignments_of.get(name, [])
        if not current and name in by_item:
            if new_items <= 0:
                counters.deferred += 1  # assigned by a later round
                continue
            new_items -= 1
        plan = _ItemPlan(state, it, current, by_item.get(name, []))
        plan.constrain()
        plan.build(txn, counters)
        await txn.checkpoint()
        if n % CHECK_EVERY == 0 and time.perf_counter() - held_since >= state_module.HOLD_AT_MOST:
            await asyncio.sleep(0)
            held_since = time.perf_counter()

    # Assignments of vanished items: remove, after checking the item is still absent.
    for name, asn in state.assignments_of.items():
        if state.find_item(name) >= 0:
            continue
        txn.when(Cmp(items_key(state.root, name), "create", 0))
        for a in asn:
            txn.when(mod_unchanged(a))
            txn.then(Delete(a.key))
            counters.removed += 1
        await txn.checkpoint()
    return counters


class _ItemPlan:
    """Add / remove / keep decisions for one item (see the module docstring)."""

    def __init__(
        self,
        state: State,
        item: Entry[Item],
        current: list[Entry[Assignment]],
        desired: list[Desired],
    ) -> None:
        self.state = state
        self.item = item
        self.current = current
        want = {(d.zone, d.suffix) for d in desired}
        have = {a.decoded.member for a in current}
        self.remove = [a for a in current if a.decoded.member not in want]
        self.keep = [a for a in current if a.decoded.member in want]
        next_slot = max((a.decoded.slot + 1 for a in current), default=0)
        self.add: list[Assignment] = []
        for d in desired:
            if (d.zone, d.suffix) not in have:
                self.add.append(Assignment(d.item, d.zone, d.suffix, next_slot))
                next_slot += 1

    def constrain(self) -> None:
        self._constrain_removals()
        self._constrain_primary()
        self._constrain_adds()

    def _consistent(self, a: Entry[Assignment]) -> bool:
        return self.state.is_consistent(self.item, a, self.current)

    def _constrain_removals(self) -> None:
        if not self.remove:
            return  # nothing to constrain: skip the consistency checks (most items, most rounds)
        s = self.state
        self.remove.sort(key=lambda a: s.load_ratio(a.decoded, s.member_total), reverse=True)
        replication = self.item.decoded.replication
        n = sum(1 for a in self.current if self._consistent(a))
        limit = 0
        while n >= replication and limit < len(self.remove):
            c = self._consistent(self.remove[limit])
            if c and n == replication:
                break  # Removing it would leave too few consistent replicas.
            if c:
                n -= 1
            limit += 1
        self.keep.extend(self.remove[limit:])
        del self.remove[limit:]

    def _constrain_primary(self) -> None:
        s = self.state
        self.keep.sort(key=lambda a: a.decoded.slot)
        if not self.keep or self.keep[0].decoded.slot == 0:
            return
        # No current primary: prefer a consistent replica, then the lowest primary load ratio.
        best = min(
            range(len(self.keep)),
            key=lambda i: (
                not self._consistent(self.keep[i]),
                s.load_ratio(self.keep[i].decoded, s.member_primary),
                i,
            ),
        )
        self.keep.insert(0, self.keep.pop(best))

    def _constrain_adds(self) -> None:
        s = self.state
        kept = []
        for a in self.add:
            i = s.member_of(a)
            assert i >= 0, f"desired assignment names an unknown member {a.zone}#{a.suffix}"
            if s.member_total[i] < s.effective_limit(i):
                kept.append(a)
        if not self.current and len(kept) > 1:
            first = min(range(len(kept)), key=lambda i: (s.load_ratio(kept[i], s.member_primary), i))
            kept.insert(0, kept.pop(first))
            kept = [dataclasses.replace(a, slot=slot) for slot, a in enumerate(kept)]
        self.add = kept

    def build(self, txn: CheckpointTxn, counters: Counters) -> None:
        s = self.state
        for a in self.add:
            i = s.member_of(a)
            member = s.members[i]
            txn.when(mod_unchanged(member))
            txn.then(Put(assignment_key(s.root, a.item, a.zone, a.suffix, a.slot), b"",
                         member.lease))
            s.member_total[i] += 1
            if a.slot == 0:
                s.member_primary[i] += 1
            counters.added += 1

        for n, r in enumerate(self.remove):
            if n == 0:
                txn.when(mod_unchanged(self.item))
            txn.when(mod_unchanged(r))
            txn.then(Delete(r.key))
            i = s.member_of(r.decoded)
            if i >= 0:  # A member may be gone while its assignments linger.
                s.member_total[i] -= 1
                if r.decoded.slot == 0:
                    s.member_primary[i] -= 1
            counters.removed += 1

        if self.keep and self.keep[0].decoded.slot != 0:
            self._move(txn, self.keep[0], 0)
            i = s.member_of(self.keep[0].decoded)
            if i >= 0:
                s.member_primary[i] += 1
            counters.promoted += 1

        if not self.add and not self.remove:
            for slot, kept in enumerate(self.keep):
                if slot > 0 and kept.decoded.slot != slot:
                    self._move(txn, kept, slot)
                    counters.packed += 1
                    break

    def _move(self, txn: CheckpointTxn, cur: Entry[Assignment], slot: int) -> None:
        """Atomically re-keys `cur` to `slot`, keeping its value and lease."""
        a = cur.decoded
        txn.when(mod_unchanged(cur))
        txn.then(
            Delete(cur.key),
            Put(assignment_key(self.state.root, a.item, a.zone, a.suffix, slot), cur.raw,
                cur.lease),
        )

"""Builders of allocator `State`s from plain tuples, for tests of the allocator and its users."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.allocator.model import Assignment, Entry, Item, Member
from gazette.allocator.solver import Desired
from gazette.allocator.state import IsConsistentFn, State

ROOT = "/root"

MemberTuple = tuple[str, str, int] | tuple[str, str, int, bool]


def always_consistent(*_: object) -> bool:
    return True


def build_state(
    items: Iterable[tuple[str, int]],
    members: Sequence[MemberTuple],
    assignments: Iterable[tuple[str, str, str, int] | tuple[str, str, str, int, object]] = (),
    *,
    local: int = 0,
    consistent: IsConsistentFn = always_consistent,
) -> State:
    """Members get create revisions in list order (the first is the leader)."""
    item_entries = [Entry(items_key(ROOT, n), Item(n, r), mod_revision=1) for n, r in items]
    member_entries = []
    for i, m in enumerate(members):
        zone, suffix, limit = m[0], m[1], m[2]
        exiting = bool(m[3]) if len(m) > 3 else False
        member_entries.append(
            Entry(
                members_key(ROOT, zone, suffix),
                Member(zone, suffix, limit, exiting),
                create_revision=10 + i,
                mod_revision=10 + i,
                lease=1000 + i,
            )
        )
    asn_entries = []
    for a in assignments:
        item, zone, suffix, slot = a[0], a[1], a[2], a[3]
        value = a[4] if len(a) > 4 else None
        asn_entries.append(
            Entry(
                assignment_key(ROOT, item, zone, suffix, slot),
                Assignment(item, zone, suffix, slot, value),
                raw=b"v" if value else b"",
                mod_revision=100,
                lease=1000,
            )
        )
    local_key = member_entries[local].key if member_entries else members_key(ROOT, "z", "none")
    return State.build(ROOT, local_key, consistent, item_entries, member_entries, asn_entries)


def as_current(desired: Sequence[Desired]) -> list[tuple[str, str, str, int]]:
    """Desired assignments as current ones (slots in member order; slot 0 first)."""
    out = []
    slot: dict[str, int] = {}
    for d in desired:
        s = slot.get(d.item, 0)
        slot[d.item] = s + 1
        out.append((d.item, d.zone, d.suffix, s))
    return out


def with_current(state: State, desired: Sequence[Desired]) -> State:
    """`state` with its assignments replaced by `desired` (as in `as_current`)."""
    assignments = [
        Entry(
            assignment_key(state.root, item, zone, suffix, slot),
            Assignment(item, zone, suffix, slot),
            mod_revision=100,
            lease=1000,
        )
        for item, zone, suffix, slot in as_current(desired)
    ]
    return State.build(
        state.root, state.local_key, state.is_consistent, state.items, state.members, assignments
    )

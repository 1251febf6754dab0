"""Solve for the desired assignment of items to members (pure and deterministic).

The problem is a min-cost maximum flow over the network

    source -> item -> (item, zone) -> member -> sink

with these capacities:

* source -> item: the item's desired replication, bounded by the number of members able
  to take it (an item is never assigned twice to one member: (item, zone) -> member is 1).
* member -> sink: the member's effective limit (`State.effective_limit`), never exceeded.

Among maximum flows, costs rank solutions lexicographically, most important first:

1. ZONE: with two or more zones, a zone may hold at most max(R - 1, 1) of an item's R
   replicas, so any item with R >= 2 spans two zones. A replica beyond that is possible but
   costs ZONE: an item collapses into one zone only when it could not otherwise be fully
   replicated.
2. OVERLOAD: a member taking more than its scaled fair share, ceil(limit * item_slots /
   member_slots), pays OVERLOAD per extra item, so load spreads in proportion to limits
   before any member runs towards its full limit.
3. MOVE: every assignment which is not current costs MOVE, so among balanced solutions the
   one keeping the most current assignments wins (minimal moves).
4. NICETY: small preferences that never justify a move: filling a member to floor(share)
   before ceil(share), and an even spread of an item's replicas across zones.

Weights are powers of K, with K larger than twice the total flow, so no number of cheaper
units outweighs one dearer unit. Items are solved in chunks of `ITEMS_PER_NETWORK` (as
Gazette does) so the cost stays linear in the number of items; each chunk sees the member
capacity left by earlier chunks.

`Problem` is everything the network needs from a `State`, as plain picklable data, so that a
large solve can run in another process (`solve_process`). This module therefore imports
nothing beyond the standard library and `_flow` at run time: the worker loads only those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._flow import FlowNetwork

if TYPE_CHECKING:
    from .state import State

ITEMS_PER_NETWORK = 5000


@dataclass(frozen=True, slots=True, order=True)
class Desired:
    """One desired assignment: `item` on member (`zone`, `suffix`)."""

    item: str
    zone: str
    suffix: str


@dataclass(frozen=True, slots=True)
class Problem:
    """The solver's input: items and members by index, in `State` order.

    `members[j]` is (zone, suffix, effective limit); `current[i]` the indices of the members
    currently holding item i (members that are gone are left out); `item_slots` and
    `member_slots` are the State's totals, which fair shares are computed from."""

    names: list[str]
    replication: list[int]
    members: list[tuple[str, str, int]]
    current: list[tuple[int, ...]]
    item_slots: int
    member_slots: int

    def __reduce__(self) -> tuple[type[Problem], tuple[object, ...]]:
        # Pickled by its fields: compiled (mypyc), a frozen dataclass is unpickled through
        # setattr, which its frozenness refuses.
        return (Problem, (self.names, self.replication, self.members, self.current,
                          self.item_slots, self.member_slots))

    @classmethod
    def of(cls, state: State) -> Problem:
        index = {(m.decoded.zone, m.decoded.suffix): j for j, m in enumerate(state.members)}
        current: list[tuple[int, ...]] = []
        none: tuple[int, ...] = ()
        for it in state.items:
            asn = state.assignments_of.get(it.decoded.name)
            if not asn:
                current.append(none)
                continue
            found = (index.get((a.decoded.zone, a.decoded.suffix), -1) for a in asn)
            current.append(tuple(j for j in found if j >= 0))
        return cls(
            names=state.item_names,
            replication=[it.decoded.replication for it in state.items],
            members=[(m.decoded.zone, m.decoded.suffix, state.effective_limit(j))
                     for j, m in enumerate(state.members)],
            current=current,
            item_slots=state.item_slots,
            member_slots=state.member_slots,
        )


Solution = list[tuple[int, int]]
"""Desired assignments as (item index, member index) pairs of a `Problem`."""


def solve(state: State) -> list[Desired]:
    """Returns the desired assignments, sorted by (item, zone, suffix)."""
    problem = Problem.of(state)
    return desired_of(problem, solve_problem(problem))


def desired_of(problem: Problem, solution: Solution) -> list[Desired]:
    """The `Desired` assignments of `solution`, sorted by (item, zone, suffix)."""
    names, members = problem.names, problem.members
    out = [Desired(names[i], members[j][0], members[j][1]) for i, j in solution]
    out.sort()
    return out


def solve_problem(problem: Problem) -> Solution:
    """Solves `problem` chunk by chunk (see the module docstring)."""
    out: Solution = []
    used = [0] * len(problem.members)
    n = len(problem.names)
    for begin in range(0, n, ITEMS_PER_NETWORK):
        out.extend(_solve_chunk(problem, begin, min(begin + ITEMS_PER_NETWORK, n), used))
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _solve_chunk(problem: Problem, begin: int, end: int, used: list[int]) -> Solution:
    members = problem.members
    eligible = [j for j in range(len(members)) if members[j][2] - used[j] > 0]
    zones = sorted({members[j][0] for j in eligible})
    nz, n = len(zones), end - begin
    zone_index = {z: k for k, z in enumerate(zones)}
    members_in_zone: list[list[int]] = [[] for _ in zones]
    for j in eligible:
        members_in_zone[zone_index[members[j][0]]].append(j)

    replication = [min(r, len(eligible)) for r in problem.replication[begin:end]]
    total = sum(replication)
    if total == 0:
        return []
    k = 2 * total + 2
    nicety, move, overload, zone_cost = 1, k, k * k, k * k * k

    source, sink = 0, 1
    first_zone_item = 2 + n
    first_member = first_zone_item + n * nz
    net = FlowNetwork(first_member + len(members))

    # Fair shares are global (all items, all members), scaled to this chunk's share of slots.
    item_slots, member_slots = problem.item_slots, problem.member_slots
    chunk_slots = sum(problem.replication[begin:end])
    for j in eligible:
        limit = members[j][2]
        cap = limit - used[j]
        share_num = limit * min(item_slots, member_slots)
        share_den = max(1, member_slots)
        if item_slots > 0 and chunk_slots < item_slots:
            share_num *= chunk_slots
            share_den *= item_slots
        floor_share = min(cap, share_num // share_den)
        ceil_share = min(cap, _ceil_div(share_num, share_den))
        node = first_member + j
        net.add_arc(node, sink, floor_share, 0)
        if ceil_share > floor_share:
            net.add_arc(node, sink, ceil_share - floor_share, nicety)
        if cap > ceil_share:
            net.add_arc(node, sink, cap - ceil_share, overload)

    member_arcs: list[tuple[int, int, int]] = []  # (arc, item index, member index)
    for i in range(n):
        r = replication[i]
        if r == 0:
            continue
        net.add_arc(source, 2 + i, r, 0)
        current = problem.current[begin + i]
        within = max(r - 1, 1)
        uniform = min(within, _ceil_div(r, nz))
        for z in range(nz):
            zi = first_zone_item + i * nz + z
            if nz == 1 or r == 1:
                net.add_arc(2 + i, zi, r, 0)
            else:
                net.add_arc(2 + i, zi, uniform, 0)
                if within > uniform:
                    net.add_arc(2 + i, zi, within - uniform, nicety)
                net.add_arc(2 + i, zi, r - within, zone_cost)
            # Current members first: cheaper arcs found first keep the search short.
            in_zone = members_in_zone[z]
            if current:
                ordered = [j for j in in_zone if j in current]
                ordered += [j for j in in_zone if j not in current]
            else:
                ordered = in_zone
            for j in ordered:
                arc = net.add_arc(zi, first_member + j, 1, 0 if j in current else move)
                member_arcs.append((arc, begin + i, j))

    net.solve(source, sink)

    out: Solution = []
    for arc, i, j in member_arcs:
        if net.flow(arc):
            used[j] += 1
            out.append((i, j))
    return out

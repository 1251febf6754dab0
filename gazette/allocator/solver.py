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
"""

from __future__ import annotations

from dataclasses import dataclass

from ._flow import FlowNetwork
from .state import State

ITEMS_PER_NETWORK = 5000


@dataclass(frozen=True, slots=True, order=True)
class Desired:
    """One desired assignment: `item` on member (`zone`, `suffix`)."""

    item: str
    zone: str
    suffix: str


def solve(state: State) -> list[Desired]:
    """Returns the desired assignments, sorted by (item, zone, suffix)."""
    out: list[Desired] = []
    used = [0] * len(state.members)
    for begin in range(0, len(state.items), ITEMS_PER_NETWORK):
        out.extend(_solve_chunk(state, begin, min(begin + ITEMS_PER_NETWORK, len(state.items)),
                                used))
    out.sort()
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _solve_chunk(state: State, begin: int, end: int, used: list[int]) -> list[Desired]:
    items = state.items[begin:end]
    members = state.members
    eligible = [j for j in range(len(members)) if state.effective_limit(j) - used[j] > 0]
    zones = sorted({members[j].decoded.zone for j in eligible})
    nz, n = len(zones), len(items)
    zone_index = {z: k for k, z in enumerate(zones)}
    members_in_zone: list[list[int]] = [[] for _ in zones]
    for j in eligible:
        members_in_zone[zone_index[members[j].decoded.zone]].append(j)

    replication = [min(it.decoded.replication, len(eligible)) for it in items]
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
    chunk_slots = sum(it.decoded.replication for it in items)
    for j in eligible:
        cap = state.effective_limit(j) - used[j]
        share_num = state.effective_limit(j) * min(state.item_slots, state.member_slots)
        share_den = max(1, state.member_slots)
        if state.item_slots > 0 and chunk_slots < state.item_slots:
            share_num *= chunk_slots
            share_den *= state.item_slots
        floor_share = min(cap, share_num // share_den)
        ceil_share = min(cap, _ceil_div(share_num, share_den))
        node = first_member + j
        net.add_arc(node, sink, floor_share, 0)
        if ceil_share > floor_share:
            net.add_arc(node, sink, ceil_share - floor_share, nicety)
        if cap > ceil_share:
            net.add_arc(node, sink, cap - ceil_share, overload)

    member_arcs: list[tuple[int, int, int]] = []  # (arc, item index, member index)
    for i, it in enumerate(items):
        r = replication[i]
        if r == 0:
            continue
        net.add_arc(source, 2 + i, r, 0)
        current = {
            (a.decoded.zone, a.decoded.suffix)
            for a in state.assignments_of.get(it.decoded.name, ())
        }
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
            ordered = sorted(
                members_in_zone[z],
                key=lambda j: (members[j].decoded.zone, members[j].decoded.suffix) not in current,
            )
            for j in ordered:
                is_current = (members[j].decoded.zone, members[j].decoded.suffix) in current
                arc = net.add_arc(zi, first_member + j, 1, 0 if is_current else move)
                member_arcs.append((arc, i, j))

    net.solve(source, sink)

    out: list[Desired] = []
    for arc, i, j in member_arcs:
        if net.flow(arc):
            used[j] += 1
            m = members[j].decoded
            out.append(Desired(items[i].decoded.name, m.zone, m.suffix))
    return out

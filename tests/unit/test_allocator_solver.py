"""Properties of the allocator's solver: feasibility, zones, limits, balance, minimal moves."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazette.allocator.solver import Desired, solve
from gazette.allocator.state import State
from gazette.allocator.testing import MemberTuple, as_current, build_state, with_current

ZONES = ["zone-a", "zone-b", "zone-c"]


@st.composite
def scenarios(
    draw: st.DrawFn,
    max_items: int = 12,
    max_members: int = 6,
    max_limit: int = 12,
    max_replication: int = 3,
    zones: Sequence[str] = ZONES,
    exiting: bool = True,
) -> State:
    n_members = draw(st.integers(1, max_members))
    members = []
    for i in range(n_members):
        members.append(
            (
                draw(st.sampled_from(zones)),
                f"m{i}",
                draw(st.integers(0, max_limit)),
                draw(st.booleans()) if exiting else False,
            )
        )
    items = [
        (f"item-{i:02d}", draw(st.integers(0, max_replication)))
        for i in range(draw(st.integers(0, max_items)))
    ]
    pairs = [(it, m) for it, _ in items for m in members]
    current = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    assignments = []
    slots: Counter[str] = Counter()
    for item, (zone, suffix, _limit, _exiting) in current:
        assignments.append((item, zone, suffix, slots[item]))
        slots[item] += 1
    return build_state(items, members, assignments)


def loads(state: State, desired: Sequence[Desired]) -> list[int]:
    index = {(m.decoded.zone, m.decoded.suffix): i for i, m in enumerate(state.members)}
    out = [0] * len(state.members)
    for d in desired:
        out[index[(d.zone, d.suffix)]] += 1
    return out


def eligible(state: State) -> list[int]:
    return [j for j in range(len(state.members)) if state.effective_limit(j) > 0]


def reference_max_flow(state: State) -> int:
    """Max number of (item, member) pairs under replication and member limits, ignoring zones:
    Edmonds-Karp on source -> item -> member -> sink."""
    n_items, members = len(state.items), eligible(state)
    source, sink = 0, 1
    node = {("i", i): 2 + i for i in range(n_items)}
    node.update({("m", j): 2 + n_items + k for k, j in enumerate(members)})
    cap: dict[tuple[int, int], int] = {}
    adj: dict[int, list[int]] = {}

    def arc(u: int, v: int, c: int) -> None:
        cap[(u, v)] = cap.get((u, v), 0) + c
        cap.setdefault((v, u), 0)
        adj.setdefault(u, []).append(v)
        adj.setdefault(v, []).append(u)

    for i, it in enumerate(state.items):
        arc(source, node[("i", i)], it.decoded.replication)
        for j in members:
            arc(node[("i", i)], node[("m", j)], 1)
    for j in members:
        arc(node[("m", j)], sink, state.effective_limit(j))
    flow = 0
    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v in adj.get(u, []):
                if v not in parent and cap[(u, v)] > 0:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return flow
        v = sink
        while v != source:
            u = parent[v]
            cap[(u, v)] -= 1
            cap[(v, u)] += 1
            v = u
        flow += 1


def fair_share(state: State, j: int) -> int:
    limit = state.effective_limit(j)
    num = limit * min(state.item_slots, state.member_slots)
    return min(limit, -(-num // max(1, state.member_slots)))


def objective(state: State, desired: Sequence[Desired]) -> tuple[int, int, int, int]:
    """(-assigned, zone overflows, load above fair share, moves): the solver's priorities."""
    members = eligible(state)
    zones = {state.members[j].decoded.zone for j in members}
    zone_over = 0
    by_item: dict[str, Counter[str]] = {}
    for d in desired:
        by_item.setdefault(d.item, Counter())[d.zone] += 1
    for it in state.items:
        r = min(it.decoded.replication, len(members))
        if len(zones) >= 2 and r >= 2:
            within = r - 1
            zone_over += sum(max(0, c - within) for c in by_item.get(it.decoded.name, {}).values())
    load = loads(state, desired)
    over = sum(max(0, load[j] - fair_share(state, j)) for j in range(len(state.members)))
    current = {(a.decoded.item, a.decoded.zone, a.decoded.suffix) for a in state.assignments}
    moves = sum(1 for d in desired if (d.item, d.zone, d.suffix) not in current)
    return (-len(desired), zone_over, over, moves)


def check_valid(state: State, desired: Sequence[Desired]) -> None:
    assert list(desired) == sorted(set(desired)), "sorted, without duplicates"
    names = {it.decoded.name: it.decoded.replication for it in state.items}
    per_item = Counter(d.item for d in desired)
    for name, count in per_item.items():
        assert count <= names[name], f"{name} over-replicated"
    for j, load in enumerate(loads(state, desired)):
        assert load <= state.effective_limit(j), f"member {j} over its limit"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_limits_replication_and_maximality(state: State) -> None:
    desired = solve(state)
    check_valid(state, desired)
    # Every item gets its replicas whenever member limits allow it: as many assignments as
    # a zone-agnostic maximum flow finds (the zone rule never costs a replica).
    assert len(desired) == reference_max_flow(state)


@settings(max_examples=200, deadline=None)
@given(scenarios(exiting=False), st.integers(2, 3))
def test_replicas_span_zones(state: State, n_zones: int) -> None:
    # With limits large enough that any member may take every item, every item with two or
    # more replicas spans at least two zones whenever two zones have members.
    big = [
        (m.decoded.zone, m.decoded.suffix, len(state.items) + 1) for m in state.members
    ]
    state = build_state(
        [(it.decoded.name, it.decoded.replication) for it in state.items], big
    )
    desired = solve(state)
    check_valid(state, desired)
    zones = {m.decoded.zone for m in state.members}
    zones_of: dict[str, set[str]] = {}
    for d in desired:
        zones_of.setdefault(d.item, set()).add(d.zone)
    for it in state.items:
        r = min(it.decoded.replication, len(state.members))
        assert len([d for d in desired if d.item == it.decoded.name]) == r
        if len(zones) >= 2 and r >= 2:
            assert len(zones_of[it.decoded.name]) >= 2, f"{it.decoded.name} in one zone"


def brute_force_best(state: State) -> tuple[int, int, int, int]:
    members = eligible(state)
    choices = []
    for it in state.items:
        r = min(it.decoded.replication, len(members))
        options = [
            combo for k in range(r + 1) for combo in itertools.combinations(members, k)
        ]
        choices.append(options)
    best = None
    for pick in itertools.product(*choices):
        desired = sorted(
            Desired(it.decoded.name, state.members[j].decoded.zone, state.members[j].decoded.suffix)
            for it, combo in zip(state.items, pick, strict=True)
            for j in combo
        )
        if any(
            load > state.effective_limit(j) for j, load in enumerate(loads(state, desired))
        ):
            continue
        score = objective(state, desired)
        if best is None or score < best:
            best = score
    assert best is not None
    return best


@settings(max_examples=150, deadline=None)
@given(scenarios(max_items=3, max_members=4, max_limit=3, max_replication=2))
def test_optimal_against_brute_force(state: State) -> None:
    # Lexicographically: most replicas, then fewest zone overflows, then least load above
    # fair share, then fewest moves. Matching brute force makes "minimal moves" exact.
    desired = solve(state)
    check_valid(state, desired)
    assert objective(state, desired) == brute_force_best(state)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_deterministic_and_stable(state: State) -> None:
    first = solve(state)
    assert solve(state) == first
    # Re-solving with the solution as the current assignments changes nothing.
    assert solve(with_current(state, first)) == first


@st.composite
def balanced_single_replica(draw: st.DrawFn) -> tuple[list[tuple[str, int]], list[tuple[str, str, int]]]:
    n_members = draw(st.integers(2, 6))
    members = [(draw(st.sampled_from(ZONES)), f"m{i}", draw(st.integers(1, 8)))
               for i in range(n_members)]
    items = [(f"item-{i:02d}", 1) for i in range(draw(st.integers(0, 20)))]
    return items, members


@settings(max_examples=200, deadline=None)
@given(balanced_single_replica(), st.data())
def test_member_leaves_only_its_assignments_move(
    scenario: tuple[list[tuple[str, int]], list[tuple[str, str, int]]], data: st.DataObject
) -> None:
    items, members = scenario
    before = solve(build_state(items, members))
    leaver = data.draw(st.integers(0, len(members) - 1))
    rest = members[:leaver] + members[leaver + 1:]
    after = solve(build_state(items, rest, as_current(before)))
    gone = {(d.zone, d.suffix) for d in before if (d.zone, d.suffix) == members[leaver][:2]}
    kept = [d for d in before if (d.zone, d.suffix) not in gone]
    # Every assignment of a remaining member stays put.
    assert set(kept) <= set(after)
    # Only the leaver's items got new assignments.
    leaver_items = {d.item for d in before if (d.zone, d.suffix) in gone}
    assert {d.item for d in set(after) - set(before)} <= leaver_items


@settings(max_examples=200, deadline=None)
@given(balanced_single_replica(), st.sampled_from(ZONES), st.integers(1, 8))
def test_member_joins_moves_are_minimal(
    scenario: tuple[list[tuple[str, int]], list[tuple[str, str, int]]],
    zone: str,
    limit: int,
) -> None:
    items, members = scenario
    before = solve(build_state(items, members))
    joined = [*members, (zone, "joiner", limit)]
    state = build_state(items, joined, as_current(before))
    after = solve(state)
    added = set(after) - set(before)
    # Only as many assignments move as balance requires (every old member keeps the smaller
    # of its load and its new fair share), and only onto members within their fair share.
    old_loads = loads(state, before)
    new_loads = loads(state, after)
    old = [j for j, m in enumerate(state.members) if m.decoded.suffix != "joiner"]
    for j in old:
        assert new_loads[j] >= min(old_loads[j], fair_share(state, j))
    for d in added:
        j = next(j for j, m in enumerate(state.members) if m.decoded.suffix == d.suffix)
        assert new_loads[j] <= fair_share(state, j)
    removed = set(before) - set(after)
    assert len(removed) == sum(max(0, old_loads[j] - fair_share(state, j)) for j in old)


def test_exiting_member_sheds_when_capacity_allows() -> None:
    items = [(f"item-{i}", 2) for i in range(4)]
    members: list[MemberTuple] = [("a", "m0", 10, True), ("a", "m1", 10), ("b", "m2", 10)]
    state = build_state(items, members)
    assert state.effective_limit(0) == 0
    desired = solve(state)
    assert all(d.suffix != "m0" for d in desired)
    assert len(desired) == 8


def test_exiting_member_keeps_capacity_when_cluster_is_full() -> None:
    # No excess capacity: shedding would lose replicas, so the exiting member keeps its limit.
    items = [(f"item-{i}", 3) for i in range(4)]
    members: list[MemberTuple] = [("a", "m0", 4, True), ("a", "m1", 4), ("b", "m2", 4)]
    state = build_state(items, members)
    assert state.effective_limit(0) == 4
    assert len(solve(state)) == 12


def test_example_three_members_two_zones() -> None:
    items = [("a", 1), ("b", 2), ("c", 3)]
    members = [("z1", "m1", 10), ("z1", "m2", 10), ("z2", "m3", 10)]
    desired = solve(build_state(items, members))
    assert Counter(d.item for d in desired) == {"a": 1, "b": 2, "c": 3}
    for item in ("b", "c"):
        assert {d.zone for d in desired if d.item == item} == {"z1", "z2"}
    assert max(loads(build_state(items, members), desired)) == 2


def test_large_problem_is_fast_enough() -> None:
    import time

    items = [(f"j{i:05d}", 3) for i in range(3000)]
    members = [(z, f"m{k}", 2000) for z in ZONES for k in range(4)]
    state = build_state(items, members)
    start = time.monotonic()
    desired = solve(state)
    assert len(desired) == 9000
    assert time.monotonic() - start < 10.0
    assert set(loads(state, desired)) == {750}

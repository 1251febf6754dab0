"""The broker's HealthTicker: one timer ticking every primary replica once per jittered
interval; a discarded replica is never ticked again (a property test over random schedules)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.broker.health import HealthTicker


class R:
    def __init__(self, name: int) -> None:
        self.name = name
        self.ticks = 0

    def health_tick(self) -> None:
        self.ticks += 1


def test_ticks_each_registered_replica_once_per_interval_in_due_order() -> None:
    now = [0.0]
    draws = iter([0.0, 1.0, 0.5] + [0.5] * 100)  # first dues: 0.75, 1.25, 1.0 intervals
    t = HealthTicker(10.0, clock=lambda: now[0], rand=lambda: next(draws))
    a, b, c = R(1), R(2), R(3)
    for r in (a, b, c):
        t.add(r)
    assert t.due(7.4) == []
    assert t.due(12.5) == [a, c, b]  # due at 7.5, 10, 12.5
    # The next ticks are an interval after the pass that ticked them (run() passes every second).
    assert t.due(22.4) == [] and t.due(22.5) == [a, b, c]
    assert t.granularity == 1.0 and HealthTicker(0.4).granularity == 0.05


def test_discard_takes_effect_at_once_and_re_adding_starts_over() -> None:
    now = [0.0]
    t = HealthTicker(1.0, clock=lambda: now[0], rand=lambda: 0.5)
    a = R(1)
    t.add(a)
    t.discard(a)
    now[0] = 5.0
    assert t.tick() == 0 and a.ticks == 0 and len(t) == 0
    t.add(a)  # due at 6.0; the stale entry of the first registration is skipped
    t.add(a)  # again: still one registration, due at 6.0
    now[0] = 6.0
    assert t.tick() == 1 and a.ticks == 1


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        HealthTicker(0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "discard", "advance"]), st.integers(0, 7),
                          st.floats(0.0, 3.0)), max_size=60),
       st.integers(0, 2**32 - 1))
def test_only_registered_replicas_tick_and_each_about_once_per_interval(
        ops: list[tuple[str, int, float]], seed: int) -> None:
    rng = random.Random(seed)
    now = [0.0]
    t = HealthTicker(1.0, clock=lambda: now[0], rand=rng.random)
    rs = [R(i) for i in range(8)]
    since: dict[int, float] = {}  # registered replica -> when it was (last) registered
    last_tick: dict[int, float] = {}
    for op, i, dt in ops:
        r = rs[i]
        if op == "add":
            t.add(r)
            since[i] = now[0]
            last_tick[i] = now[0]
        elif op == "discard":
            t.discard(r)
            since.pop(i, None)
        else:
            target = now[0] + dt
            while now[0] < target:  # passes every 0.125, as run() would
                now[0] = min(target, now[0] + t.granularity)
                for x in t.due(now[0]):
                    assert isinstance(x, R)
                    assert x.name in since, "a discarded replica was ticked"
                    gap = now[0] - last_tick[x.name]
                    assert 0.75 - 1e-9 <= gap <= 1.25 + t.granularity + 1e-9, gap
                    last_tick[x.name] = now[0]
        assert len(t) == len(since)
    for i in since:  # none overdue by more than one pass
        assert now[0] - last_tick[i] <= 1.25 + t.granularity + 1e-9

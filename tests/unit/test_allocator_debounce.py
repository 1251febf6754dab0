"""The leader's pacing: its re-solve debounce, driven by a fake clock (no sleeps), and the
bound on the catch-up after a round."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.allocator.allocator import ROUND_CATCH_UP_MAX, ROUND_MAX_DUTY, catch_up_limit
from gazette.allocator.debounce import SolveDebounce


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def debounce(quiet: float = 1.0, max_delay: float = 5.0) -> tuple[SolveDebounce, FakeClock]:
    clock = FakeClock()
    return SolveDebounce(quiet, max_delay, clock), clock


def test_first_key_is_due_at_once_and_nothing_is_pending_once_solved() -> None:
    d, _clock = debounce()
    assert d.observe("a") == 0.0
    d.solved("a")
    assert d.observe("a") is None


def test_a_lone_change_after_a_quiet_spell_is_due_at_once() -> None:
    d, clock = debounce()
    d.observe("a")
    d.solved("a")
    clock.now += 1.0  # quiet since the solve
    assert d.observe("b") == 0.0


def test_a_change_soon_after_a_solve_waits_for_quiet() -> None:
    d, clock = debounce(quiet=1.0)
    d.observe("a")
    d.solved("a")
    clock.now += 0.25
    assert d.observe("b") == pytest.approx(1.0)
    clock.now += 0.5
    assert d.observe("b") == pytest.approx(0.5)  # unchanged: the quiet period runs on
    clock.now += 0.5
    assert d.observe("b") == 0.0


def test_each_change_restarts_the_quiet_period() -> None:
    d, clock = debounce(quiet=1.0, max_delay=5.0)
    d.observe("a")
    d.solved("a")
    clock.now += 0.1
    d.observe("b")
    clock.now += 0.9
    assert d.observe("c") == pytest.approx(1.0)
    clock.now += 0.9
    assert d.observe("c") == pytest.approx(0.1)


def test_a_steady_stream_is_solved_every_max_delay() -> None:
    d, clock = debounce(quiet=1.0, max_delay=3.0)
    d.observe("k0")
    d.solved("k0")
    clock.now += 0.5
    waits = []
    for n in range(1, 12):  # a new key every half second, never quiet for 1 s
        waits.append(d.observe(f"k{n}"))
        if waits[-1] == 0.0:
            break
        clock.now += 0.5
    assert waits[-1] == 0.0 and len(waits) == 7  # 3 s after the first unsolved change
    assert all(w is not None and 0 < w <= 1.0 for w in waits[:-1])


def test_urgent_changes_are_due_at_once() -> None:
    d, clock = debounce()
    d.observe("a")
    d.solved("a")
    clock.now += 0.1
    assert d.observe("b") == pytest.approx(1.0)
    assert d.observe("b", urgent=True) == 0.0


def test_going_back_to_the_solved_key_cancels_the_pending_solve() -> None:
    d, clock = debounce()
    d.observe("a")
    d.solved("a")
    clock.now += 0.1
    assert d.observe("b") is not None
    assert d.observe("a") is None
    clock.now += 0.1
    assert d.observe("b") == pytest.approx(1.0)  # a new pending period, not after a quiet spell


def test_a_change_during_a_long_solve_waits_for_quiet_after_it() -> None:
    d, clock = debounce(quiet=1.0, max_delay=5.0)
    assert d.observe("a") == 0.0
    clock.now += 10.0  # the solve of "a" took a while; "b" arrived meanwhile
    d.solved("a")
    assert d.observe("b") == pytest.approx(1.0)


def test_rejects_a_max_delay_below_quiet() -> None:
    with pytest.raises(ValueError):
        SolveDebounce(2.0, 1.0)


def test_a_steady_stream_spends_at_most_max_duty_of_its_time_solving() -> None:
    """A solve that took 4 s stretches a steady stream's pending period to 4 / 0.25 = 16 s
    (not max_delay's 5 s); after a quick solve the stream is solved every max_delay again."""
    clock = FakeClock()
    d = SolveDebounce(1.0, 5.0, clock, max_duty=0.25)

    def stream(first: int) -> int:
        """A change every 0.5 s from key `first` on: the key at which a solve is due."""
        for i in range(first, first + 100):
            clock.now += 0.5
            if d.observe(f"k{i}") == 0.0:
                return i
        raise AssertionError("never due")

    d.observe("k0")
    d.solved("k0", took=4.0)
    assert stream(1) == 33  # pending from k1; due 16 s (32 changes) later
    d.solved("k33", took=0.2)
    assert stream(34) == 44  # pending from k34; due max_delay (10 changes) later


def test_max_duty_must_be_a_share() -> None:
    with pytest.raises(ValueError, match="max_duty"):
        SolveDebounce(1.0, 5.0, FakeClock(), max_duty=0.0)


@given(st.floats(min_value=0.0, max_value=1e4, allow_nan=False))
def test_rounds_take_at_most_their_duty_of_a_moving_keyspace(held: float) -> None:
    """After a round, the leader catches up with its watch for at least ROUND_CATCH_UP_MAX and
    long enough that the round was at most ROUND_MAX_DUTY of the round and its catch-up."""
    limit = catch_up_limit(held)
    assert limit >= ROUND_CATCH_UP_MAX
    assert held <= ROUND_MAX_DUTY * (held + limit) * (1 + 1e-9)
    if held * (1 - ROUND_MAX_DUTY) / ROUND_MAX_DUTY > ROUND_CATCH_UP_MAX:
        assert limit == pytest.approx(held * (1 - ROUND_MAX_DUTY) / ROUND_MAX_DUTY)  # no longer

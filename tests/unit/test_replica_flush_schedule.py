"""When a replica's maintenance wakes: the flush boundary of its spool (Gazette's
flush_interval), computed rather than polled each second."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.replica import seconds_to_flush


def test_no_content_or_no_interval_never_flushes() -> None:
    assert seconds_to_flush(None, 60, 1000.0) is None
    assert seconds_to_flush(1000.0, 0, 1000.0) is None


def test_the_window_ends_at_the_next_aligned_boundary() -> None:
    assert seconds_to_flush(3601.5, 3600, 3602.0) == 3598.0  # the hour that began at 3600 ends at 7200
    assert abs((seconds_to_flush(59.9, 60, 59.95) or 0) - 0.05) < 1e-9
    assert seconds_to_flush(10.0, 60, 75.0) == 0.0  # passed: due now


@given(st.floats(0, 1e9, allow_nan=False), st.integers(1, 86400), st.floats(0, 1e6, allow_nan=False))
def test_due_exactly_when_the_window_changed(first: float, interval: int, later: float) -> None:
    """The wake-up agrees with the check the flush makes (``int(t) // interval`` changed)."""
    now = first + later
    delay = seconds_to_flush(first, interval, now)
    assert delay is not None and delay >= 0
    due = int(first) // interval != int(now) // interval
    assert (delay == 0) == due
    if not due:
        assert int(first) // interval != int(now + delay) // interval  # waking then, it is due

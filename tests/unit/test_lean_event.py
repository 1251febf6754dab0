"""`LeanEvent` behaves as ``asyncio.Event`` does, and its reliance on that class's private
attributes is checked against the running Python."""

from __future__ import annotations

import asyncio
import sys

import pytest

from gazette.lean_event import LeanEvent


def test_asyncio_event_internals_are_what_lean_event_replaces() -> None:
    # LeanEvent.__init__ sets what asyncio.Event.__init__ sets, nothing more, nothing less.
    assert set(vars(asyncio.Event())) == {"_waiters", "_value"} == set(vars(LeanEvent()))
    assert sys.getsizeof(vars(LeanEvent())["_waiters"]) < sys.getsizeof(vars(asyncio.Event())["_waiters"])


@pytest.mark.parametrize("kind", [asyncio.Event, LeanEvent])
async def test_set_wakes_every_waiter_and_clear_resets(kind: type[asyncio.Event]) -> None:
    ev = kind()
    assert not ev.is_set()
    waiters = [asyncio.create_task(ev.wait()) for _ in range(3)]
    await asyncio.sleep(0)  # let them block (a scheduling step, not a timed wait)
    assert not any(w.done() for w in waiters)
    ev.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert ev.is_set() and await ev.wait() is True  # set: returns at once
    ev.clear()
    assert not ev.is_set()
    late = asyncio.create_task(ev.wait())
    await asyncio.sleep(0)
    assert not late.done()
    ev.set()
    assert await late is True
    assert not vars(ev)["_waiters"]  # woken waiters left


@pytest.mark.parametrize("kind", [asyncio.Event, LeanEvent])
async def test_a_cancelled_waiter_leaves_and_the_others_still_wake(kind: type[asyncio.Event]) -> None:
    ev = kind()
    a, b = asyncio.create_task(ev.wait()), asyncio.create_task(ev.wait())
    await asyncio.sleep(0)
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    assert len(vars(ev)["_waiters"]) == 1
    ev.set()
    assert await b is True
    assert not vars(ev)["_waiters"]


async def test_a_timeout_around_wait_cleans_up() -> None:
    ev = LeanEvent()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await ev.wait()
    assert vars(ev)["_waiters"] == []

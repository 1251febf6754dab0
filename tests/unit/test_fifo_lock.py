"""`FifoLock`: one holder, waiters served in arrival order, a free lock taken without a
coroutine, and cancellation (while waiting, or after the hand-off but before running) never
leaving the lock held by nobody. A hypothesis model drives arrivals, releases and both kinds
of cancellation."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.fifo_lock import FifoLock


async def settle() -> None:
    """Lets every runnable task take its steps (scheduling steps, not a timed wait)."""
    for _ in range(4):
        await asyncio.sleep(0)


async def test_try_acquire_takes_a_free_lock_and_refuses_a_held_one() -> None:
    lock = FifoLock()
    assert not lock.locked() and lock.try_acquire() and lock.locked()
    assert not lock.try_acquire()
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()


async def test_async_with_and_a_waiter_behind_the_holder() -> None:
    lock = FifoLock()
    order: list[str] = []

    async def second() -> None:
        async with lock:
            order.append("second")

    async with lock:
        t = asyncio.create_task(second())
        await settle()
        assert not t.done()  # waits behind us
        order.append("first")
    # Handed over at release: held for the waiter until it runs, never free in between.
    assert lock.locked() and not lock.try_acquire()
    await t
    assert order == ["first", "second"] and not lock.locked()


async def test_a_waiter_cancelled_after_the_hand_off_passes_the_lock_on() -> None:
    lock = FifoLock()
    assert lock.try_acquire()
    got: list[int] = []

    async def waiter(i: int) -> None:
        await lock.acquire()
        got.append(i)

    a, b = asyncio.create_task(waiter(1)), asyncio.create_task(waiter(2))
    await settle()
    lock.release()  # handed to a, which has not run yet
    a.cancel()
    await settle()
    assert a.cancelled() and got == [2] and lock.locked()
    lock.release()
    assert not lock.locked()
    await b


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(["arrive", "arrive", "release", "cancel_waiting", "cancel_handed"]),
                max_size=40))
def test_model_one_holder_fifo_and_no_lost_lock(ops: list[str]) -> None:
    asyncio.run(_run_model(ops))


async def _run_model(ops: list[str]) -> None:
    lock = FifoLock()
    granted: list[int] = []  # who acquired, in order (each acquirer records itself)
    expected: list[int] = []
    tasks: dict[int, asyncio.Task[None]] = {}
    holder: int | None = None
    queue: list[int] = []  # the model's waiters, in arrival order

    async def worker(i: int) -> None:
        await lock.acquire()
        granted.append(i)  # releases are made by the test, on the holder's behalf

    def grant_next() -> int | None:
        if not queue:
            return None
        nxt = queue.pop(0)
        expected.append(nxt)
        return nxt

    for i, op in enumerate(ops):
        if op == "arrive":
            tasks[i] = asyncio.create_task(worker(i))
            if holder is None:
                holder = i
                expected.append(i)
            else:
                queue.append(i)
        elif op == "release" and holder is not None:
            lock.release()
            holder = grant_next()
        elif op == "cancel_waiting" and queue:
            tasks[queue.pop(len(queue) // 2)].cancel()
        elif op == "cancel_handed" and holder is not None and queue:
            lock.release()  # handed to the first waiter, which is cancelled before it runs
            tasks[queue.pop(0)].cancel()
            holder = grant_next()
        await settle()
        assert lock.locked() == (holder is not None), (op, holder, queue)
        assert granted == expected, (op, granted, expected)
        probe = lock.try_acquire()  # a free lock is taken at once; a held one never
        assert probe == (holder is None)
        if probe:
            lock.release()
    for t in tasks.values():
        t.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)

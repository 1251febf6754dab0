"""gazette.tasks: owned tasks never outlive their owner; cancellation is never swallowed."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.broker.replica import acquire_unless
from gazette.client.listing import PolledList
from gazette.tasks import Supervisor, cancel_and_wait

# Each task: how many loop turns it runs, then how it ends.
_plans = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["ok", "fail", "hang"])), max_size=8)


async def _run(turns: int, end: str, started: list[int]) -> None:
    started.append(1)
    for _ in range(turns):
        await asyncio.sleep(0)  # a loop turn, the unit of this model's time
    if end == "fail":
        raise ValueError("failed")
    if end == "hang":
        await asyncio.Event().wait()


@settings(max_examples=60, deadline=None)
@given(_plans, st.sampled_from(["log", "fail"]), st.integers(0, 6))
def test_nothing_outlives_aclose(plan: list[tuple[int, str]], policy: str, turns: int) -> None:
    async def main() -> None:
        sup = Supervisor("t", policy)  # type: ignore[arg-type]
        started: list[int] = []
        tasks = [sup.spawn(f"t{i}", _run(n, end, started)) for i, (n, end) in enumerate(plan)]
        for _ in range(turns):
            await asyncio.sleep(0)
        fails = [i for i, (n, end) in enumerate(plan) if end == "fail" and n < turns]
        try:
            await sup.aclose()
        except ValueError:
            assert policy == "fail" and any(end == "fail" for _, end in plan)
        else:
            assert policy == "log" or not fails
        assert all(t.done() for t in tasks)
        assert len(sup) == 0
        with pytest.raises(RuntimeError):
            sup.spawn("late", _run(0, "ok", started))
    asyncio.run(main())


async def test_fail_policy_cancels_the_others_on_first_failure() -> None:
    sup = Supervisor("t", "fail")
    hang = sup.spawn("hang", asyncio.Event().wait())
    sup.spawn("fail", _run(1, "fail", []))
    with pytest.raises(ValueError):
        await sup.wait()
    assert hang.cancelled()


async def test_finished_tasks_are_forgotten() -> None:
    sup = Supervisor("t")
    for i in range(100):
        await sup.spawn(str(i), _run(0, "ok", []))
    assert len(sup) == 0


async def test_cancel_and_wait_absorbs_the_tasks_cancellation_only() -> None:
    t = asyncio.ensure_future(asyncio.Event().wait())
    await asyncio.sleep(0)
    await cancel_and_wait(t)  # returns: the CancelledError was the task's
    assert t.cancelled()

    # The caller cancelled while waiting for a task that takes a while to stop: the task is
    # still settled, then the caller's cancellation propagates.
    stopping = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await stopping.wait()

    inner = asyncio.ensure_future(slow_to_stop())
    await asyncio.sleep(0)
    outer = asyncio.ensure_future(cancel_and_wait(inner))
    await asyncio.sleep(0)
    outer.cancel()
    await asyncio.sleep(0)
    assert not outer.done()  # still waiting for inner: nothing outlives its owner
    stopping.set()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert inner.done()


async def test_acquire_unless_propagates_the_callers_cancellation() -> None:
    lock, signal = asyncio.Lock(), asyncio.Event()
    await lock.acquire()
    waiter = asyncio.ensure_future(acquire_unless(lock, signal))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    lock.release()
    assert not lock.locked()  # the abandoned acquisition did not take it


async def test_acquire_unless_signal_wins() -> None:
    lock, signal = asyncio.Lock(), asyncio.Event()
    await lock.acquire()
    waiter = asyncio.ensure_future(acquire_unless(lock, signal))
    await asyncio.sleep(0)
    signal.set()
    assert await waiter is False
    lock.release()
    assert not lock.locked()


async def test_polled_list_stop_propagates_the_callers_cancellation() -> None:
    pl = PolledList.__new__(PolledList)
    stopping = asyncio.Event()

    async def poll() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await stopping.wait()

    pl._task = asyncio.ensure_future(poll())
    await asyncio.sleep(0)
    stopper = asyncio.ensure_future(pl.stop())
    await asyncio.sleep(0)
    stopper.cancel()
    stopping.set()
    with pytest.raises(asyncio.CancelledError):  # the old code swallowed it
        await stopper

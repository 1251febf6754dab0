"""Append flow control: the accounting as a property-tested state machine, and the stream policy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.broker.flow import (
    BANK_FACTOR,
    AppendFlowControl,
    FlowControlUnderflow,
    StallWatch,
    flow_controlled,
    min_rate_policed,
)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.integers(0, 3000)),
        st.tuples(st.just("chunk"), st.integers(1, 1 << 20)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(max_rate=st.sampled_from([0, 1000, 1 << 16, 1 << 20]),
       min_rate=st.sampled_from([0, 1 << 10, 1 << 16]), steps=steps)
def test_accounting_invariants(max_rate: int, min_rate: int, steps: list[tuple[str, int]]) -> None:
    fc = AppendFlowControl()
    now = 1_000
    fc.reset(max_rate, min_rate, now)
    start = now
    released = 0
    pending = 0
    for kind, n in steps:
        if kind == "tick":
            now += n
            fc.on_tick(now)
        else:
            if fc.charge:  # the previous chunk must leave first: wait until it may
                while fc.charge:  # each wait releases at least one byte
                    wait = fc.millis_until_released()
                    assert wait > 0
                    now += wait
                    fc.on_tick(now)
                released += pending
            fc.on_chunk(n)
            pending = n
            if fc.charge == 0:
                released += n
        assert 0 <= fc.spent <= min_rate
        assert fc.charge >= 0
        if max_rate:
            assert 0 <= fc.balance <= max_rate * BANK_FACTOR
            # Never more than the initial burst plus what accrued since.
            assert released <= max_rate * 1 + max_rate * (now - start) // 1000 + 1
        else:
            assert fc.charge == 0


def test_underflow_after_one_second_of_silence_worth_of_min_rate() -> None:
    fc = AppendFlowControl()
    fc.reset(0, 1000, 10_000)
    assert fc.on_tick(10_500)
    fc.on_chunk(200)  # refills, capped at one second's worth
    assert fc.spent == 700
    assert fc.on_tick(11_100)
    assert not fc.on_tick(11_200)


def test_throttled_bytes_count_as_sent() -> None:
    fc = AppendFlowControl()
    fc.reset(1000, 1 << 16, 10_000)
    fc.on_chunk(5000)  # 1000 bytes of burst credit; 4000 held back
    assert fc.charge == 4000 and fc.delayed_chunks == 1
    assert fc.millis_until_released() == 4000
    assert fc.on_tick(14_000) and fc.charge == 0


def test_balance_is_kept_across_appends() -> None:
    fc = AppendFlowControl()
    fc.reset(1000, 0, 10_000)
    fc.on_chunk(1000)
    assert fc.balance == 0
    fc.reset(1000, 0, 12_000)  # two seconds later: two seconds of credit
    assert fc.balance == 2000


def test_invalidate_lifts_the_max_rate() -> None:
    fc = AppendFlowControl()
    fc.reset(10, 1 << 16, 10_000)
    fc.on_chunk(1000)
    assert fc.charge > 0
    fc.invalidate()
    assert fc.charge == 0


async def _chunks(sizes: list[int], stall: asyncio.Event | None = None,
                  stalled: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    for n in sizes:
        yield b"x" * n
    if stall is not None:
        if stalled is not None:
            stalled.set()
        await stall.wait()  # a client that stops sending without ending its stream


async def test_stalled_stream_is_aborted() -> None:
    fc = AppendFlowControl()
    got: list[int] = []
    with pytest.raises(FlowControlUnderflow):
        async for item in flow_controlled(_chunks([10, 10], asyncio.Event()), fc, len,
                                          max_rate=0, min_rate=1 << 16):
            got.append(len(item))
    assert got == [10, 10]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the abort left no pending cancellation


async def test_brisk_stream_passes_everything() -> None:
    fc = AppendFlowControl()
    sizes = [1 << 16] * 32
    out = [len(x) async for x in flow_controlled(_chunks(sizes), fc, len, max_rate=0, min_rate=1 << 16)]
    assert out == sizes
    assert fc.delayed_chunks == 0


async def test_outside_cancellation_is_not_an_underflow() -> None:
    fc = AppendFlowControl()

    stalled = asyncio.Event()

    async def consume() -> None:
        async for _ in flow_controlled(_chunks([1], asyncio.Event(), stalled), fc, len,
                                       max_rate=0, min_rate=1 << 16):
            pass

    task = asyncio.create_task(consume())
    await stalled.wait()  # the consumer is blocked in the stalled read
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- min_rate_policed: the min rate alone, one StallWatch per loop ---------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _aborted_after(task: asyncio.Task[None], watch: StallWatch, clock: _Clock, silence: float) -> None:
    """The stalled ``task`` lives through ``silence`` seconds (less a millisecond) and is
    aborted for underflow a millisecond after, with no cancellation left pending."""
    clock.now += silence - 0.001
    watch.check(clock.now)
    assert not task.done()
    clock.now += 0.002
    watch.check(clock.now)
    with pytest.raises(FlowControlUnderflow):
        await task
    assert task.cancelling() == 0


async def test_min_rate_policed_aborts_a_stalled_client_once_its_budget_is_spent() -> None:
    clock = _Clock()
    watch = StallWatch(asyncio.get_running_loop(), clock)
    stalled = asyncio.Event()
    got: list[int] = []

    async def consume() -> None:
        async for item in min_rate_policed(_chunks([300, 200], asyncio.Event(), stalled), len, 1000,
                                           watch, clock):
            got.append(len(item))

    task = asyncio.create_task(consume())
    await stalled.wait()
    # The budget: one second's worth (1000 bytes), refilled by each chunk and capped: 1000.
    await _aborted_after(task, watch, clock, 1.0)
    assert got == [300, 200]


async def test_min_rate_policed_drains_only_while_waiting_on_the_client() -> None:
    clock = _Clock()
    watch = StallWatch(asyncio.get_running_loop(), clock)
    release = asyncio.Event()
    waiting = asyncio.Event()

    async def slow_client() -> AsyncIterator[bytes]:
        yield b"x" * 100
        waiting.set()
        await release.wait()  # the client takes 0.6 s for its next chunk
        yield b"x" * 100
        waiting.set()
        await asyncio.Event().wait()

    got = []

    async def consume() -> None:
        async for item in min_rate_policed(slow_client(), len, 1000, watch, clock):
            got.append(len(item))
            clock.now += 5.0  # the broker's own work on the chunk: not the client's time

    task = asyncio.create_task(consume())
    await waiting.wait()
    waiting.clear()
    clock.now += 0.6
    watch.check(clock.now)
    release.set()
    await waiting.wait()
    # 1000 - 600 drained + 100 refilled = 500 bytes: half a second of silence left.
    await _aborted_after(task, watch, clock, 0.5)
    assert got == [100, 100]


async def test_min_rate_policed_passes_a_brisk_stream_and_outside_cancellation() -> None:
    sizes = [1 << 16] * 32
    assert [len(x) async for x in min_rate_policed(_chunks(sizes), len, 1 << 16)] == sizes

    stalled = asyncio.Event()

    async def consume() -> None:
        async for _ in min_rate_policed(_chunks([1], asyncio.Event(), stalled), len, 1 << 16):
            pass

    task = asyncio.create_task(consume())
    await stalled.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_stall_watch_ticks_only_while_appends_wait() -> None:
    loop = asyncio.get_running_loop()
    watch = StallWatch(loop)
    task = asyncio.current_task()
    assert task is not None
    watch.begin(task, loop.time() + 3600)
    assert watch._handle is not None
    watch.end(task)
    watch._tick()  # the next tick finds nobody waiting: the timer is not re-armed
    assert watch._handle is None


async def test_min_rate_policed_spares_the_watch_when_the_next_item_is_already_here() -> None:
    class Buffered:
        """A stream whose items are all here (as our transport's requests tell by ready())."""

        def __init__(self, items: list[bytes]) -> None:
            self.items = items

        def ready(self) -> bool:
            return True

        def __aiter__(self) -> Buffered:
            return self

        async def __anext__(self) -> bytes:
            if not self.items:
                raise StopAsyncIteration
            return self.items.pop(0)

    class Untouchable(StallWatch):
        def begin(self, task: asyncio.Task[object], deadline: float) -> None:
            raise AssertionError("a ready stream registered a wait")

    watch = Untouchable(asyncio.get_running_loop())
    got = [len(x) async for x in min_rate_policed(Buffered([b"ab", b"c", b""]), len, 1000, watch)]
    assert got == [2, 1, 0]

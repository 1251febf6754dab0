"""Flow control of Append RPCs: a minimum client data rate and optional maximum journal rates.

The pipeline of a journal is exclusively held by one Append at a time, so a slow or stalled
client holds up every other appender. Gazette polices this with two rates, both in bytes per
second and evaluated in whole milliseconds:

* **min rate** (``--broker.min-append-rate``, default 64 KiB/s): a client must keep streaming
  content at least this fast. ``spent`` starts at one second's worth of the min rate, drains by
  the min rate as time passes and refills (capped at one second's worth) as chunks arrive; when it
  reaches zero the RPC is aborted with :class:`FlowControlUnderflow`.
* **max rate** (``JournalSpec.max_append_rate``, capped by ``--broker.max-append-rate``; zero is
  no limit): ``balance`` accrues at the max rate up to ten seconds' worth (bursts after idle
  periods), starts with one second's worth, and survives across the appends of one replica. A chunk
  larger than the balance is held back until enough accrues. Bytes held back this way count as
  sent for the min-rate check: a client is never aborted for the broker's own throttling.

:class:`AppendFlowControl` is the pure accounting (deterministic, driven by explicit millisecond
clocks, so it is property-tested); :func:`flow_controlled` applies it to a request stream with one
timer per append (no per-chunk tasks): the timer fires at the moment ``spent`` would run dry and
re-arms itself if chunks arrived meanwhile.

Without a max rate (the default) only the min-rate check remains, and :func:`min_rate_policed`
applies it for a fraction of the cost (the small-append path pays it on every append): the same
``spent`` budget, drained only while the append waits on its client, kept as one deadline per
wait; one :class:`StallWatch` per event loop looks at the deadlines of the appends waiting
every ``QUANTUM`` (Gazette's flow-control quantum), instead of a timer armed and cancelled
per append. A stall is thus noticed at most ``QUANTUM`` late.

**Queued appends**: an append reads its client's stream ahead, under the min-rate policy,
before it queues for the pipeline (``broker/readahead.py``: ``READ_AHEAD`` bytes at most).

Invariants: ``0 <= spent <= min_rate`` after every debit; ``0 <= balance <= bank_factor *
max_rate`` when a max rate is set; a chunk is released only once its whole length was debited.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Generic, TypeVar

from gazette.errors import GazetteError

__all__ = [
    "AppendFlowControl",
    "FlowControlUnderflow",
    "StallWatch",
    "flow_controlled",
    "min_rate_policed",
    "DEFAULT_MIN_APPEND_RATE",
    "BANK_FACTOR",
    "QUANTUM",
    "READ_AHEAD",
]

DEFAULT_MIN_APPEND_RATE = 1 << 16
"""Gazette's default minimum client append rate, bytes per second."""
BANK_FACTOR = 10
"""Seconds of unused max-rate credit that may be banked for a later burst."""
BURST_SECONDS = 1
"""Initial credit, in seconds of the max rate (balance) and of the min rate (spent)."""
QUANTUM = 0.05
"""Seconds between looks at a stream whose chunk the broker is still handling (Gazette's quantum)."""
READ_AHEAD = 1 << 17
"""Content bytes an append reads ahead of its client before it queues for the pipeline."""


class FlowControlUnderflow(GazetteError):
    """The client did not sustain the minimum append data rate: the stalled client gives
    the pipeline back (RESOURCE_EXHAUSTED)."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self) -> None:
        super().__init__("client stream didn't sustain the minimum append data rate")


class AppendFlowControl:
    """Byte accounting of one journal's appends (see the module docstring)."""

    __slots__ = ("balance", "charge", "delayed_chunks", "last_millis", "max_rate", "min_rate",
                 "spent", "total_chunks")

    def __init__(self) -> None:
        self.max_rate = 0
        self.min_rate = 0
        self.balance = 0
        self.spent = 0
        self.charge = 0
        self.last_millis = 0
        self.total_chunks = 0
        self.delayed_chunks = 0

    def reset(self, max_rate: int, min_rate: int, now_millis: int) -> None:
        """Begins the accounting of a new Append, keeping the banked balance of earlier ones."""
        first = self.last_millis == 0
        self.max_rate = max_rate
        self.charge = 0
        self.total_chunks = self.delayed_chunks = 0
        if first:
            self.balance = max_rate * BURST_SECONDS
            self.last_millis = now_millis
        else:
            self.min_rate = 0  # the previous append's min-rate budget is not carried over
            self.spent = 0
            self.on_tick(now_millis)
        self.min_rate = min_rate
        self.spent = min_rate * BURST_SECONDS

    def on_tick(self, now_millis: int) -> bool:
        """Accrues balance and drains ``spent`` up to ``now``; False once the client underflows."""
        if now_millis < self.last_millis:
            return True  # the clock stepped back: wait for it to catch up
        elapsed = now_millis - self.last_millis
        if self.max_rate:
            self.balance = min(self.balance + self.max_rate * elapsed // 1000,
                               self.max_rate * BANK_FACTOR)
        self.spent -= min(self.min_rate * elapsed // 1000, self.spent)
        self.last_millis = now_millis
        self.debit()
        return self.spent > 0 or self.min_rate == 0

    def on_chunk(self, length: int) -> None:
        """Charges a chunk of ``length`` content bytes; it may leave only once ``charge`` is 0."""
        assert self.charge == 0, "a chunk is still being charged"
        self.charge = length
        self.debit()
        if self.charge:
            self.delayed_chunks += 1
        self.total_chunks += 1

    def invalidate(self) -> None:
        """Lifts the max rate for the rest of this append (a route change must converge fast)."""
        self.max_rate = 0
        self.debit()

    def debit(self) -> None:
        if self.max_rate == 0:
            self.spent = min(self.spent + self.charge, self.min_rate)
            self.charge = 0
            return
        d = min(self.balance, self.charge)
        self.balance -= d
        self.charge -= d
        # Bytes held back by our own throttle count as sent: never abort for that.
        self.spent = min(self.spent + d + self.charge, self.min_rate)

    def millis_until_underflow(self) -> float:
        """Milliseconds until ``spent`` runs dry without further chunks (inf without a min rate)."""
        if self.min_rate == 0:
            return float("inf")
        return self.spent * 1000 / self.min_rate

    def millis_until_released(self) -> int:
        """Milliseconds until the pending charge is covered by accruing balance."""
        if self.charge == 0 or self.max_rate == 0:
            return 0
        return -(-(self.charge - self.balance) * 1000 // self.max_rate)


T = TypeVar("T")


def _now_millis() -> int:
    return time.monotonic_ns() // 1_000_000


async def flow_controlled(
    it: AsyncIterator[T],
    fc: AppendFlowControl,
    content_length: Callable[[T], int],
    *,
    max_rate: int,
    min_rate: int,
    clock: Callable[[], int] = _now_millis,
) -> AsyncGenerator[T, None]:
    """Yields the items of ``it`` under ``fc``'s policy; raises FlowControlUnderflow on a stall.

    The stall check is one timer per append, not a task per chunk: it fires when ``spent`` would
    run dry, and if chunks arrived meanwhile it re-arms for the new moment.
    """
    fc.reset(max_rate, min_rate, clock())
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    underflowed = False
    waiting = False  # only a stall of the client's stream may abort it, never our own work
    handle: asyncio.TimerHandle | None = None

    def arm() -> None:
        nonlocal handle
        wait = fc.millis_until_underflow()
        if wait != float("inf"):
            handle = loop.call_later(max(wait, 1.0) / 1000, check)

    def check() -> None:
        nonlocal handle, underflowed
        if not waiting:  # the broker itself is busy with the last chunk: look again later
            handle = loop.call_later(QUANTUM, check)
        elif fc.on_tick(clock()):
            arm()
        else:
            underflowed = True
            task.cancel()

    def underflow() -> FlowControlUnderflow:
        task.uncancel()
        return FlowControlUnderflow()

    arm()
    try:
        while True:
            waiting = True
            try:
                item = await it.__anext__()
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if underflowed:
                    raise underflow() from None
                raise
            finally:
                waiting = False
            n = content_length(item)
            if n:
                fc.on_tick(clock())
                fc.on_chunk(n)
                while fc.charge:  # throttled by the max rate
                    await asyncio.sleep(fc.millis_until_released() / 1000)
                    fc.on_tick(clock())
            yield item
            # Time the broker spent on the chunk (e.g. replication back-pressure) is not the
            # client's: it accrues balance but does not drain the min-rate budget.
            spent = fc.spent
            fc.on_tick(clock())
            fc.spent = max(fc.spent, spent)
    finally:
        if handle is not None:
            handle.cancel()


class StallWatch:
    """The waits on clients of one event loop's appends, each with the moment it underflows;
    one timer, ticking every ``QUANTUM`` while any append waits, cancels those past theirs.

    Invariant: ``_handle`` is armed exactly when ``_waits`` is not empty (or was at the last
    tick); a task is in ``_underflowed`` only between its cancellation here and its
    :meth:`underflowed` check."""

    __slots__ = ("_waits", "_underflowed", "_handle", "_loop", "_clock")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = loop
        self._clock = clock
        self._waits: dict[asyncio.Task[object], float] = {}
        self._underflowed: set[asyncio.Task[object]] = set()
        self._handle: asyncio.TimerHandle | None = None

    def begin(self, task: asyncio.Task[object], deadline: float) -> None:
        """``task`` waits on its client, which underflows at ``deadline`` (clock seconds)."""
        self._waits[task] = deadline
        if self._handle is None:
            self._handle = self._loop.call_later(QUANTUM, self._tick)

    def end(self, task: asyncio.Task[object]) -> None:
        self._waits.pop(task, None)

    @property
    def clock(self) -> Callable[[], float]:
        """The clock deadlines are in (``min_rate_policed`` measures its waits with it)."""
        return self._clock

    def underflowed(self, task: asyncio.Task[object]) -> bool:
        """Whether the watch cancelled ``task`` (once: the mark is taken)."""
        if task in self._underflowed:
            self._underflowed.discard(task)
            return True
        return False

    def check(self, now: float) -> None:
        """Cancels every waiting task whose deadline is past ``now``."""
        for task, deadline in list(self._waits.items()):
            if deadline <= now:
                del self._waits[task]
                self._underflowed.add(task)
                task.cancel()

    def _tick(self) -> None:
        self.check(self._clock())
        self._handle = self._loop.call_later(QUANTUM, self._tick) if self._waits else None

    @staticmethod
    def of(loop: asyncio.AbstractEventLoop) -> StallWatch:
        """The watch of ``loop`` (made on first use)."""
        watch = _WATCHES.get(loop)
        if watch is None:
            watch = _WATCHES[loop] = StallWatch(loop)
        return watch


_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StallWatch] = weakref.WeakKeyDictionary()


class min_rate_policed(Generic[T]):  # noqa: N801 - used as flow_controlled is, a function's name
    """Yields the items of ``it``; raises FlowControlUnderflow once the client, while waited
    on, falls below ``min_rate`` bytes per second (see the module docstring: the budget is
    :class:`AppendFlowControl`'s ``spent`` without a max rate)."""

    __slots__ = ("_it", "_ready", "_length", "_min_rate", "_spent", "_cap", "_watch", "_task", "_clock")

    def __init__(self, it: AsyncIterator[T], content_length: Callable[[T], int], min_rate: int,
                 watch: StallWatch | None = None, clock: Callable[[], float] | None = None) -> None:
        self._it = it
        # A stream that can tell its next item is already here (our transport's requests)
        # spares the watch: taking it cannot stall.
        self._ready: Callable[[], bool] | None = getattr(it, "ready", None)
        self._length = content_length
        self._min_rate = min_rate
        self._cap = float(min_rate * BURST_SECONDS)
        self._spent = self._cap  # bytes of budget left
        # The watch and the task it would cancel are looked up at the first wait (most
        # appends arrive whole and never wait).
        self._watch = watch
        self._task: asyncio.Task[object] | None = None
        self._clock = clock  # None: the watch's

    def __aiter__(self) -> min_rate_policed[T]:
        return self

    async def __anext__(self) -> T:
        ready = self._ready
        if ready is not None and ready():
            item = await self._it.__anext__()
            self._spent = min(self._spent + self._length(item), self._cap)
            return item
        task = self._task
        if task is None:
            current = asyncio.current_task()
            assert current is not None, "min_rate_policed outside a task"
            task = self._task = current
        watch = self._watch
        if watch is None:
            watch = self._watch = StallWatch.of(task.get_loop())
        clock = self._clock
        if clock is None:
            clock = self._clock = watch.clock
        began = clock()
        watch.begin(task, began + self._spent / self._min_rate)
        try:
            item = await self._it.__anext__()
        except asyncio.CancelledError:
            if watch.underflowed(task):
                task.uncancel()
                raise FlowControlUnderflow() from None
            raise
        finally:
            watch.end(task)
        # Drained while waited on; refilled by the chunk, up to one second's worth.
        spent = self._spent - (clock() - began) * self._min_rate
        self._spent = min(max(spent, 0.0) + self._length(item), self._cap)
        return item

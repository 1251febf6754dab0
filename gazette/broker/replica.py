"""A journal replica: the local spool, the fragment index, the pipeline and the pulse.

A Replica exists while this broker is assigned its journal (see ``resolver``).
Invariants:

* The spool is owned by one holder at a time, through ``spool_lock``: the primary's
  replication pipeline (from its construction until its ``close_send``), or a peer's
  Replicate RPC (for the life of the stream). Nothing else applies requests to it, except
  ``complete_spool`` by a holder of the lock.
* The send side of the pipeline is owned by one append at a time, through ``send_lock``;
  ``pln`` (the current pipeline, or None) is read and replaced only by its holder. Receive
  sides are ordered by the pipeline's read barrier (see ``pipeline``).
* The index holds every committed local fragment (``on_commit``) and, after the first
  refresh, every fragment listed by the journal's stores; the refresh repeats every
  ``fragment.refresh_interval``. Appends wait for the first refresh so they can tell whether
  the stores hold content beyond the spool; a new primary also waits for a refresh begun
  after it became primary, so it sees what its predecessor persisted.
* Every completed spool goes to the persister: a primary's (or one closed by a pipeline
  synchronisation) at once, a replica's after the persister's replica delay.
* ``route_signal`` is set (and replaced) whenever the journal's assignments change, waking
  RPCs which wait for the spool or the pipeline under a resolution that is now stale.
* While primary, a *pulse* (a zero-byte append) runs on becoming primary, on each route
  change, when the spool's flush interval passes, after a pipeline broke, and at health
  ticks (every ``--broker.health-interval``, jittered, from the broker's one
  ``HealthTicker``, which a primary registers with; no replica has a timer of its own): it
  builds and synchronises the pipeline and advertises the route's consistency, without
  waiting for a client's append. A tick pulses only if the pipeline is missing or no longer
  whole (a peer's stream ended: keepalive pings on the peer connections end its streams
  when the peer stops answering), an auto-suspension is due, or every ``FULL_PULSE_TICKS``
  ticks: an idle journal with a whole pipeline costs a counter increment per interval, not
  an append through its peers (at 20,000 journals periodic pulses were 29 % of a core
  across three idle brokers). With auto-suspension, a pulse after ``AUTO_SUSPEND_TICKS``
  ticks without a route change asks to suspend the journal if it is flushed: a fully
  suspended journal has no replicas at all until an append resumes it.
* A pipeline a pulse built is released once the pulses asked for are done, unless an
  append committed through it or waits for it; a pipeline that carried appends is released
  after ``RELEASE_TICKS`` ticks without a commit. An idle journal then holds no Replicate
  stream, sender or peer handler. A released pipeline is not rebuilt by a tick (only by an
  append, or a pulse asked for by anything else, a full tick's included); any request for a
  pulse clears the release, so a pulse that fails before building a pipeline is retried at
  the next tick. Nothing outlives a released pipeline's shutdown that refers to it (its
  senders drop their back-reference), so it is freed at once, not by a full collection.
* An idle replica runs no task and costs no CPU between its due times: one timer on the
  event loop stands for its maintenance, set for the next refresh or the spool's next flush
  boundary (Gazette's ``flush_interval``) and re-armed early only by what changes them
  (becoming primary, a route change, the first commit to an empty spool); a refresh runs in
  a task of its own, as does a run of pulses (started by ``request_pulse``, ended when none
  is asked for). 10,000 replicas ticking once a second were most of an idle broker's core,
  and two tasks per replica (a maintenance loop and a pulse loop) a fifth of its memory.
* ``cancel()`` stops the replica's tasks, wakes blocked reads and RPCs, and retires it in
  the background: the pipeline is torn down, then the spool is completed (and so persisted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gazette.broker.flow import AppendFlowControl
from gazette.broker.health import HealthTicker
from gazette.broker.index import Index
from gazette.broker.persister import Persister
from gazette.broker.spool import Spool, SpoolSnapshot
from gazette.fifo_lock import FifoLock
from gazette.fragment import Fragment
from gazette.fragment.stores import Stores, walk_all_stores
from gazette.lean_event import LeanEvent
from gazette.protocol import protocol_pb2 as pb
from gazette.tasks import Supervisor, cancel_and_wait, wait_first

if TYPE_CHECKING:
    from gazette.broker.pipeline import Pipeline

log = logging.getLogger(__name__)

DEFAULT_REFRESH = 300.0
MAINTAIN_TICK = 1.0
"""Seconds between re-checks while a flush is due but its pulse has not rolled the spool yet."""
AUTO_SUSPEND_TICKS = 15
"""Periodic pulses without a route change before an auto-suspending broker's pulse asks to
suspend the journal (Gazette's: the start-up race with resuming clients, a new primary not yet
refreshed, and topologies in churn all settle well within it)."""
FULL_PULSE_TICKS = 15
"""Every this many health ticks a primary pulses even with a whole pipeline (the route is
re-verified end to end, as Gazette does every tick)."""
RELEASE_TICKS = 2
"""Health ticks without an append after which a primary releases its idle pipeline (the
Replicate streams to its peers, and what both ends of each hold); the next append or pulse
builds it again."""
PULSE_TIMEOUT = 60.0
"""A pulse still unfinished after this long is abandoned (and retried)."""

PULSE_BACKOFF_MAX = 1.0
"""The longest pause between failed pulses (they double from 50 ms)."""

PulseFn = Callable[["Replica", bool], Awaitable[None]]
"""Pulses the journal as its primary; the flag asks to suspend it if it is flushed."""


async def acquire_unless(lock: asyncio.Lock, signal: asyncio.Event | None) -> bool:
    """Acquires ``lock``, unless ``signal`` is set first (then returns False, not holding it).

    The caller's cancellation propagates (after the pending acquisition settled, and a lock it
    won released), never swallowed."""
    if not lock.locked() or signal is None:
        await lock.acquire()
        return True
    if signal.is_set():
        return False
    acq = asyncio.ensure_future(lock.acquire())
    try:
        try:
            await wait_first(acq, signal.wait())
        finally:  # a no-op once it won; else cancelled and settled, on any ending
            await cancel_and_wait(acq)
    except BaseException:
        if _won(acq):
            lock.release()
        raise
    return _won(acq)


def _won(acq: asyncio.Future[Any]) -> bool:
    return acq.done() and not acq.cancelled() and acq.exception() is None


async def wait_unless(event: asyncio.Event, signal: asyncio.Event | None) -> bool:
    """Waits for ``event``; False if ``signal`` is set first."""
    if event.is_set():
        return True
    if signal is None:
        await event.wait()
        return True
    if signal.is_set():
        return False
    await wait_first(event.wait(), signal.wait())
    return event.is_set()


def seconds_to_flush(first_append: float | None, interval: int, now: float) -> float | None:
    """Seconds (wall clock) until the spool holding content since ``first_append`` is due to
    flush: the end of the ``interval``-aligned window it began in (0 once passed); None with no
    content or no interval. Due exactly when ``int(first) // interval != int(now) // interval``."""
    if first_append is None or interval <= 0:
        return None
    return max(0.0, (int(first_append) // interval + 1) * interval - now)


class Replica:
    # Slots: a broker holds one Replica per assigned journal, and its instance dict (40
    # attributes) was 1.5 KiB of each.
    __slots__ = (
        "_auto_suspend", "_background", "_built_at", "_commits", "_flush_armed", "_idle_ticks", "_loop",
        "_maint_timer", "_next_refresh", "_primary_refreshed", "_pulse_failures", "_pulse_fn", "_pulse_now",
        "_pulse_task", "_refresh_failures", "_refresh_now", "_refreshing", "_released", "_stable_ticks", "_tg",
        "_tick_commits", "_ticker", "assignments_sig", "cancelled", "flow", "index", "journal", "persister",
        "pln", "primary", "retired", "route_signal", "send_lock", "_spec", "_flush_interval", "spool",
        "spool_lock", "stores")

    def __init__(
        self,
        journal: str,
        spec: pb.JournalSpec,
        spool_dir: str,
        stores: Stores,
        persister: Persister,
        tg: asyncio.TaskGroup,
        pulse: PulseFn | None = None,
        *,
        auto_suspend: bool = False,
        ticker: HealthTicker | None = None,
    ) -> None:
        self.journal = journal
        self._spec = spec
        self._flush_interval = int(spec.fragment.flush_interval.seconds)
        self.stores = stores
        self.persister = persister
        self.index = Index(signer=self._sign)
        self.spool = Spool(journal, directory=spool_dir, on_commit=self._spool_committed, on_complete=self._on_complete)
        self.spool_lock = asyncio.Lock()
        self.send_lock = FifoLock()  # taken by every append: its free case makes no coroutine
        # Flow control of this journal's appends; its max-rate balance outlives each append.
        self.flow = AppendFlowControl()
        self.pln: Pipeline | None = None
        self.primary = False
        self.cancelled = False
        self.route_signal = LeanEvent()
        self.assignments_sig: tuple[tuple[str, int], ...] = ()
        self.retired: asyncio.Task[None] | None = None
        self._pulse_fn = pulse
        self._auto_suspend = auto_suspend
        self._ticker = ticker  # health ticks while primary; None: on-demand pulses only
        self._stable_ticks = 0  # periodic pulses since the route last changed
        self._commits = 0  # content commits to the spool (a pulse commits none)
        self._idle_ticks = 0  # health ticks without a commit
        self._tick_commits = -1  # commits at the last health tick
        self._released = False  # the pipeline was released idle, and no pulse asked since
        self._pulse_now = LeanEvent()
        self._pulse_failures = 0  # consecutive failed pulses
        self._built_at: int | None = None  # commits when a pulse last built the pipeline
        # Set by a refresh that began after this replica last became primary.
        self._primary_refreshed = LeanEvent()
        self._tg = tg
        self._loop = asyncio.get_running_loop()
        self._next_refresh = 0.0  # loop time: the first refresh is due at once
        self._refresh_failures = 0
        self._refresh_now = False
        self._flush_armed = False  # the maintenance timer is set towards a flush boundary
        # Tasks only while there is work (see the module docstring).
        self._maint_timer: asyncio.TimerHandle | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._pulse_task: asyncio.Task[None] | None = None
        # Pipeline shutdowns, demotions and the retirement: owned, failures logged (one
        # journal's background step failing is its own), never raised.
        self._background: Supervisor | None = None  # made by the first ``spawn``
        self._schedule()

    def _sign(self, fragment: Fragment, ttl: float) -> str | None:
        try:
            return self.stores.get(fragment.backing_store).sign_url(fragment, ttl)
        except Exception:  # noqa: BLE001 - no signed URL: the broker serves the read itself
            return None

    def complete_spool(self) -> None:
        """Rolls the spool so its content is handed to the persister (caller owns the spool)."""
        f = self.spool.fragment
        if f.content_length == 0:
            return
        nxt = pb.Fragment(journal=f.journal, begin=f.end, end=f.end, compression_codec=f.codec)
        self.spool.must_apply(pb.ReplicateRequest(proposal=nxt, registers=self.spool.registers), True)

    @property
    def spec(self) -> pb.JournalSpec:
        return self._spec

    @spec.setter
    def spec(self, spec: pb.JournalSpec) -> None:
        self._spec = spec
        self._flush_interval = int(spec.fragment.flush_interval.seconds)  # read on every commit

    def _spool_committed(self, fragment: Fragment) -> None:
        self._commits += 1
        self.index.spool_commit(fragment)
        # Only where a flush interval is set: without one, nothing is due, and waking the
        # maintenance loop on every append would be work on the append path for nothing.
        if self.primary and not self._flush_armed and self._flush_interval > 0:
            self._schedule()  # the spool may have just begun a flush window

    def _request_refresh(self) -> None:
        self._refresh_now = True
        self._schedule()

    def _on_complete(self, snap: SpoolSnapshot) -> None:
        if self.spec.fragment.stores:
            self.persister.spool_complete(snap)

    # -- routing --------------------------------------------------------------------------

    def set_primary(self, primary: bool) -> None:
        """Called by the resolver on each assignment change."""
        if primary and not self.primary:
            # A new primary must see what the previous one persisted before it appends.
            self._primary_refreshed.clear()
            self._request_refresh()
            self.request_pulse()
            if self._ticker is not None:
                self._ticker.add(self)
        elif self.primary and not primary:
            self.spawn(self._drop_pipeline(), "demoted")
            if self._ticker is not None:
                self._ticker.discard(self)
        self.primary = primary

    def signal_route_change(self) -> None:
        """Wakes RPCs waiting under a now-stale resolution, and pulses a primary.

        A replica whose spool was rolled forward by a synchronisation past content it never
        held also refreshes its index now: the primary persisted that content before it
        advertised the route, so readers of this replica need not wait a refresh interval.
        """
        self.route_signal.set()
        self.route_signal = LeanEvent()
        self._stable_ticks = 0
        self.request_pulse()
        if self._missing_below_spool():
            self._request_refresh()

    def _missing_below_spool(self) -> bool:
        begin = self.spool.fragment.begin
        if begin == 0:
            return False
        _, found = self.index.fragments().longest_overlapping(begin - 1)
        return not found

    def request_pulse(self) -> None:
        self._released = False
        self._pulse_now.set()
        if self._pulse_task is None and self._pulse_fn is not None and not self.cancelled:
            self._pulse_task = self._start(self._pulse_loop(), "pulse")

    def health_tick(self) -> None:
        """A health interval passed (the broker's ``HealthTicker`` calls this while we are
        primary): pulse if the pipeline is missing (and was not released idle) or not whole,
        an auto-suspension is due, or every ``FULL_PULSE_TICKS`` ticks; else release a
        pipeline idle for ``RELEASE_TICKS`` ticks (see the module docstring)."""
        self._stable_ticks += 1
        commits = self._commits
        if commits == self._tick_commits:
            self._idle_ticks += 1
        else:
            self._tick_commits, self._idle_ticks = commits, 0
        pln = self.pln
        if (self._stable_ticks % FULL_PULSE_TICKS == 0
                or (self._auto_suspend and self._stable_ticks >= AUTO_SUSPEND_TICKS)):
            self.request_pulse()
        elif pln is None:
            if not self._released:
                self.request_pulse()
        elif not pln.idle_healthy():
            self.request_pulse()
        elif self._idle_ticks >= RELEASE_TICKS and not self.send_lock.locked():
            self.spawn(self._release_idle(pln, commits), "idle pipeline release")

    async def _release_idle(self, pln: Pipeline, commits: int) -> None:
        """Releases ``pln`` if it is still current and whole, no append committed since
        ``commits`` were counted, and no pulse is asked for."""
        async with self.send_lock:
            if (self.pln is not pln or not pln.idle_healthy() or self._commits != commits
                    or self._pulse_now.is_set() or not self.primary):
                return
            self.pln = None
            self._released = True
            await pln.shutdown(False)

    @property
    def primary_refreshed(self) -> asyncio.Event:
        return self._primary_refreshed

    def fresh_roll_offset(self) -> int:
        """Offset a never-written spool should start at: the end of what the stores hold.

        Only for routes of one member (replication 1): with no peer to synchronise with, a
        replica that never held content starts after everything its predecessor persisted
        (the predecessor persists before it advertises the route that lets the allocator move
        the primary). With peers, the write head comes from the pipeline's synchronisation.
        """
        f = self.spool.fragment
        if f.content_length == 0 and self.spool.first_append_time is None and self.index.end_offset > f.end:
            return self.index.end_offset
        return 0

    # -- lifecycle ------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """Runs ``coro`` in the background, logging (never raising) its failure."""
        if self._background is None:
            self._background = Supervisor(f"replica {self.journal}", "log")
        return self._background.spawn(what, coro)

    @property
    def background(self) -> frozenset[asyncio.Task[Any]]:
        """The replica's background steps still running."""
        return self._background.tasks if self._background is not None else frozenset()

    def retire_pipeline(self, pln: Pipeline, expect_err: bool) -> None:
        """Shuts ``pln`` down in the background (caller owns the send side and has already
        detached it from ``self.pln``)."""
        pln.close_send()
        self.spawn(pln.shutdown(expect_err), "pipeline shutdown")

    async def _drop_pipeline(self) -> None:
        async with self.send_lock:
            pln, self.pln = self.pln, None
            if pln is not None:
                await pln.shutdown(False)

    def cancel(self) -> None:
        """The journal is no longer assigned here: stop, and retire in the background."""
        if self.cancelled:
            return
        self.cancelled = True
        for task in (self._maint_timer, self._refreshing, self._pulse_task):
            if task is not None:
                task.cancel()
        if self._ticker is not None:
            self._ticker.discard(self)
        self.primary = False
        self.index.close()
        self.signal_route_change()
        self.retired = self.spawn(self._retire(), "retire")

    async def _retire(self) -> None:
        await self._drop_pipeline()
        async with self.spool_lock:
            self.complete_spool()  # hand the content to the persister before letting go

    async def shutdown(self, timeout: float) -> None:  # noqa: ASYNC109 - bounded drain step
        """Tears the pipeline down and completes the spool, waiting at most ``timeout``;
        past it the spool is completed regardless (the broker is leaving)."""
        self.cancel()
        assert self.retired is not None
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.retired)
        except TimeoutError:
            log.warning("replica did not retire in time; completing its spool", extra={"journal": self.journal})
            if self.pln is not None:
                self.pln.cancel()
            self.complete_spool()

    # -- maintenance ----------------------------------------------------------------------

    async def wait_first_refresh(self) -> None:
        await self.index.first_refresh.wait()

    async def _refresh(self) -> None:
        cover = await walk_all_stores(self.journal, list(self.spec.fragment.stores), self.stores)
        self.index.replace_remote(cover)

    def _start(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None] | None:
        """A task of the broker's group for ``coro``; None once the group is finished."""
        try:
            return self._tg.create_task(coro, name=f"{what}:{self.journal}")
        except RuntimeError:  # the broker is stopping: there is nothing left to maintain
            coro.close()
            return None

    def _schedule(self) -> None:
        """Arms the maintenance timer for the next due time: the refresh, or the spool's flush
        boundary. A refresh in flight arms it as it ends."""
        if self.cancelled or self._refreshing is not None:
            return
        if self._maint_timer is not None:
            self._maint_timer.cancel()
        now = self._loop.time()
        due = now if self._refresh_now else self._next_refresh
        flush_in = self._flush_delay()
        self._flush_armed = flush_in is not None
        if flush_in is not None:
            # Past the boundary its pulse is pending: look again each tick until it rolls.
            due = min(due, now + (flush_in + 0.01 if flush_in > 0 else MAINTAIN_TICK))
        self._maint_timer = self._loop.call_at(due, self._on_due)

    def _on_due(self) -> None:
        """The maintenance timer fired: refresh (in a task of its own) if due, else pulse if
        the flush interval passed, and arm the timer again."""
        self._maint_timer = None
        if self.cancelled:
            return
        if self._refresh_now or self._loop.time() >= self._next_refresh:
            self._refreshing = self._start(self._refresh_step(), "refresh")
            return
        self._maybe_flush()
        self._schedule()

    async def _refresh_step(self) -> None:
        """Refreshes the index from the stores (retried with a back-off), then re-arms."""
        self._refresh_now = False
        primary_at_start = self.primary
        try:
            await self._refresh()
            if primary_at_start:
                self._primary_refreshed.set()
            self._refresh_failures = 0
            interval = self.spec.fragment.refresh_interval.ToTimedelta().total_seconds() or DEFAULT_REFRESH
            self._next_refresh = self._loop.time() + interval
        except Exception as err:  # noqa: BLE001 - retried; appends wait meanwhile
            self._refresh_failures += 1
            log.warning("refreshing fragment index failed", extra={"journal": self.journal, "err": str(err) or type(err).__name__})
            self._next_refresh = self._loop.time() + min(30.0, 0.5 * 2**self._refresh_failures)
        finally:
            self._refreshing = None
        self._maybe_flush()
        self._schedule()

    def _flush_delay(self) -> float | None:
        if not self.primary or self.spool.fragment.content_length == 0:
            return None
        return seconds_to_flush(self.spool.first_append_time, self.spec.fragment.flush_interval.seconds, time.time())

    def _maybe_flush(self) -> None:
        """Once the spool's flush interval has passed, a primary pulses: the pulse's append
        rolls the spool through the pipeline, as a client's append would."""
        interval = self.spec.fragment.flush_interval.seconds
        first = self.spool.first_append_time
        if not self.primary or interval <= 0 or first is None or self.spool.fragment.content_length == 0:
            return
        if int(first) // interval != int(time.time()) // interval:
            self.request_pulse()

    async def _pulse_loop(self) -> None:
        """Pulses while pulses are asked for, then ends: becoming primary, route changes,
        flushes and broken pipelines ask for pulses, and the broker's HealthTicker for the
        periodic ones (``request_pulse`` starts this task when none runs)."""
        try:
            pulse_fn = self._pulse_fn
            assert pulse_fn is not None  # request_pulse starts this task only with one
            while self._pulse_now.is_set():
                self._pulse_now.clear()
                if not self.primary:
                    self._pulse_failures = 0
                    continue
                suspend = self._auto_suspend and self._stable_ticks >= AUTO_SUSPEND_TICKS
                if self.pln is None and self._built_at is None:
                    self._built_at = self._commits  # this pulse builds the pipeline
                try:
                    async with asyncio.timeout(PULSE_TIMEOUT):
                        await pulse_fn(self, suspend)
                    self._pulse_failures = 0
                    if self._built_at is not None and not self._pulse_now.is_set():
                        # The pulses asked for are done: release what they built unless an
                        # append used it or waits for it (see the module docstring). No
                        # local names the pipeline: this frame may outlive it.
                        commits, self._built_at = self._built_at, None
                        if self.pln is not None and not self.send_lock.locked():
                            await self._release_idle(self.pln, commits)
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - retried at the next pulse
                    log.warning("journal pulse failed (will retry)", extra={"journal": self.journal, "err": str(err) or type(err).__name__})
                    # A failed pulse asks for the next at once (its broken pipeline does): back
                    # off, or a peer that stays unreachable until its lease lapses is hammered.
                    await asyncio.sleep(min(PULSE_BACKOFF_MAX, 0.05 * 2 ** self._pulse_failures))
                    self._pulse_failures += 1
        finally:
            self._pulse_task = None

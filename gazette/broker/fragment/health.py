"""Fragment store health: each store in use is checked periodically, its last result cached.

Gazette refuses appends to a journal whose primary (first) fragment store is unhealthy, with
``FRAGMENT_STORE_UNHEALTHY``, and reports store health through the FragmentStoreHealth RPC;
both read the result of a background check loop rather than touching the store per request.
:class:`StoreHealth` is that loop for a broker.

Invariants:

* One check loop per store URL, started the first time the URL is asked about (``status``,
  ``watch``, ``await_*``) while :meth:`StoreHealth.run` runs. A check is the store's own
  ``health_check()`` (for S3: PUT, GET, LIST, sign and fetch) under a ``timeout``. At most one
  check of a store runs at a time.
* Schedule, as Gazette's: after a success the next check is ``ok_interval`` (30 min) later;
  after the n-th consecutive failure it is ``retry_intervals[n]`` later (0, 0.1 s, 1 s, 1 s,
  10 s, 10 s, then 100 s), each with +/-20 % jitter. ``check_now`` runs one at once.
* ``status(url)`` is synchronous and O(1): the cached ``(ok, error)``. Until a store's first
  check completes it is ``(False, FIRST_CHECK_PENDING)``; a store whose URL cannot be built
  (bad URL, missing extra) is unhealthy with that error.
* Every completed check wakes waiters of that store (Gazette's "next check" channel). An
  append waits, as Gazette's append FSM does, for up to ``append_retries + 2`` completed checks
  while the primary store is unhealthy, then is refused.
* Without ``run()`` (tools, tests) nothing is scheduled: the ``await_*`` helpers run a check
  inline when they would otherwise wait for one.
* Stores not asked about between two sweeps (every ``sweep_interval``) stop being checked;
  their waiters see ``LAST_CHECK``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from gazette.fragment.errors import StoreError
from gazette.protocol import protocol_pb2 as pb
from gazette.stores import Stores

__all__ = [
    "FIRST_CHECK_PENDING",
    "LAST_CHECK",
    "RETRY_INTERVALS_ENV",
    "StoreHealth",
    "check_delete",
    "default_retry_intervals",
]

log = logging.getLogger(__name__)

FIRST_CHECK_PENDING = "first health check hasn't completed yet"
LAST_CHECK = "health checks have stopped"

OK_INTERVAL = 30 * 60.0
RETRY_INTERVALS: tuple[float, ...] = (0.0, 0.1, 1.0, 1.0, 10.0, 10.0, 100.0)
RETRY_INTERVALS_ENV = "GAZETTE_STORE_HEALTH_RETRY_INTERVALS"
"""Comma-separated seconds overriding ``RETRY_INTERVALS`` (e.g. to make tests fail fast)."""
CHECK_TIMEOUT = 60.0
APPEND_RETRIES = 5
JITTER = 0.2

HEALTH_CHECKS = Counter(
    "gazette_store_health_check_total",
    "Total number of health checks performed",
    ["store", "status"],
)


def default_retry_intervals() -> tuple[float, ...]:
    """Gazette's retry schedule, or the one in ``$GAZETTE_STORE_HEALTH_RETRY_INTERVALS``."""
    raw = os.environ.get(RETRY_INTERVALS_ENV, "").strip()
    if not raw:
        return RETRY_INTERVALS
    try:
        out = tuple(float(x) for x in raw.split(","))
    except ValueError:
        raise ValueError(f"${RETRY_INTERVALS_ENV}: expected comma-separated seconds, got {raw!r}") from None
    if not out or any(x < 0 for x in out):
        raise ValueError(f"${RETRY_INTERVALS_ENV}: expected non-negative seconds, got {raw!r}")
    return out


class _Entry:
    """Health state of one store URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = False
        self.error = FIRST_CHECK_PENDING
        self.started = 0  # Checks begun.
        self.completed = 0  # Checks finished; check k finishes when completed becomes k.
        self.failures = 0  # Consecutive failed checks.
        self.marked = True
        self.stopped = False
        self.next = asyncio.Event()  # Set (and replaced) when a check completes.
        self.wake = asyncio.Event()  # Asks the loop to check now.
        self.running: asyncio.Future[tuple[bool, str]] | None = None  # An inline check.
        self.task: asyncio.Task[None] | None = None

    def _notify(self) -> None:
        ev, self.next = self.next, asyncio.Event()
        ev.set()


class StoreHealth:
    """Health monitor of a broker's fragment stores (see the module docstring)."""

    def __init__(
        self,
        stores: Stores,
        *,
        ok_interval: float = OK_INTERVAL,
        retry_intervals: Sequence[float] | None = None,
        jitter: float = JITTER,
        timeout: float = CHECK_TIMEOUT,
        append_retries: int = APPEND_RETRIES,
        sweep_interval: float = OK_INTERVAL,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.stores = stores
        self.ok_interval = ok_interval
        self.retry_intervals = tuple(
            default_retry_intervals() if retry_intervals is None else retry_intervals
        )
        if not self.retry_intervals:
            raise ValueError("retry_intervals must not be empty")
        self.jitter = jitter
        self.timeout = timeout
        self.append_retries = append_retries
        self.sweep_interval = sweep_interval
        self._rand = rand
        self._entries: dict[str, _Entry] = {}
        self._tg: asyncio.TaskGroup | None = None
        self.started = asyncio.Event()  # Set while run() runs.

    # -- Queries (synchronous, cheap).

    def status(self, url: str) -> tuple[bool, str]:
        """``(ok, error)`` of the last completed check of ``url`` (and keep it checked)."""
        e = self._entry(url)
        return e.ok, e.error

    def watch(self, url: str) -> None:
        """Keep ``url`` checked (a store about to be used)."""
        self._entry(url)

    def append_status(self, spec: pb.JournalSpec) -> int:
        """``pb.OK``, or ``pb.FRAGMENT_STORE_UNHEALTHY`` if the journal's primary store is not
        known to be healthy (a journal without stores is always OK)."""
        if not spec.fragment.stores:
            return pb.OK
        ok, _ = self.status(spec.fragment.stores[0])
        return pb.OK if ok else pb.FRAGMENT_STORE_UNHEALTHY

    def append_error(self, spec: pb.JournalSpec) -> str:
        """The ``store_health_error`` of a refused append ("" if the primary store is OK)."""
        if not spec.fragment.stores:
            return ""
        url = spec.fragment.stores[0]
        ok, error = self.status(url)
        return "" if ok else f"fragment store {url} unhealthy: {error}"

    # -- Waiting.

    def healthy_for_append(self, spec: pb.JournalSpec) -> bool:
        """Whether :meth:`await_append_status` would answer OK at once (no wait): the
        journal has no store, or its primary store's last check succeeded."""
        stores = spec.fragment.stores
        if not stores:
            return True
        e = self._entries.get(stores[0])
        if e is None or not e.ok:
            return False
        e.marked = True
        return True

    async def await_append_status(self, spec: pb.JournalSpec) -> tuple[int, str]:
        """Gazette's append precondition: ``(pb.OK, "")`` once the primary store is healthy,
        or ``(pb.FRAGMENT_STORE_UNHEALTHY, error)`` after ``append_retries + 2`` further
        checks failed."""
        if not spec.fragment.stores:
            return pb.OK, ""
        url = spec.fragment.stores[0]
        e = self._entry(url)
        i = 0
        while not e.ok:
            await self._next_check(e)
            if e.ok:
                break
            if i > self.append_retries or e.stopped:
                return pb.FRAGMENT_STORE_UNHEALTHY, f"fragment store {url} unhealthy: {e.error}"
            i += 1
        return pb.OK, ""

    async def await_status(self, url: str) -> tuple[bool, str]:
        """``status(url)``, after waiting for the store's first check if it is pending
        (the FragmentStoreHealth RPC's answer)."""
        e = self._entry(url)
        if e.completed == 0:
            await self._next_check(e)
        return e.ok, e.error

    async def check_now(self, url: str) -> tuple[bool, str]:
        """Run a check of ``url`` that begins after this call, and return its result."""
        e = self._entry(url)
        target = e.started + 1
        while e.completed < target and not e.stopped:
            await self._next_check(e, now=True)
        return e.ok, e.error

    async def _next_check(self, e: _Entry, now: bool = False) -> None:
        """Wait for the next completed check of ``e`` (inline if no loop will run one)."""
        if e.task is None or e.task.done():
            await self._inline_check(e)
            return
        nxt = e.next
        if now:
            e.wake.set()
        await nxt.wait()

    async def _inline_check(self, e: _Entry) -> None:
        if e.running is None:
            e.running = asyncio.ensure_future(self._run_check(e))
            e.running.add_done_callback(lambda _: setattr(e, "running", None))
        await asyncio.shield(e.running)

    # -- The loops.

    async def run(self) -> None:
        """Check stores until cancelled (a long-lived task of the broker's TaskGroup)."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self.started.set()
            try:
                for e in list(self._entries.values()):
                    self._start(e)
                while True:
                    await asyncio.sleep(self.sweep_interval)
                    self.sweep()
            finally:
                self._tg = None
                self.started.clear()

    def sweep(self) -> int:
        """Stop checking stores not asked about since the last sweep; returns how many."""
        removed = 0
        for url, e in list(self._entries.items()):
            if e.marked:
                e.marked = False
                continue
            del self._entries[url]
            e.stopped = True
            e.ok, e.error = False, LAST_CHECK
            if e.task is not None:
                e.task.cancel()
            e._notify()
            removed += 1
            log.info("stopped fragment store health checks", extra={"store": url})
        return removed

    def _entry(self, url: str) -> _Entry:
        e = self._entries.get(url)
        if e is None:
            e = self._entries[url] = _Entry(url)
            self._start(e)
        e.marked = True
        return e

    def _start(self, e: _Entry) -> None:
        if self._tg is not None and (e.task is None or e.task.done()):
            e.task = self._tg.create_task(self._loop(e), name=f"store-health:{e.url}")

    async def _loop(self, e: _Entry) -> None:
        while not e.stopped:
            if e.running is not None:
                await asyncio.shield(e.running)  # An inline check began before the loop.
            else:
                await self._run_check(e)
            interval = self._interval(e)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await e.wake.wait()

    def _interval(self, e: _Entry) -> float:
        if e.ok:
            base = self.ok_interval
        else:
            base = self.retry_intervals[min(e.failures - 1, len(self.retry_intervals) - 1)]
        return max(0.0, base + (self._rand() - 0.5) * 2 * self.jitter * base)

    async def _run_check(self, e: _Entry) -> tuple[bool, str]:
        e.wake.clear()  # Requests made from here on ask for the check after this one.
        e.started += 1
        ok, error = await self._check(e.url)
        if e.stopped:
            return ok, error
        was_ok = e.ok
        e.ok, e.error = ok, error
        e.completed += 1
        HEALTH_CHECKS.labels(e.url, "ok" if ok else "error").inc()
        if ok:
            if not was_ok:
                log.info(
                    "store health check succeeded",
                    extra={"store": e.url, "attempt": e.failures},
                )
            e.failures = 0
        else:
            e.failures += 1
            log.warning(
                "store health check failed",
                extra={"store": e.url, "error": error, "attempt": e.failures},
            )
        e._notify()
        return ok, error

    async def _check(self, url: str) -> tuple[bool, str]:
        try:
            store = self.stores.get(url)
        except Exception as err:  # noqa: BLE001 - a store that cannot be built is unhealthy
            return False, str(err) or type(err).__name__
        try:
            async with asyncio.timeout(self.timeout):
                await store.health_check()
        except TimeoutError:
            return False, f"health check of {url} did not complete within {self.timeout:g}s"
        except Exception as err:  # noqa: BLE001 - reported as the store's health
            return False, str(err) or type(err).__name__
        return True, ""


async def check_delete(stores: Stores, url: str, prefix: str = "") -> None:
    """Gazette's on-demand delete probe of a store (FragmentStoreHealth ``check_delete``):
    write an object under ``prefix`` and remove it. Raises StoreError on failure."""
    store = stores.get(url)
    probe = getattr(store, "check_delete", None)
    if probe is None:
        raise StoreError(f"fragment store {url} does not support delete probes")
    await probe(prefix)

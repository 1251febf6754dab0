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
* At most ``max_concurrent_checks`` on-demand checks and delete probes touch stores at once
  (the check loops of stores in use never wait for them); a FragmentStoreHealth request beyond
  ``max_pending_requests`` waiting ones is refused with :class:`StoreChecksExhausted`
  (RESOURCE_EXHAUSTED) rather than queued.
* No error this module reports (statuses, append refusals, RPC answers, logs) holds the
  broker's file root: it is cut from every message (``file://`` paths read relative to it).

**On-demand checks** (the FragmentStoreHealth RPC, :meth:`StoreHealth.request`). The handler
validates the request first (Gazette's ``FragmentStoreHealthRequest.Validate``, plus a
``file://`` path with ``.``/``..`` segments, which would leave the file root: INVALID_ARGUMENT)
and decides who may ask about what (``broker/service.py``: with authorization on the RPC needs
APPLY; with it off, only stores some journal spec names are checked, others FAILED_PRECONDITION,
since anyone could otherwise make the broker dial an endpoint of their choosing). A store some
journal names is answered from its check loop (kept checked, as appends and the persister use
it). A store no journal names (only an APPLY holder gets here) is checked once, with a store
object built for the occasion and not kept, and the answer cached for ``adhoc_ttl`` seconds
(at most ``ADHOC_CACHE`` stores): it starts no loop and keeps no client. A delete probe's
answer is cached for ``adhoc_ttl`` per store and prefix (Gazette probes on every request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from prometheus_client import Counter

from gazette.errors import GazetteError
from gazette.fragment.errors import StoreError
from gazette.fragment.stores import FragmentStore, Stores, store_for_url
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "FIRST_CHECK_PENDING",
    "LAST_CHECK",
    "RETRY_INTERVALS_ENV",
    "StoreChecksExhausted",
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
MAX_CONCURRENT_CHECKS = 8
MAX_PENDING_REQUESTS = 64
ADHOC_TTL = 10.0
ADHOC_CACHE = 256


class StoreChecksExhausted(GazetteError):
    """Too many FragmentStoreHealth requests wait on checks: ask again later."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429

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
        max_concurrent_checks: int = MAX_CONCURRENT_CHECKS,
        max_pending_requests: int = MAX_PENDING_REQUESTS,
        adhoc_ttl: float = ADHOC_TTL,
        clock: Callable[[], float] = time.monotonic,
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
        self._slots = asyncio.Semaphore(max_concurrent_checks)
        self.max_pending_requests = max_pending_requests
        self.pending_requests = 0
        self.adhoc_ttl = adhoc_ttl
        self._clock = clock
        # (url, delete-probe prefix or None) -> (expiry, ok, error); and the checks under way.
        self._answers: OrderedDict[tuple[str, str | None], tuple[float, bool, str]] = OrderedDict()
        self._asking: dict[tuple[str, str | None], asyncio.Future[tuple[bool, str]]] = {}
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

    # -- On demand (FragmentStoreHealth).

    async def request(self, url: str, *, named: bool, check_delete: bool = False,
                      prefix: str = "") -> tuple[bool, str]:
        """The FragmentStoreHealth answer ``(ok, error)`` for a validated, permitted request
        (see the module docstring); StoreChecksExhausted beyond ``max_pending_requests``."""
        if self.pending_requests >= self.max_pending_requests:
            raise StoreChecksExhausted(
                f"{self.pending_requests} fragment store health requests are waiting; try again later")
        self.pending_requests += 1
        try:
            if named:
                ok, error = await self.await_status(url)
            else:
                ok, error = await self._ask((url, None), lambda: self._check(url, keep=False))
            if ok and check_delete:
                ok, error = await self._ask((url, prefix), lambda: self._probe(url, prefix, keep=named))
        finally:
            self.pending_requests -= 1
        return ok, self.scrub(error)

    async def _ask(self, key: tuple[str, str | None],
                   check: Callable[[], Coroutine[Any, Any, tuple[bool, str]]]) -> tuple[bool, str]:
        """A cached answer for ``key`` younger than ``adhoc_ttl``, or that of one check shared
        by every request asking meanwhile."""
        hit = self._answers.get(key)
        if hit is not None and hit[0] > self._clock():
            return hit[1], hit[2]
        running = self._asking.get(key)
        if running is None:
            # Owned by run()'s task group while it runs (tools and tests run checks inline).
            running = self._asking[key] = (
                self._tg.create_task(check(), name=f"store-health-request:{key[0]}")
                if self._tg is not None else asyncio.ensure_future(check()))

            def done(f: asyncio.Future[tuple[bool, str]]) -> None:
                del self._asking[key]
                if not f.cancelled() and f.exception() is None:
                    ok, error = f.result()
                    self._answers[key] = (self._clock() + self.adhoc_ttl, ok, error)
                    self._answers.move_to_end(key)
                    while len(self._answers) > ADHOC_CACHE:
                        self._answers.popitem(last=False)

            running.add_done_callback(done)
        return await asyncio.shield(running)

    async def _probe(self, url: str, prefix: str, keep: bool) -> tuple[bool, str]:
        try:
            store = self.stores.get(url) if keep else store_for_url(url, self.stores.file_root)
            probe = getattr(store, "check_delete", None)
            if probe is None:
                raise StoreError(f"fragment store {url} does not support delete probes")
            async with self._slots:
                async with asyncio.timeout(self.timeout):
                    await probe(prefix)
        except TimeoutError:
            return False, f"delete probe failed: it did not complete within {self.timeout:g}s"
        except Exception as err:  # noqa: BLE001 - reported to the caller as the store's health
            return False, self.scrub(f"delete probe failed: {err or type(err).__name__}")
        return True, ""

    def scrub(self, error: str) -> str:
        """``error`` without the broker's file root (paths under it read relative to it)."""
        root = self.stores.file_root
        if not root or not error:
            return error
        for r in {os.path.abspath(root), os.path.realpath(root), root}:
            if r and r != "/":
                error = error.replace(r.rstrip("/") + "/", "").replace(r.rstrip("/"), ".")
        return error

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
        error = self.scrub(error)
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

    async def _check(self, url: str, keep: bool = True) -> tuple[bool, str]:
        """One check of ``url``'s store (``keep``: the store object the broker uses; else one
        built for the check and dropped)."""
        try:
            store: FragmentStore = self.stores.get(url) if keep else store_for_url(url, self.stores.file_root)
        except Exception as err:  # noqa: BLE001 - a store that cannot be built is unhealthy
            return False, self.scrub(str(err) or type(err).__name__)
        try:
            # On-demand checks take a slot; the loops of stores in use do not wait for them.
            async with self._slots if not keep else contextlib.nullcontext(), asyncio.timeout(self.timeout):
                await store.health_check()
        except TimeoutError:
            return False, f"health check of {url} did not complete within {self.timeout:g}s"
        except Exception as err:  # noqa: BLE001 - reported as the store's health
            return False, self.scrub(str(err) or type(err).__name__)
        return True, ""


async def check_delete(stores: Stores, url: str, prefix: str = "") -> None:
    """Gazette's on-demand delete probe of a store (FragmentStoreHealth ``check_delete``):
    write an object under ``prefix`` and remove it. Raises StoreError on failure."""
    store = stores.get(url)
    probe = getattr(store, "check_delete", None)
    if probe is None:
        raise StoreError(f"fragment store {url} does not support delete probes")
    await probe(prefix)

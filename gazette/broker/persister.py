"""The persister: uploads completed spools to their journal's store, and never drops one.

Invariants:

* Every completed, non-empty spool handed to :meth:`Persister.spool_complete` stays queued until
  it is persisted, or until its journal no longer exists (its spec lookup returns None), or its
  journal has no stores. A failed attempt is retried after an exponential backoff.
* A primary's spool is persisted at once. A replica's spool waits ``replica_delay`` seconds first:
  usually the primary has stored it by then and the replica's attempt finds it present (a no-op),
  but if the primary failed the replica's copy is what gets persisted. Gazette does the same.
* Spools go to the first store of the journal's spec. Only while finishing (shutdown), a store
  refusing us (:class:`StoreAuthError`) falls through to the next store, so that a broker with
  a misconfigured primary store can still drain.
* ``run()`` is a long-lived task owned by the caller's TaskGroup; uploads run as its child tasks,
  at most ``concurrency`` at a time. ``finish()`` persists everything pending regardless of
  delays, waits for it, and makes ``run()`` return.
* After a successful upload ``on_persisted`` receives the stored fragment (with backing store
  and mod time), so the owner can update the journal's index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from gazette.broker.spool import SpoolSnapshot
from gazette.fragment.errors import StoreAuthError, TemplateError
from gazette.fragment.fragment import Fragment
from gazette.fragment.stores import Stores
from gazette.protocol import protocol_pb2 as pb

__all__ = ["Persister", "eval_path_postfix"]

log = logging.getLogger(__name__)

SpecLookup = Callable[[str], pb.JournalSpec | None]
PostfixFn = Callable[[SpoolSnapshot, pb.JournalSpec], str]

_TEMPLATE_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_FORMAT_CALL = re.compile(r'\.Spool\.FirstAppendTime\.Format\s+"([^"]*)"')
# Go reference-time layout elements, longest first so "2006" wins over "06".
_GO_LAYOUT = [
    ("2006", "%Y"), ("01", "%m"), ("02", "%d"), ("15", "%H"), ("04", "%M"), ("05", "%S"),
    ("06", "%y"), ("Jan", "%b"), ("Mon", "%a"),
]  # fmt: skip


def eval_path_postfix(snapshot: SpoolSnapshot, spec: pb.JournalSpec) -> str:
    """Evaluate a JournalSpec's ``path_postfix_template`` for a completed spool.

    Supports literal text plus Gazette's documented form
    ``{{ .Spool.FirstAppendTime.Format "2006-01-02" }}`` (UTC), and ``{{ .Spool.Begin }}``,
    ``{{ .Spool.End }}``, ``{{ .Name }}``. Anything else raises :class:`TemplateError`.
    """
    template = spec.fragment.path_postfix_template
    if not template:
        return ""

    def action(m: re.Match[str]) -> str:
        expr = m.group(1)
        if fm := _FORMAT_CALL.fullmatch(expr):
            t = snapshot.first_append_time or 0.0
            when = datetime.fromtimestamp(t, UTC)
            return when.strftime(_go_layout_to_strftime(fm.group(1)))
        if expr == ".Spool.Begin":
            return str(snapshot.fragment.begin)
        if expr == ".Spool.End":
            return str(snapshot.fragment.end)
        if expr == ".Name":
            return spec.name
        raise TemplateError(f"unsupported path_postfix_template action {{{{{expr}}}}}")

    return _TEMPLATE_ACTION.sub(action, template)


def _go_layout_to_strftime(layout: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(layout):
        for go, py in _GO_LAYOUT:
            if layout.startswith(go, i):
                out.append(py)
                i += len(go)
                break
        else:
            out.append(layout[i].replace("%", "%%"))
            i += 1
    return "".join(out)


@dataclass(slots=True)
class _Pending:
    snapshot: SpoolSnapshot
    delay_until: float  # Replica spools: not before this (unless finishing or flushing).
    retry_at: float = 0.0  # After a failure: not before this, in any case.
    attempts: int = 0


class Persister:
    """Queue and uploader of completed spools (see the module docstring)."""

    def __init__(
        self,
        stores: Stores,
        spec_for: SpecLookup,
        *,
        on_persisted: Callable[[Fragment], None] | None = None,
        path_postfix: PostfixFn = eval_path_postfix,
        replica_delay: float = 120.0,
        backoff: tuple[float, float] = (1.0, 60.0),
        concurrency: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stores = stores
        self._spec_for = spec_for
        self._on_persisted = on_persisted
        self._path_postfix = path_postfix
        self._replica_delay = replica_delay
        self._backoff = backoff
        self._concurrency = concurrency
        self._clock = clock

        self._queue: list[_Pending] = []
        self._inflight = 0
        self._urgent = 0  # Count of flushers: while non-zero, replica delays are ignored.
        self._finishing = False
        self._running = False
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.persisted = 0  # Statistics: spools persisted (or found already present).
        self.failures = 0  # Statistics: failed attempts (each was retried).

    @property
    def pending(self) -> int:
        """Spools queued or being uploaded."""
        return len(self._queue) + self._inflight

    def spool_complete(self, snapshot: SpoolSnapshot) -> None:
        """Spool observer: queue a completed spool (cheap; call from the event loop)."""
        if snapshot.fragment.content_length == 0:
            return
        delay = 0.0 if snapshot.primary else self._replica_delay
        self._queue.append(_Pending(snapshot, self._clock() + delay))
        self._drained.clear()
        self._wakeup.set()

    async def run(self) -> None:
        """Serve the queue until :meth:`finish` has drained it."""
        if self._running:
            raise RuntimeError("Persister.run() is already running")
        self._running = True
        try:
            async with asyncio.TaskGroup() as tg:
                await self._serve(tg)
        finally:
            self._running = False

    async def finish(self) -> None:
        """Persist everything pending now (falling back across stores on auth errors), wait
        for it, and stop :meth:`run`. Runs the queue itself if ``run()`` is not running."""
        self._finishing = True
        self._wakeup.set()
        if not self._running:
            await self.run()
        else:
            await self._drained.wait()

    async def persist_all_and_wait(self) -> None:
        """Persist everything pending now, ignoring replica delays, and wait for it."""
        self._urgent += 1
        self._wakeup.set()
        try:
            if self._running:
                await self._drained.wait()
            else:
                await self._drain_inline()
        finally:
            self._urgent -= 1

    async def _drain_inline(self) -> None:
        self._running = True
        try:
            async with asyncio.TaskGroup() as tg:
                await self._serve(tg, until_drained=True)
        finally:
            self._running = False

    async def _serve(self, tg: asyncio.TaskGroup, until_drained: bool = False) -> None:
        while True:
            self._wakeup.clear()
            now = self._clock()
            urgent = self._urgent > 0 or self._finishing
            next_due: float | None = None
            for item in list(self._queue):
                due = item.retry_at if urgent else max(item.retry_at, item.delay_until)
                if due <= now and self._inflight < self._concurrency:
                    self._queue.remove(item)
                    self._inflight += 1
                    tg.create_task(self._attempt(item))
                elif due > now:
                    next_due = due if next_due is None else min(next_due, due)

            if not self._queue and not self._inflight:
                self._drained.set()
                if self._finishing or until_drained:
                    return
            timeout = None
            if next_due is not None and self._inflight < self._concurrency:
                timeout = max(0.0, next_due - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()

    async def _attempt(self, item: _Pending) -> None:
        try:
            fragment = await self._persist(item.snapshot)
        except Exception as err:
            item.attempts += 1
            self.failures += 1
            base, ceiling = self._backoff
            delay = min(ceiling, base * 2 ** (item.attempts - 1))
            item.retry_at = self._clock() + delay
            self._queue.append(item)
            log.warning(
                "failed to persist %s (attempt %d, retrying in %.1fs): %s",
                item.snapshot.fragment.content_name(), item.attempts, delay, err,
            )  # fmt: skip
        else:
            self.persisted += 1
            if fragment is not None and self._on_persisted is not None:
                self._on_persisted(fragment)
        finally:
            self._inflight -= 1
            self._wakeup.set()

    async def _persist(self, snapshot: SpoolSnapshot) -> Fragment | None:
        journal = snapshot.fragment.journal
        spec = self._spec_for(journal)
        if spec is None:
            log.info("dropping spool %s: journal %s was removed",
                     snapshot.fragment.content_name(), journal)  # fmt: skip
            return None
        urls = list(spec.fragment.stores)
        for i, url in enumerate(urls):
            try:
                store = self._stores.get(url)
                return await store.persist(snapshot, self._path_postfix(snapshot, spec))
            except StoreAuthError as err:
                if self._finishing and i + 1 < len(urls):
                    log.warning("store %s refused %s while finishing; trying %s: %s",
                                url, snapshot.fragment.content_name(), urls[i + 1], err)  # fmt: skip
                    continue
                raise
        return None  # A journal without stores keeps no fragments.

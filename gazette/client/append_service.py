"""The AppendService: many small appends, coalesced into few atomic Append RPCs per journal.

A writer asks for an :class:`AsyncAppend` of a journal (:meth:`AppendService.start_append`),
writes bytes to it and releases it; or calls :meth:`AppendService.append_nowait` /
:meth:`AppendService.append` to do all three with one record. Releases queue content; one task
per journal dispatches the queue as Append RPCs, one at a time, and while an RPC is in flight
further writes gather into the next batch. So a fast writer pays one RPC per round trip, not per
record. An ``AsyncAppend`` *is* a batch, shared by every writer whose content it holds, as in
Gazette: awaiting it (or ``done()`` and ``response``) reports the batch's outcome, whose
``commit`` fragment spans the whole batch.

Invariants:

* Per journal, content commits in the order it was written: releases of one writer, and of
  writers taking turns, land in the journal in call order, and batches dispatch strictly one
  after another (batch ``n + 1`` starts only once batch ``n`` resolved). Each batch is one
  Append RPC, so it commits wholly or not at all.
* Between ``start_append`` and ``release`` (or ``abort``) the writer holds the batch alone: a
  writer starting meanwhile on the same journal gets a new batch chained after it. ``abort``
  (or an exception inside ``with service.start_append(...)``) rolls back exactly the content
  written since ``start_append``.
* A failed RPC is retried with the same bytes in the same order, after a back-off, for
  transient failures (transport UNAVAILABLE and the like, routing statuses such as
  NOT_JOURNAL_PRIMARY_BROKER while brokers converge, a stream that ended without a status).
  Retrying an append whose response was lost may commit its content twice: appends are
  at-least-once, and message readers drop the duplicates by UUID. Permanent failures
  (JOURNAL_NOT_FOUND, NOT_ALLOWED, WRONG_APPEND_OFFSET, INDEX_HAS_GREATER_OFFSET,
  REGISTER_MISMATCH, FRAGMENT_STORE_UNHEALTHY, non-transient transport codes, or
  ``max_attempts`` exhausted) fail the batch's handles with that error.
* After a permanent failure, or a failed dependency, the journal is failed for the life of the
  service: every later append to it fails with the same error (Gazette's rule: content queued
  behind a hole must not commit as if the hole were not there).
* ``dependencies`` of an append (other ``AsyncAppend``\\s, or asyncio futures) must all
  succeed before its batch is dispatched. A batch waiting for them stays open to later content
  whose dependencies are among its own (none, typically: a transaction's messages queued
  behind the previous transaction's ACK share its RPC); appends with other dependencies or
  register options never share a batch.
* A batch keeps at most ``spill_threshold`` bytes in memory; beyond that its content goes
  to an unlinked temporary file and memory holds only a small write buffer. A batch takes no
  new writers past ``batch_cutoff`` bytes.
* Back-pressure: ``await append(...)`` and ``await wait_writable()`` suspend while the
  service holds ``max_buffered`` bytes or more not yet committed, and otherwise give the
  event loop a turn every ``yield_bytes`` written (so dispatch tasks progress under a writer
  that never suspends). ``append_nowait`` and ``start_append`` never suspend and so do not
  apply back-pressure themselves: callers check ``writable`` now and then.
* The hot path (``append_nowait`` to a journal whose batch is open) is a dict lookup, a
  ``bytearray`` extend and two integer updates: no allocation, task or await per record.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from types import TracebackType
from typing import IO, Any, Final

import grpc

from gazette.client.appender import MAX_CHUNK, Appender, Content
from gazette.client.errors import (
    BrokerStatusError,
    ClientError,
    ResponseValidationError,
    TransportError,
)
from gazette.client.journal_client import JournalClient
from gazette.client.reader import backoff as default_backoff
from gazette.errors import ValidationError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "AppendRPC",
    "AppendService",
    "AppendServiceClosed",
    "AsyncAppend",
    "Dependency",
    "DependencyFailed",
    "PERMANENT_STATUSES",
    "send_append",
]

log = logging.getLogger(__name__)

KiB: Final = 1 << 10
MiB: Final = 1 << 20

#: A batch this large takes no new writers (Gazette's appendBufferCutoff).
DEFAULT_BATCH_CUTOFF: Final = 64 * MiB
#: Bytes of a batch kept in memory before its content moves to a temporary file.
DEFAULT_SPILL_THRESHOLD: Final = 4 * MiB
#: Uncommitted bytes past which ``append``/``wait_writable`` suspend writers.
DEFAULT_MAX_BUFFERED: Final = 256 * MiB
#: Bytes written between two turns given to the event loop by ``append``/``wait_writable``.
DEFAULT_YIELD_BYTES: Final = 64 * KiB
# Once a batch has spilled, writes gather in memory up to this size between file writes.
_SPILL_WRITE: Final = 256 * KiB

#: Append statuses no retry can fix (as in Gazette's AppendService).
PERMANENT_STATUSES: Final = frozenset({
    pb.FRAGMENT_STORE_UNHEALTHY,
    pb.INDEX_HAS_GREATER_OFFSET,
    pb.JOURNAL_NOT_FOUND,
    pb.NOT_ALLOWED,
    pb.REGISTER_MISMATCH,
    pb.WRONG_APPEND_OFFSET,
})

#: Sends one Append RPC: the request (journal and options), then the content chunks, then
#: commit. Returns the OK response or raises a ClientError. ``content`` may be iterated
#: again by a retry, yielding the same bytes.
AppendRPC = Callable[[pb.AppendRequest, Iterable[Content]], Awaitable[pb.AppendResponse]]


class AppendServiceClosed(ClientError):
    """The AppendService was closed (or aborted) before the append could commit."""


class DependencyFailed(ClientError):
    """A dependency of the append (or of an earlier append to its journal) failed."""


async def send_append(client: JournalClient, request: pb.AppendRequest,
                      content: Iterable[Content]) -> pb.AppendResponse:
    """One Append RPC of ``content`` with ``request``'s journal and options (no retries)."""
    app = Appender(
        client, request.journal,
        check_registers=request.check_registers if request.HasField("check_registers") else None,
        union_registers=request.union_registers if request.HasField("union_registers") else None,
        subtract_registers=(request.subtract_registers
                            if request.HasField("subtract_registers") else None),
        offset=request.offset, suspend=request.suspend, do_not_proxy=request.do_not_proxy)
    try:
        for chunk in content:
            await app.write(chunk)
        return await app.commit()
    except BaseException as err:
        failed = err  # aborted below: compiled, a coroutine must not suspend in a handler
    await app.abort()
    raise failed


def is_permanent(err: ClientError) -> bool:
    """Whether a failed append must not be retried."""
    if isinstance(err, BrokerStatusError):
        return err.status in PERMANENT_STATUSES
    if isinstance(err, TransportError):
        return not err.transient
    return isinstance(err, ValidationError | ResponseValidationError | AppendServiceClosed)


class AsyncAppend:
    """A batch of content for one journal, dispatched as one Append RPC by an AppendService.

    Returned by :meth:`AppendService.start_append` (and the ``append`` helpers) to every
    writer whose content it holds. Awaiting it returns the batch's ``AppendResponse`` once
    committed, or raises why it failed; awaiting is shielded, so cancelling one waiter does not
    cancel the append.

    ``write`` is valid only between ``start_append`` and ``release``/``abort`` (the writer then
    holds the batch alone). As a context manager it releases on success and aborts (rolling
    back what was written since ``start_append``) on an exception.
    """

    __slots__ = (
        "__weakref__", "_buf", "_checkpoint", "_closed", "_file", "_file_size", "_future",
        "_held", "_key", "_released", "_service", "_spill_at", "dependencies", "journal",
        "request",
    )

    def __init__(self, service: AppendService, request: pb.AppendRequest, key: bytes | None,
                 dependencies: frozenset[Dependency]) -> None:
        self._service = service
        self.request = request
        self.journal = request.journal
        self._key = key
        self.dependencies = dependencies
        self._buf = bytearray()
        self._file: IO[bytes] | None = None
        self._file_size = 0
        # len(_buf) at which _overflow must run (spill to file, or close to new writers).
        self._spill_at = min(service._spill_threshold, service._batch_cutoff)
        self._checkpoint = 0  # Size at the last release: abort rolls back to it.
        self._held = False
        self._closed = False  # Taken for dispatch: no more writers.
        self._released = False  # Some writer released content (or an empty append) into it.
        self._future: asyncio.Future[pb.AppendResponse] = (
            asyncio.get_running_loop().create_future())
        # A failed batch nobody awaited must not warn at garbage collection: the service
        # logged the failure already, and later appends to the journal fail with it.
        self._future.add_done_callback(_retrieve)

    # --- writing ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes queued in this batch (including an unreleased writer's)."""
        return self._file_size + len(self._buf)

    def write(self, data: Content) -> int:
        """Queue ``data`` (not yet released); returns its length."""
        if not self._held:
            raise ClientError(f"append to {self.journal!r}: write without start_append "
                              "(or after release)")
        buf = self._buf
        buf += data
        if len(buf) >= self._spill_at:
            self._overflow()
        return len(data)

    def release(self) -> None:
        """Queue what was written since ``start_append`` for dispatch."""
        if not self._held:
            raise ClientError(f"append to {self.journal!r} released twice")
        size = self.size
        svc = self._service
        svc._budget -= size - self._checkpoint
        self._checkpoint = size
        self._held = False
        self._released = True
        svc._on_release(self)

    def abort(self) -> None:
        """Roll back what was written since ``start_append`` and release the batch."""
        if not self._held:
            raise ClientError(f"append to {self.journal!r}: abort without start_append")
        self._truncate(self._checkpoint)
        self._held = False
        self._service._on_release(self)

    def __enter__(self) -> AsyncAppend:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._held:
            return  # Released or aborted explicitly inside the block.
        if et is None:
            self.release()
        else:
            self.abort()

    def _overflow(self) -> None:
        """Spill the memory buffer to the temporary file, and close a full batch."""
        svc = self._service
        if self.size >= svc._batch_cutoff and svc._open.get(self.journal) is self:
            del svc._open[self.journal]  # Later writers chain a new batch.
        if self._file is not None or len(self._buf) >= svc._spill_threshold:
            if self._file is None:
                # Unbuffered, so chunks() can pread everything written.
                self._file = tempfile.TemporaryFile(prefix="gazette-append-", dir=svc._temp_dir,
                                                    buffering=0)
            with memoryview(self._buf) as view:
                done = 0
                while done < len(view):
                    done += self._file.write(view[done:]) or 0
            self._file_size += len(self._buf)
            self._buf.clear()
        self._set_spill_at()

    def _set_spill_at(self) -> None:
        svc = self._service
        room = svc._batch_cutoff - self._file_size  # len(_buf) at which the cutoff is reached
        cap = _SPILL_WRITE if self._file is not None else svc._spill_threshold
        self._spill_at = min(cap, room) if room > len(self._buf) else cap

    def _truncate(self, size: int) -> None:
        if size >= self._file_size:
            del self._buf[size - self._file_size:]
        else:
            assert self._file is not None
            self._buf.clear()
            self._file.truncate(size)
            self._file.seek(size)
            self._file_size = size
        self._set_spill_at()

    def chunks(self) -> Iterator[memoryview]:
        """The batch's content in chunks of at most MAX_CHUNK bytes (re-iterable by retries)."""
        if self._file is not None:
            fd = self._file.fileno()
            for pos in range(0, self._file_size, MAX_CHUNK):
                data = os.pread(fd, min(MAX_CHUNK, self._file_size - pos), pos)
                if not data:
                    raise ClientError(f"append to {self.journal!r}: spill file truncated")
                yield memoryview(data)
        # A dispatched batch takes no more writes, so its buffer is stable while viewed.
        view = memoryview(self._buf)
        for pos in range(0, len(view), MAX_CHUNK):
            yield view[pos:pos + MAX_CHUNK]

    def _discard(self) -> None:
        self._buf = bytearray()
        if self._file is not None:
            self._file.close()
            self._file = None

    # --- outcome -------------------------------------------------------------------------

    def done(self) -> bool:
        """Whether the batch resolved (committed or failed)."""
        return self._future.done()

    @property
    def response(self) -> pb.AppendResponse | None:
        """The broker's response once committed; None before, or if it failed."""
        f = self._future
        if f.done() and not f.cancelled() and f.exception() is None:
            return f.result()
        return None

    def exception(self) -> BaseException | None:
        """Why the batch failed, once done (None if it committed)."""
        if not self._future.done():
            raise asyncio.InvalidStateError(f"append to {self.journal!r} is not done yet")
        return self._future.exception()

    def __await__(self) -> Generator[Any, None, pb.AppendResponse]:
        return asyncio.shield(self._future).__await__()

    def __repr__(self) -> str:
        state = ("held" if self._held else "dispatching" if self._closed
                 else "done" if self.done() else "open")
        return f"<AsyncAppend {self.journal!r} {self.size} bytes, {state}>"


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


#: What an append may depend on: another AsyncAppend, or any asyncio future.
Dependency = AsyncAppend | asyncio.Future[Any]
_NO_DEPS: Final[frozenset[Dependency]] = frozenset()


class _Journal:
    """The queue of one journal: unresolved batches in order; [0] is next or in flight."""

    __slots__ = ("error", "name", "queue", "released", "task")

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: deque[AsyncAppend] = deque()
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.released = asyncio.Event()  # Set when a writer releases the head batch.


class AppendService:
    """Batches, orders, dispatches and retries appends; see the module documentation.

    Use as an async context manager (or call :meth:`close`): leaving it waits for every queued
    append to resolve, or, when leaving on an exception, fails them.

    ``rpc`` replaces the Append RPC (for tests); ``backoff``/``sleep`` pace retries;
    ``max_attempts`` > 0 bounds the attempts per batch (0: retry transient failures forever,
    as Gazette does).
    """

    def __init__(self, client: JournalClient | None, *,
                 batch_cutoff: int = DEFAULT_BATCH_CUTOFF,
                 spill_threshold: int = DEFAULT_SPILL_THRESHOLD,
                 max_buffered: int = DEFAULT_MAX_BUFFERED,
                 yield_bytes: int = DEFAULT_YIELD_BYTES,
                 max_attempts: int = 0,
                 backoff: Callable[[int], float] = default_backoff,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 rpc: AppendRPC | None = None,
                 temp_dir: str | None = None) -> None:
        if min(batch_cutoff, spill_threshold, max_buffered, yield_bytes) <= 0:
            raise ValueError("AppendService sizes must be positive")
        if rpc is None:
            if client is None:
                raise ValueError("an AppendService needs a JournalClient or an rpc")
            bound = client

            async def default_rpc(request: pb.AppendRequest,
                                  content: Iterable[Content]) -> pb.AppendResponse:
                return await send_append(bound, request, content)

            rpc = default_rpc
        self.client = client
        self._rpc = rpc
        self._batch_cutoff = batch_cutoff
        self._spill_threshold = spill_threshold
        self._max_buffered = max_buffered
        self._yield_bytes = min(yield_bytes, max_buffered)
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._sleep = sleep
        self._temp_dir = temp_dir
        self._journals: dict[str, _Journal] = {}
        # Per journal, its tail batch when any writer may extend it directly (not held,
        # not dispatching, default request options, under the cutoff).
        self._open: dict[str, AsyncAppend] = {}
        self._budget = self._yield_bytes  # Bytes left before writers must wait_writable().
        self._resolved = asyncio.Event()  # Set whenever a batch resolves (for back-pressure).
        self._closing = False
        self.retries = 0  # Failed attempts that were retried (for tests and metrics).

    # --- starting appends ------------------------------------------------------------------

    def start_append(self, journal: str, dependencies: Iterable[Dependency] = (), *,
                     check_registers: pb.LabelSelector | None = None,
                     union_registers: pb.LabelSet | None = None,
                     subtract_registers: pb.LabelSet | None = None) -> AsyncAppend:
        """The batch to write ``journal`` content into, held by the caller until released.

        Never suspends. The batch is dispatched only after every dependency succeeded, with
        the given register options (appends with different options never share a batch).
        """
        if self._closing:
            raise AppendServiceClosed(f"append to {journal!r}: the AppendService is closed")
        if not journal:
            raise ValidationError("journal", "an append needs a journal name")
        deps = frozenset(dependencies) if dependencies else _NO_DEPS
        key: bytes | None = None
        if check_registers is not None or union_registers is not None or \
                subtract_registers is not None:
            request = pb.AppendRequest(journal=journal)
            if check_registers is not None:
                request.check_registers.CopyFrom(check_registers)
            if union_registers is not None:
                request.union_registers.CopyFrom(union_registers)
            if subtract_registers is not None:
                request.subtract_registers.CopyFrom(subtract_registers)
            key = request.SerializeToString(deterministic=True)
        j = self._journals.get(journal)
        if j is None:
            j = self._journals[journal] = _Journal(journal)
        tail = j.queue[-1] if j.queue else None
        if (tail is None or tail._held or tail._closed or tail._key != key
                or tail.size >= self._batch_cutoff or not deps <= tail.dependencies):
            if key is None:
                request = pb.AppendRequest(journal=journal)
            tail = AsyncAppend(self, request, key, deps)
            j.queue.append(tail)
            if j.task is None:
                j.task = asyncio.get_running_loop().create_task(
                    self._serve(j), name=f"append-service {journal}")
        if self._open.get(journal) is tail:
            del self._open[journal]
        tail._held = True
        return tail

    def append_nowait(self, journal: str, data: Content) -> AsyncAppend:
        """Queue ``data`` for ``journal`` as one record; returns its batch. Never suspends."""
        b = self._open.get(journal)
        if b is None:
            b = self.start_append(journal)
            b.write(data)
            b.release()
            return b
        buf = b._buf
        buf += data
        if len(buf) >= b._spill_at:
            b._overflow()
        self._budget -= len(data)
        return b

    async def append(self, journal: str, data: Content) -> AsyncAppend:
        """Queue ``data`` for ``journal``, then apply back-pressure; returns its batch
        (await that for the commit). The content is queued before the first suspension."""
        b = self.append_nowait(journal, data)
        if self._budget <= 0:
            await self.wait_writable()
        return b

    # --- back-pressure ---------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False once writers should ``await wait_writable()``."""
        return self._budget > 0

    @property
    def buffered(self) -> int:
        """Bytes queued and not yet committed (or failed), across journals."""
        return sum(b.size for j in self._journals.values() for b in j.queue)

    async def wait_writable(self) -> None:
        """Give the event loop a turn, and wait while ``max_buffered`` bytes or more are
        uncommitted."""
        await asyncio.sleep(0)
        while (buffered := self.buffered) >= self._max_buffered:
            self._resolved.clear()
            await self._resolved.wait()
        self._budget = min(self._yield_bytes, self._max_buffered - buffered)

    # --- barriers, flush and close ---------------------------------------------------------

    def pending_except(self, journal: str = "") -> list[Dependency]:
        """The unresolved appends of every journal but ``journal`` (all with ""), plus a
        failed future per failed journal: as ``dependencies`` of an append, a barrier making
        it wait until everything queued elsewhere so far has committed."""
        loop = asyncio.get_running_loop()
        out: list[Dependency] = []
        for name, j in self._journals.items():
            if name == journal:
                continue
            if j.queue:
                out.append(j.queue[-1])  # Batches resolve in order: the tail is the last.
            elif j.error is not None:
                failed = loop.create_future()
                failed.set_exception(j.error)
                failed.add_done_callback(_retrieve)
                out.append(failed)
        return out

    async def flush(self) -> None:
        """Wait until every append queued so far has resolved; raises the first failure."""
        futs = [asyncio.ensure_future(d._future if isinstance(d, AsyncAppend) else d)
                for d in self.pending_except("")]
        if futs:
            await asyncio.wait(futs)
        for fut in futs:
            err = DependencyFailed("cancelled") if fut.cancelled() else fut.exception()
            if err is not None:
                raise err

    async def close(self) -> None:
        """Refuse new appends, wait for the queued ones (raising the first failure), stop.

        A batch still held by a writer (started, not yet released) is waited for."""
        self._closing = True
        self._open.clear()  # New appends go through start_append, which refuses them.
        failed: BaseException | None = None
        try:
            await self.flush()
        except BaseException as err:  # raised once stopped, outside the handler (compiled,
            failed = err  # a coroutine must not suspend in one)
        await self._stop(AppendServiceClosed("the AppendService closed before this "
                                             "append was dispatched"))
        if failed is not None:
            raise failed

    async def abort(self) -> None:
        """Stop now: queued appends that have not committed fail with AppendServiceClosed."""
        self._closing = True
        await self._stop(AppendServiceClosed("the AppendService was aborted before this "
                                             "append committed"))

    async def __aenter__(self) -> AppendService:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        if et is None:
            await self.close()
        else:
            await self.abort()

    async def _stop(self, reason: ClientError) -> None:
        tasks = [j.task for j in self._journals.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        # Each _serve fails its unresolved batches as it unwinds from the cancellation.
        await asyncio.gather(*tasks, return_exceptions=True)
        for j in self._journals.values():
            self._fail_queue(j, reason)
        self._open.clear()

    # --- dispatch ----------------------------------------------------------------------------

    def _on_release(self, b: AsyncAppend) -> None:
        if b._future.done():
            return  # The service stopped while the writer held it: it failed already.
        j = self._journals[b.journal]
        if (j.queue[-1] is b and not b._closed and b._key is None
                and b.size < self._batch_cutoff):
            self._open[b.journal] = b
        if j.queue[0] is b:
            j.released.set()

    async def _serve(self, j: _Journal) -> None:
        """Dispatches ``j``'s batches in order until its queue is empty."""
        try:
            while j.queue:
                b = j.queue[0]
                while True:
                    while b._held:
                        j.released.clear()
                        await j.released.wait()
                    # Open while its dependencies are pending: later content with no other
                    # dependency joins it rather than queueing one more RPC behind it (it
                    # could not be written sooner, and fails with it just the same).
                    dep = _pending_dependency(b)
                    if dep is None or j.error is not None:
                        break
                    await asyncio.wait((dep,))  # Never cancels it, nor raises its error.
                b._closed = True
                if self._open.get(j.name) is b:
                    del self._open[j.name]
                try:
                    resp = await self._resolve(j, b)
                except Exception as err:  # noqa: BLE001 - whatever it is, the handles carry it
                    if j.error is not err:
                        j.error = err
                        log.warning("append to %s failed: %s; later appends to it fail too",
                                    j.name, err)
                    b._future.set_exception(err)
                else:
                    b._future.set_result(resp)
                j.queue.popleft()
                b._discard()
                self._resolved.set()
        except asyncio.CancelledError:
            self._fail_queue(j, AppendServiceClosed(
                f"append to {j.name!r}: the AppendService stopped before it committed"))
            raise
        finally:
            j.task = None

    async def _resolve(self, j: _Journal, b: AsyncAppend) -> pb.AppendResponse:
        if j.error is not None:
            raise j.error
        for dep in b.dependencies:  # all resolved: _serve waited for them
            fut = _future_of(dep)
            if fut.cancelled():
                raise DependencyFailed(f"append to {j.name!r}: a dependency was cancelled")
            if (cause := fut.exception()) is not None:
                raise DependencyFailed(f"append to {j.name!r}: dependency failed: {cause}") \
                    from cause
        if b.size == 0 and not b._released:
            return pb.AppendResponse(status=pb.OK)  # Only aborted writers: nothing to send.
        attempt = 0
        while True:
            err: ClientError
            try:
                return await self._rpc(b.request, _Chunks(b))
            except ClientError as e:
                err = e
            except grpc.aio.AioRpcError as rpc_err:  # From an rpc seam that did not map it.
                err = TransportError(rpc_err.code(), rpc_err.details() or "", "", j.name)
            if is_permanent(err) or (self._max_attempts and attempt + 1 >= self._max_attempts):
                raise err
            self.retries += 1
            log.log(logging.WARNING if attempt else logging.INFO,
                    "append to %s failed (attempt %d, will retry): %s", j.name, attempt + 1, err)
            await self._sleep(self._backoff(attempt))
            attempt += 1

    def _fail_queue(self, j: _Journal, reason: ClientError) -> None:
        while j.queue:
            b = j.queue.popleft()
            if not b._future.done():
                b._future.set_exception(reason)
            b._discard()
        if self._open.get(j.name) is not None:
            del self._open[j.name]
        self._resolved.set()


class _Chunks:
    """A batch's content as a re-iterable of chunks (each retry reads it afresh)."""

    __slots__ = ("_batch",)

    def __init__(self, batch: AsyncAppend) -> None:
        self._batch = batch

    def __iter__(self) -> Iterator[memoryview]:
        return self._batch.chunks()


def _future_of(dep: Dependency) -> asyncio.Future[Any]:
    return dep._future if isinstance(dep, AsyncAppend) else dep


def _pending_dependency(b: AsyncAppend) -> asyncio.Future[Any] | None:
    """A dependency of ``b`` not yet resolved (None: all are)."""
    return next((f for f in map(_future_of, b.dependencies) if not f.done()), None)

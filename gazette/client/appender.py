"""Appending to journals: ``Appender`` (one Append RPC) and ``append`` (with retries).

Invariants:
- An Append RPC is: one request naming the journal (and its options: register checks,
  register updates, expected offset, suspension), then content chunks, then an empty
  request which commits. Closing the stream without that empty request, or cancelling
  it, aborts: nothing of the content commits.
- Appends are routed to the journal's primary when its route is known; any broker
  proxies otherwise. The response header updates the route cache.
- A non-OK response status raises ``AppendError`` naming the status (and, for
  REGISTER_MISMATCH, the selector and the journal's registers); the response is kept on
  the exception and on ``Appender.response``.
- ``append`` retries transport failures and routing statuses only when the content can be
  sent again: bytes-like content, a sequence of chunks, or a one-shot iterable of which
  nothing was consumed yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, cast

import grpc

from gazette.client.errors import (
    ROUTING_STATUSES,
    AppendError,
    ClientError,
    TransportError,
)
from gazette.client.journal_client import JournalClient, rpc_error
from gazette.client.reader import backoff
from gazette.errors import ValidationError
from gazette.protocol import protocol_pb2 as pb

# Content is sent in chunks of at most this size: large enough to keep per-message
# overhead negligible, well under the 16 MiB message limit.
MAX_CHUNK = 1 << 20

ONE_SHOT_BYTES = 8 << 20
"""``append`` sends content up to this size as one batch of request messages (a copy of it
in messages at once); larger content streams a message at a time."""

Content = bytes | bytearray | memoryview


def _labels_text(labels: pb.LabelSet) -> str:
    return ", ".join(f"{lb.name}={lb.value}" for lb in labels.labels) or "<none>"


def _selector_text(sel: pb.LabelSelector) -> str:
    parts = [f"{lb.name}={lb.value}" for lb in sel.include.labels]
    parts += [f"{lb.name}!={lb.value}" for lb in sel.exclude.labels]
    return ", ".join(parts) or "<empty>"


class Appender:
    """One Append RPC: ``write`` content, then ``commit`` (or ``abort``)."""

    def __init__(self, client: JournalClient, journal: str, *,
                 check_registers: pb.LabelSelector | None = None,
                 union_registers: pb.LabelSet | None = None,
                 subtract_registers: pb.LabelSet | None = None,
                 offset: int = 0,
                 suspend: int = pb.AppendRequest.SUSPEND_RESUME,
                 do_not_proxy: bool = False, eager: bool = False) -> None:
        if not journal:
            raise ValidationError("journal", "an append needs a journal name")
        self.client = client
        self.request = pb.AppendRequest(journal=journal, offset=offset, do_not_proxy=do_not_proxy,
                                        suspend=suspend)  # type: ignore[arg-type]
        if check_registers is not None:
            self.request.check_registers.CopyFrom(check_registers)
        if union_registers is not None:
            self.request.union_registers.CopyFrom(union_registers)
        if subtract_registers is not None:
            self.request.subtract_registers.CopyFrom(subtract_registers)
        self.response: pb.AppendResponse | None = None
        self.endpoint = ""
        self.written = 0  # Content bytes handed to the stream.
        self._call: Any = None
        self._finished = False
        # Send the request as it commits rather than with whatever else this turn of the event
        # loop writes: a lone append (a recovery-log commit) then does not wait behind its
        # caller's next stretch of work; many appends in one turn (an AppendService's journals)
        # are better left to share one send.
        self._eager = eager

    @property
    def journal(self) -> str:
        return self.request.journal

    async def write(self, data: Content) -> None:
        """Stream ``data`` (split into chunks of at most MAX_CHUNK bytes)."""
        if self._finished:
            raise ClientError(f"append to {self.journal!r} is already committed or aborted")
        if len(data) == 0:
            return  # An empty chunk would commit.
        await self._start()
        view = memoryview(data)
        for start in range(0, len(view), MAX_CHUNK):
            chunk = bytes(view[start:start + MAX_CHUNK])
            try:
                await self._call.write(pb.AppendRequest(content=chunk))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                # The RPC ended early: its outcome (a status or a transport error) says why.
                await self._finish()
                raise ClientError(f"append to {self.journal!r} ended before commit "
                                  "without an error status") from None
            self.written += len(chunk)

    async def commit(self) -> pb.AppendResponse:
        """Commit everything written; returns the broker's response (status OK)."""
        if self._finished:
            raise ClientError(f"append to {self.journal!r} is already committed or aborted")
        await self._start()
        try:
            await self._call.write(pb.AppendRequest())
            await self._call.done_writing()
            self._send_now()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # The outcome is read just below.
        return await self._finish()

    async def commit_all(self, chunks: Sequence[Content]) -> pb.AppendResponse:
        """Writes ``chunks`` and commits, as one call whose request messages are all at hand:
        connected, they leave at once, without an await (and a task switch) per message."""
        if self._finished or self._call is not None:
            raise ClientError(f"append to {self.journal!r} has already started")
        reqs = [self.request]
        total = 0
        for data in chunks:
            n = len(data)
            if n <= MAX_CHUNK and isinstance(data, bytes):
                if n:
                    reqs.append(pb.AppendRequest(content=data))
            else:
                view = memoryview(data)
                for start in range(0, n, MAX_CHUNK):
                    reqs.append(pb.AppendRequest(content=bytes(view[start:start + MAX_CHUNK])))
            total += n
        reqs.append(pb.AppendRequest())
        self.endpoint = self.client.endpoint_for(self.journal, require_primary=True)
        self._call = self.client.stub(self.endpoint).Append(iter(reqs))
        self.written = total
        self._send_now()
        return await self._finish()

    def _send_now(self) -> None:
        """With ``eager``, sends what the call has written at once (our transport's calls;
        grpcio's send as they go)."""
        if self._eager and (flush := getattr(self._call, "flush", None)) is not None:
            flush()

    async def abort(self) -> None:
        """Roll back: nothing written commits."""
        self._finished = True
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def __aenter__(self) -> Appender:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        if et is None and not self._finished:
            await self.commit()
        elif not self._finished:
            await self.abort()

    async def _start(self) -> None:
        if self._call is not None:
            return
        self.endpoint = self.client.endpoint_for(self.journal, require_primary=True)
        self._call = self.client.stub(self.endpoint).Append()
        try:
            await self._call.write(self.request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            await self._finish()

    async def _finish(self) -> pb.AppendResponse:
        self._finished = True
        call, self._call = self._call, None
        try:
            resp: pb.AppendResponse = await call
        except grpc.aio.AioRpcError as err:
            self.client.note_failure(self.journal, self.endpoint)
            raise rpc_error(err, self.endpoint, self.journal) from None
        self.response = resp
        if resp.HasField("header"):
            self.client.update_route(self.journal, resp.header.route)
        if resp.status == pb.OK:
            return resp
        detail = ""
        if resp.status == pb.REGISTER_MISMATCH:
            detail = (f"selector {_selector_text(self.request.check_registers)} doesn't match "
                      f"registers {_labels_text(resp.registers)}")
        elif resp.status == pb.WRONG_APPEND_OFFSET:
            detail = f"expected offset {self.request.offset}"
        elif resp.status == pb.FRAGMENT_STORE_UNHEALTHY:
            detail = resp.store_health_error
        raise AppendError(resp.status, self.journal, detail, resp)


def _retryable(err: ClientError) -> bool:
    if isinstance(err, TransportError):
        return bool(err.code == grpc.StatusCode.UNAVAILABLE)
    return isinstance(err, AppendError) and err.status in ROUTING_STATUSES


async def append(client: JournalClient, journal: str,
                 data: Content | Iterable[Content] | AsyncIterable[Content] | None = None, *,
                 check_registers: pb.LabelSelector | None = None,
                 union_registers: pb.LabelSet | None = None,
                 subtract_registers: pb.LabelSet | None = None,
                 offset: int = 0,
                 suspend: int = pb.AppendRequest.SUSPEND_RESUME,
                 max_attempts: int = 0,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 ) -> pb.AppendResponse:
    """Append ``data`` to ``journal`` as one atomic append; returns the OK response.

    Retries (with back-off, up to ``max_attempts`` if > 0) on UNAVAILABLE and routing
    statuses while the content can be replayed; raises ``AppendError`` or
    ``TransportError`` otherwise. The request is sent as it commits (``eager``)."""
    replayable: Sequence[Content] | None
    source: Iterable[Content] | AsyncIterable[Content] | None = None
    if data is None:
        replayable = ()
    elif isinstance(data, bytes | bytearray | memoryview):
        replayable = (data,)
    elif isinstance(data, Sequence):
        replayable = cast(Sequence[Content], data)
    else:
        replayable, source = None, data

    pulled = False  # Whether anything was taken from a one-shot ``source``.
    attempt = 0
    while True:
        app = Appender(client, journal, check_registers=check_registers,
                       union_registers=union_registers, subtract_registers=subtract_registers,
                       offset=offset, suspend=suspend, eager=True)
        try:
            if replayable is not None and sum(len(c) for c in replayable) <= ONE_SHOT_BYTES:
                return await app.commit_all(replayable)
            if replayable is not None:
                for chunk in replayable:
                    await app.write(chunk)
            elif isinstance(source, AsyncIterable):
                async for chunk in source:
                    pulled = True
                    await app.write(chunk)
            elif source is not None:
                for chunk in source:
                    pulled = True
                    await app.write(chunk)
            return await app.commit()
        except ClientError as err:
            await app.abort()
            if pulled or not _retryable(err) or (max_attempts and attempt + 1 >= max_attempts):
                raise
        except BaseException:
            await app.abort()
            raise
        await sleep(backoff(attempt))
        attempt += 1

"""The server side of :mod:`gazette.rpc`: grpcio's servicers, served on our own HTTP/2.

:class:`RpcServer` accepts what grpcio's generated ``add_*Servicer_to_server`` functions
register (generic and registered method handlers), so a servicer written for ``grpc.aio``
runs unchanged: ``async def`` methods taking a request (or an async iterator of requests)
and a context, returning a response or yielding responses, calling ``context.abort``.

Invariants:

* Each RPC runs in its own task. A stream reset by the client, a lost connection or an
  elapsed ``grpc-timeout`` cancels that task (so ``finally`` blocks and rollbacks run);
  nothing else does until :meth:`RpcServer.stop`'s grace period ends.
* Every stream gets exactly one end: trailers carrying ``grpc-status`` (OK, the code passed
  to ``abort``, UNKNOWN for an exception the servicer let escape, DEADLINE_EXCEEDED, or,
  for what the client got wrong, as grpc-go and grpc-java answer: UNIMPLEMENTED for an
  unknown method or a compressed message, with ``grpc-accept-encoding: identity``;
  INVALID_ARGUMENT for a request that does not deserialize; INTERNAL for a message cut short
  by the end of the stream or a second message on a unary call; RESOURCE_EXHAUSTED for a
  message or header list over its limit), or an RST_STREAM (PROTOCOL_ERROR for a malformed
  request, RFC 9113 8.1.1). A failing servicer never takes the connection or the server down.
* After ``stop()`` begins, connections get GOAWAY: RPCs already started run to their end
  (up to the grace period), new streams are refused.
* A client-streaming method with a :class:`BatchServicer` (``add_batch_servicer``) is started
  once the frames of the read that opened it are handled: the calls whose whole request
  stream arrived in that read are handed to the servicer together (``group_key`` groups
  them; a group of two or more runs in one task, ``serve_group``), every other call runs in
  its own task as above. Each call of a group still gets exactly one end; a reset or an
  elapsed deadline ends that call alone (its answer is dropped), not the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Protocol, cast

import grpc
import grpc.aio

from gazette.errors import GazetteError, incident
from gazette.rpc import frames as f
from gazette.rpc.connection import (
    CALM_BURST,
    CALM_RATE,
    DEFAULT_MAX_MESSAGE,
    MAX_HEADER_LIST_SIZE,
    Connection,
    RateLimit,
    Stream,
    StreamReset,
)
from gazette.tasks import Supervisor

log = logging.getLogger(__name__)

#: Streams one client connection may have open at once (advertised in SETTINGS). Brokers
#: multiplex a replication stream per journal on one peer connection: generous, but bounded.
MAX_CONCURRENT_STREAMS = 8192
#: Seconds a new connection has to send the whole client preface.
PREFACE_TIMEOUT = 10.0
#: Request data all connections together may hold unconsumed: over it, a connection holding
#: more than its share (MAX_BUFFERED / connections) is granted no more connection window (flow
#: control) until it holds less. Each connection is bounded by itself too
#: (connection.CONNECTION_BUFFER_CAP + CONNECTION_WINDOW).
MAX_BUFFERED = 256 << 20
#: A connection with no RPC for about this many seconds is sent GOAWAY and closed (clients
#: dial again when they next call).
IDLE_TIMEOUT = 300.0
GOAWAY_LINGER = 1.0
"""Seconds a connection ended by an error keeps reading (and discarding) after its GOAWAY."""


class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class ServicerContext:
    """The subset of ``grpc.aio.ServicerContext`` our servicers use, and a little more."""

    __slots__ = ("_stream", "_metadata", "_deadline", "code", "details")

    def __init__(self, stream: ServerStream, metadata: tuple[tuple[str, str], ...], deadline: float | None) -> None:
        self._stream = stream
        self._metadata = metadata
        self._deadline = deadline
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        if code is grpc.StatusCode.OK:
            raise ValueError("abort with OK")
        self.code, self.details = code, details
        # grpc's own class, not a subclass defined here: compiled by mypyc, a subclass of
        # this Cython-defined exception crashed the process (SIGSEGV) once raised.
        raise grpc.aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def peer(self) -> str:
        return self._stream.conn.peer()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._stream.conn.loop.time())

    def cancelled(self) -> bool:
        return self._stream.error is not None

    def done(self) -> bool:
        return self._stream.local_closed

    async def write(self, message: Any) -> None:
        await self._stream.send_response(message)

    async def read(self) -> Any:
        msg = await self._stream.next_request()
        return grpc.aio.EOF if msg is None else msg


class _Requests:
    """The async iterator of a streaming request (deserialized as they are taken)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: ServerStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        msg = await self._stream.next_request()
        if msg is None:
            raise StopAsyncIteration
        return msg

    def ready(self) -> bool:
        """Whether the next request (or the stream's end) is already here: taking it will not
        wait on the client."""
        s = self._stream
        return bool(s.messages) or s.remote_closed or s.error is not None


class BufferedRequests:
    """The async iterator of a streaming request whose messages were all received and decoded
    before its call started (a call of a batched method served alone). A message that did not
    decode is its :class:`BadRequest`, raised when it is reached."""

    __slots__ = ("_items", "_next")

    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self._next = 0

    def __aiter__(self) -> BufferedRequests:
        return self

    async def __anext__(self) -> Any:
        i = self._next
        if i >= len(self._items):
            raise StopAsyncIteration
        self._next = i + 1
        item = self._items[i]
        if isinstance(item, BadRequest):
            raise item
        return item

    def ready(self) -> bool:
        return True


class BatchCall:
    """A call of a batched method whose whole request stream arrived in one read: its
    decoded requests (in order) and its context. :meth:`BatchServicer.serve_group` answers it
    through its outcome."""

    __slots__ = ("stream", "ctx", "requests")

    def __init__(self, stream: ServerStream, ctx: ServicerContext, requests: list[Any]) -> None:
        self.stream = stream
        self.ctx = ctx
        self.requests = requests


class BatchServicer(Protocol):
    """Serves calls of one client-streaming, unary-response method together."""

    def group_key(self, call: BatchCall) -> object | None:
        """What the calls served together share (equal keys: one group), or None: this call is
        served alone, by the method's handler."""

    async def serve_group(self, calls: list[BatchCall]) -> list[Any]:
        """Serves ``calls`` (two or more of one key); returns each call's outcome in order: its
        response, or the exception that ends it (as the handler would have raised it)."""


class ServerStream(Stream):
    __slots__ = ("handler", "task", "headers_sent", "deserialize", "serialize", "deadline_handle", "expired",
                 "received")

    def __init__(self, conn: ServerConnection, stream_id: int, handler: grpc.RpcMethodHandler) -> None:
        super().__init__(conn, stream_id)
        self.handler = handler
        self.deserialize: Callable[[Any], Any] | None = handler.request_deserializer
        self.serialize: Callable[[Any], bytes] | None = handler.response_serializer
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.expired = False
        self.received = 0  # messages received (counted on unary calls)

    def check_end(self) -> None:
        """The client ended its side: within a message is an error."""
        if self.reader.partial:
            # grpc-go's serverStream.RecvMsg: io.ErrUnexpectedEOF -> INTERNAL "unexpected EOF".
            raise f.MessageRefused("grpc: unexpected EOF: the stream ended within a message")

    def on_reset(self, code: int) -> None:
        super().on_reset(code)
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client is gone: its handler stops (and cleans up) now

    async def next_request(self) -> Any:
        msg = await self.next_message()
        if msg is None or self.deserialize is None:
            return msg
        try:
            return self.deserialize(msg)
        except Exception as err:
            # Whatever the deserializer raises on bytes it cannot take (protobuf's DecodeError,
            # our zero-copy decoders' ValueError), the client sent garbage: INVALID_ARGUMENT
            # (as a GazetteError, also where a servicer's own loop meets it through the edge).
            raise BadRequest(f"could not parse the request message: {str(err)[:200]}") from err

    async def send_response(self, message: Any) -> None:
        data = self.serialize(message) if self.serialize is not None else message
        if not self.headers_sent:
            self.headers_sent = True
            self.conn.send_headers(self, f.RESPONSE_HEADERS, end_stream=False)
        await self.conn.send_message(self, data)

    def finish(self, code: grpc.StatusCode, details: str, extra: bytes = b"") -> None:
        if self.local_closed or self.conn.closed:
            return
        self.conn.send_headers(self, f.trailers(code, details, not self.headers_sent, extra),
                               end_stream=True)
        if not self.remote_closed:
            # The client may still be sending (an RPC that failed early): tell it to stop.
            self.conn.send_reset(self.id, f.NO_ERROR)
            self.remote_closed = True
        self.conn.streams.pop(self.id, None)


class UnaryServerStream(ServerStream):
    """A stream of a call taking one request message (streaming ones take the base's
    ``on_data``, unchanged on their hot path)."""

    __slots__ = ()

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        queued = len(self.messages)
        super().on_data(payload, end_stream)
        self.received += len(self.messages) - queued
        if self.received > 1:
            # grpc-java ends such a call INTERNAL "Too many requests"; answering OK would let
            # the client believe every message was taken.
            raise f.MessageRefused("grpc: more than one request message on a unary call")


class BadRequest(GazetteError):
    """A request message that does not decode: the call ends INVALID_ARGUMENT."""

    grpc_code: ClassVar[str] = "INVALID_ARGUMENT"
    http_status: ClassVar[int] = 400


class ServerConnection(Connection):
    def __init__(self, server: RpcServer) -> None:
        super().__init__(server.max_message)
        self.server = server
        self.max_concurrent_streams = server.max_concurrent_streams
        if server.connection_window is not None:
            self.connection_window = server.connection_window
        if server.connection_buffer is not None:
            self.connection_buffer_cap = server.connection_buffer
        if server.max_unread is not None:
            self.write_backlog_limit = server.max_unread
        self.calm = RateLimit(CALM_BURST, CALM_RATE, self.loop.time)
        self._preface = b""
        self._preface_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._busy_at = 0.0
        self._last_stream = 0
        self._draining = False
        # Calls of batched methods opened by the frames being handled (see frames_done).
        self._deferred: list[tuple[ServerStream, ServicerContext, BatchServicer]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server._connections.add(self)
        self._preface_timer = self.loop.call_later(PREFACE_TIMEOUT, self._no_preface)
        self._busy_at = self.loop.time()
        self._idle_timer = self.loop.call_later(IDLE_TIMEOUT / 2, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self.closed:
            return
        now = self.loop.time()
        if self.streams:
            self._busy_at = now
        elif now - self._busy_at >= IDLE_TIMEOUT:
            self.write(f.goaway(self._last_stream, f.NO_ERROR, b"idle"))
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        self._idle_timer = self.loop.call_later(IDLE_TIMEOUT / 2, self._idle_check)

    def _no_preface(self) -> None:
        if len(self._preface) < 24 and not self.closed:
            self.connection_error("no HTTP/2 client preface in time")

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # lingering after a GOAWAY (close_after_goaway): read, and dropped
        if len(self._preface) < 24:
            need = 24 - len(self._preface)
            self._preface += data[:need]
            data = data[need:]
            if not f.PREFACE.startswith(self._preface):
                self.connection_error("not an HTTP/2 client preface")
                return
            if len(self._preface) < 24 or not data:
                return
        super().data_received(data)

    def close_after_goaway(self, transport: asyncio.Transport) -> None:
        """Half-closes after the GOAWAY and reads on, dropping what arrives, until the client
        closes too or ``GOAWAY_LINGER`` passes: closing a socket with the peer's bytes unread
        resets the connection, and a reset discards our GOAWAY wherever the client has not
        read it yet (a client flooding us has always more in flight). Transports that cannot
        half-close (TLS) are closed at once."""
        try:
            if not transport.can_write_eof():
                raise NotImplementedError("no half-close")
            transport.write_eof()
            transport.resume_reading()  # whatever paused it, the rest is now only drained
        except (NotImplementedError, AttributeError, OSError, RuntimeError):
            transport.close()
            return
        self.server._lingering.add(transport)
        self.loop.call_later(GOAWAY_LINGER, self.server._end_linger, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._preface_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        streams = list(self.streams.values())
        super().connection_lost(exc)
        for stream in streams:
            assert isinstance(stream, ServerStream)
            if stream.task is not None and not stream.task.done():
                stream.task.cancel()
        self.server._connections.discard(self)

    def last_peer_stream(self) -> int:
        return self._last_stream

    def stream_is_idle(self, sid: int) -> bool:
        # Clients open odd streams in increasing order; we open none.
        return sid % 2 == 0 or sid > self._last_stream

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self._draining = True

    def check_headers(self, headers: list[tuple[str, str]]) -> str | None:
        return malformed_request(headers)

    def on_headers(self, sid: int, headers: list[tuple[str, str]], end_stream: bool,
                   malformed: str | None) -> None:
        stream = self.streams.get(sid)
        if stream is not None:
            # Trailers from a client are not part of gRPC; treat them as the end of its stream.
            # A second header block that does not end the stream, or carries pseudo-headers,
            # is malformed (RFC 9113 8.1): a stream error.
            if end_stream and not any(name.startswith(":") for name, _ in headers):
                stream.on_data(memoryview(b""), True)
                self.on_remote_closed(stream)
            else:
                self.reset_stream(stream, f.PROTOCOL_ERROR,
                                  f.ProtocolError("malformed trailers after the request"))
            return
        if sid in self._reset_sent:
            return  # trailers of a stream we reset: ignored (RFC 9113 5.1)
        if sid % 2 == 0 or sid <= self._last_stream:
            raise f.ProtocolError(f"bad new stream id {sid}")
        self._last_stream = sid
        self._busy_at = self.loop.time()
        if len(self.streams) >= self.server.max_concurrent_streams:
            # RFC 9113 5.1.2: beyond the advertised limit, refused (the client may retry).
            self.send_reset(sid, f.REFUSED_STREAM)
            return
        if malformed is not None:
            # A malformed request is a stream error PROTOCOL_ERROR (RFC 9113 8.1.1).
            self.send_reset(sid, f.PROTOCOL_ERROR)
            return
        path = ""
        deadline: float | None = None
        metadata: list[tuple[str, str]] = []
        for name, value in headers:
            if name == ":path":
                path = value
            elif name == "grpc-timeout":
                try:
                    deadline = self.loop.time() + f.parse_timeout(value)
                except ValueError:
                    self._refuse(sid, end_stream, grpc.StatusCode.INVALID_ARGUMENT,
                                 f"malformed grpc-timeout {value[:64]!r}")
                    return
            elif name == "grpc-encoding":
                if value != "identity":
                    # As grpc-go answers an encoding it has no decompressor for.
                    self._refuse(sid, end_stream, grpc.StatusCode.UNIMPLEMENTED,
                                 f"grpc: Decompressor is not installed for grpc-encoding {value[:64]!r}",
                                 f.ACCEPT_IDENTITY)
                    return
            elif name[0] != ":" and name not in ("content-type", "te", "user-agent", "grpc-accept-encoding"):
                metadata.append((name, value))
        if self._draining or self.server._stopping:
            self.send_reset(sid, f.REFUSED_STREAM)
            return
        handler = self.server.lookup(path, tuple(metadata))
        if handler is None:
            self._refuse(sid, end_stream, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path[:256]}")
            return
        stream = (ServerStream if handler.request_streaming else UnaryServerStream)(self, sid, handler)
        self.streams[sid] = stream
        if end_stream:
            stream.remote_closed = True
        ctx = ServicerContext(stream, tuple(metadata), deadline)
        batch = self.server._batch.get(path) if self.server._batch else None
        if batch is not None and handler.request_streaming and not handler.response_streaming:
            self._deferred.append((stream, ctx, batch))  # started by frames_done
        else:
            stream.task = self.server.handlers.spawn(path, self.server._serve(stream, ctx), self.loop)
        if deadline is not None:
            stream.deadline_handle = self.loop.call_at(deadline, self._expire, stream)

    def frames_done(self) -> None:
        if self._deferred:
            self._start_deferred()

    def _start_deferred(self) -> None:
        """Starts the batched calls the frames just handled opened: each whose requests all
        arrived joins its servicer's group for its key; every other call starts alone."""
        deferred, self._deferred = self._deferred, []
        # A lone call has no group to join: it starts alone without being keyed (the group of
        # one it would form is served alone too), which is a single writer's every append.
        lone = len(deferred) == 1
        groups: dict[tuple[BatchServicer, object], list[BatchCall]] = {}
        for stream, ctx, servicer in deferred:
            if stream.error is not None:
                # Reset (or refused) before it started: as a task cancelled before its first
                # step, it ends without running.
                if stream.deadline_handle is not None:
                    stream.deadline_handle.cancel()
                continue
            if not stream.remote_closed or self.closed:  # (ended mid-message: an error, above)
                self._start_alone(stream, ctx, None)
                continue
            call = BatchCall(stream, ctx, _take_all(stream))
            items = call.requests
            key = None if lone or (items and isinstance(items[-1], BadRequest)) else servicer.group_key(call)
            if key is None:
                self._start_alone(stream, ctx, BufferedRequests(items))
                continue
            groups.setdefault((servicer, key), []).append(call)
        for (servicer, _), calls in groups.items():
            if len(calls) == 1:
                one = calls[0]
                self._start_alone(one.stream, one.ctx, BufferedRequests(one.requests))
            else:
                self.server.handlers.spawn("group", self.server._serve_group(servicer, calls), self.loop)

    def _start_alone(self, stream: ServerStream, ctx: ServicerContext, requests: BufferedRequests | None) -> None:
        stream.task = self.server.handlers.spawn("call", self.server._serve(stream, ctx, requests), self.loop)

    def header_list_too_large(self, sid: int, end_stream: bool) -> None:
        # gRPC's answer to metadata over the limit is RESOURCE_EXHAUSTED (grpc-core: "received
        # initial metadata size exceeds limit"); on a stream already open, a reset.
        if sid in self.streams or sid % 2 == 0 or sid <= self._last_stream:
            super().header_list_too_large(sid, end_stream)
            return
        self._last_stream = sid
        self._refuse(sid, end_stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     f"header list over {MAX_HEADER_LIST_SIZE} bytes")

    def on_remote_closed(self, stream: Stream) -> None:
        assert isinstance(stream, ServerStream)
        try:
            stream.check_end()
        except f.MessageRefused as err:
            self.message_refused(stream, err)

    def withhold(self, held: int) -> bool:
        if super().withhold(held):
            return True
        if not held:
            return False
        # Over the process's budget, each connection is held to its share of it: a connection
        # holding less is still granted window (it cannot be what took the budget), so no
        # connection is starved by others' load, and together they hold at most the budget
        # plus a connection window each.
        srv = self.server
        return held * len(srv._connections) > srv.max_buffered and srv.buffered_bytes() > srv.max_buffered

    def message_refused(self, stream: Stream, err: f.MessageRefused) -> None:
        assert isinstance(stream, ServerStream)
        # A compressed message: say which encodings we take (gRPC's compression.md).
        stream.finish(err.status, str(err), f.ACCEPT_IDENTITY if isinstance(err, f.MessageCompressed) else b"")
        stream.fail(StreamReset(str(err)))
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()

    def _refuse(self, sid: int, end_stream: bool, code: grpc.StatusCode, details: str,
                extra: bytes = b"") -> None:
        """Answers new stream ``sid`` with a status alone (trailers-only)."""
        # Details quote what the client sent (a path): cut short, the answer stays small.
        self.write_block(sid, f.trailers(code, details[:512], with_headers=True, extra=extra), True)
        if not end_stream:
            self.send_reset(sid, f.NO_ERROR)  # the client may stop sending (RFC 9113 8.1)

    def _expire(self, stream: ServerStream) -> None:
        if stream.task is not None and not stream.task.done():
            stream.expired = True
            stream.task.cancel()
        elif stream.task is None and not stream.local_closed:
            # A call of a group: it ends now, alone; the group's answer to it is dropped.
            stream.expired = True
            stream.finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _take_all(stream: ServerStream) -> list[Any]:
    """Every message ``stream`` received, consumed and decoded; one that does not decode ends
    the list as its :class:`BadRequest`."""
    items: list[Any] = []
    messages, deserialize = stream.messages, stream.deserialize
    while messages:
        msg = messages.popleft()
        stream.credit(len(msg) + 5)
        if deserialize is None:
            items.append(msg)
            continue
        try:
            items.append(deserialize(msg))
        except Exception as err:  # noqa: BLE001 - as next_request: the client sent garbage
            items.append(BadRequest(f"could not parse the request message: {str(err)[:200]}"))
            break
    return items


_PSEUDO_BITS = {":method": 1, ":scheme": 2, ":path": 4, ":authority": 8}  # a request's
_REQUIRED = 7  # :method, :scheme and :path
# RFC 9113 8.2.2: connection-specific fields have no place in HTTP/2 ("te" but "trailers").
_CONNECTION_SPECIFIC = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding",
                                  "upgrade"))
# Fields every gRPC request has, known well-formed: checked by one lookup.
_COMMON = frozenset(("content-type", "user-agent", "grpc-timeout", "grpc-accept-encoding", "authorization"))


def malformed_request(headers: list[tuple[str, str]]) -> str | None:
    """Why a request's header list is malformed (RFC 9113 8.1.1, 8.2, 8.3), or None."""
    seen = 0
    regular = False
    for name, value in headers:
        if name[:1] == ":":
            if regular:
                return f"pseudo-header {name[:32]!r} after a regular field"  # 8.3
            bit = _PSEUDO_BITS.get(name)
            if bit is None:
                return f"pseudo-header {name[:32]!r} is not a request's"    # 8.3
            if seen & bit or (bit == 4 and not value):
                return f"pseudo-header {name} twice or empty"                # 8.3.1
            seen |= bit
            continue
        regular = True
        if name in _COMMON:
            continue
        if name == "te":
            if value != "trailers":
                return "connection-specific field 'te'"                       # 8.2.2
        elif not name or name != name.lower():
            return "a field name that is empty or not lowercase"             # 8.2.1
        elif name in _CONNECTION_SPECIFIC:
            return f"connection-specific field {name!r}"                     # 8.2.2
    if seen & _REQUIRED != _REQUIRED:
        return "no :method, :scheme or :path"                                # 8.3.1
    return None


class RpcServer:
    """Serves registered gRPC methods on :class:`ServerConnection` instances.

    Connections come from :meth:`start` (a listener of its own) or are handed over by a
    multiplexer through :meth:`protocol`. ``connection_window``, ``connection_buffer`` and
    ``max_unread`` set each connection's receive window, unread-request cap and unread-answer
    limit (None: ``gazette.rpc.connection``'s constants); ``max_buffered`` is the process's
    budget of unconsumed request data (``--server.*`` flags, ``gazette.server.limits``).
    """

    def __init__(self, *, max_message: int = DEFAULT_MAX_MESSAGE,
                 max_concurrent_streams: int = MAX_CONCURRENT_STREAMS,
                 max_buffered: int = MAX_BUFFERED, connection_window: int | None = None,
                 connection_buffer: int | None = None, max_unread: int | None = None) -> None:
        self.max_message = max_message
        self.max_concurrent_streams = max_concurrent_streams
        self.max_buffered = max_buffered
        self.connection_window = connection_window
        self.connection_buffer = connection_buffer
        self.max_unread = max_unread
        self._generic: list[Any] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._cache: dict[str, grpc.RpcMethodHandler | None] = {}
        self._connections: set[ServerConnection] = set()
        self._lingering: set[asyncio.Transport] = set()  # connections ended by an error, half-closed
        self._servers: list[asyncio.AbstractServer] = []
        self._stopping = False
        self._batch: dict[str, BatchServicer] = {}
        # One task per RPC (or group of batched calls), owned here: a stop cancels and awaits
        # every one.
        self.handlers = Supervisor("rpc", "log")

    # -- registration (what grpcio's generated code calls) ---------------------------

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._generic.extend(handlers)
        self._cache.clear()

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler
        self._cache.clear()

    def add_batch_servicer(self, path: str, servicer: BatchServicer) -> None:
        """Serves the calls of ``path`` (a registered client-streaming method with a unary
        response) that arrive whole in one read through ``servicer``, grouped (see the module
        docstring); the method's handler still serves every other call."""
        self._batch[path] = servicer

    def lookup(self, path: str, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(path)
        if handler is not None:
            return handler
        if path in self._cache:
            return self._cache[path]
        for generic in self._generic:
            handler = generic.service(_CallDetails(path, metadata))
            if handler is not None:
                break
        # Bounded: paths are the client's (48 refused 1 MB paths stayed cached, 94 MiB).
        if len(self._cache) < 1024 and len(path) <= 256:
            self._cache[path] = handler
        return handler

    # -- connections -----------------------------------------------------------------

    def buffered_bytes(self) -> int:
        """Request data received on all connections and not yet consumed."""
        return sum(conn.buffered_bytes() for conn in self._connections)

    def queued_bytes(self) -> int:
        """What all connections have queued for clients and not yet sent."""
        return sum(conn.transport.get_write_buffer_size() for conn in self._connections
                   if conn.transport is not None and not conn.closed)

    def protocol(self) -> ServerConnection:
        return ServerConnection(self)

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port`` (0 picks a port); returns the bound port."""
        srv = await asyncio.get_running_loop().create_server(self.protocol, host, port)
        self._servers.append(srv)
        # Read untyped: typeshed says a tuple, uvloop's server gives a list (and compiled,
        # mypyc would check the declared type).
        sockets: Sequence[socket.socket] = cast(Any, srv).sockets
        return int(sockets[0].getsockname()[1])

    async def stop(self, grace: float | None = None) -> None:
        """Stops listening, lets running RPCs finish within ``grace`` seconds, then cancels
        them and closes every connection."""
        self._stopping = True
        for srv in self._servers:
            srv.close()
        for conn in list(self._connections):
            if not conn.closed:
                conn.write(f.goaway(conn.last_peer_stream(), f.NO_ERROR))
        if len(self.handlers) and grace:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.handlers.wait()
        await self.handlers.aclose()
        for conn in list(self._connections):
            if conn.transport is not None:
                conn.transport.close()
        for transport in list(self._lingering):
            self._end_linger(transport)
        for srv in self._servers:
            with contextlib.suppress(Exception):
                await srv.wait_closed()
        self._servers.clear()

    def _end_linger(self, transport: asyncio.Transport) -> None:
        self._lingering.discard(transport)
        transport.close()  # a no-op once the client closed it

    # -- serving one RPC -------------------------------------------------------------

    async def _serve(self, stream: ServerStream, ctx: ServicerContext,
                     requests: BufferedRequests | None = None) -> None:
        handler = stream.handler
        code, details = grpc.StatusCode.OK, ""
        try:
            if handler.request_streaming:
                request: Any = _Requests(stream) if requests is None else requests
            else:
                request = await stream.next_request()
                if request is None:
                    # grpc-java: INTERNAL "Half-closed without a request".
                    stream.finish(grpc.StatusCode.INTERNAL, "grpc: the stream ended without a request message")
                    return
            if handler.response_streaming:
                fn = handler.stream_stream if handler.request_streaming else handler.unary_stream
                assert fn is not None
                result = fn(request, ctx)
                if hasattr(result, "__aiter__"):
                    async for response in result:
                        await stream.send_response(response)
                else:
                    await result  # a servicer writing through context.write
            else:
                fn = handler.stream_unary if handler.request_streaming else handler.unary_unary
                assert fn is not None
                response = await fn(request, ctx)
                if ctx.code is None or ctx.code is grpc.StatusCode.OK:
                    await stream.send_response(response)
            code, details = ctx.code or grpc.StatusCode.OK, ctx.details
        except (asyncio.CancelledError, Exception) as err:  # mapped by _status_of
            # This task is the top of its own call and only this server cancels it (a reset, a
            # deadline, a stop): a cancellation too ends the call with a status, and nothing
            # above awaits the task for a CancelledError.
            status = _status_of(stream, ctx, err)
            if status is None:
                return  # the client went away: nobody to tell
            code, details = status
        finally:
            if stream.deadline_handle is not None:
                stream.deadline_handle.cancel()
        stream.finish(code, details)

    async def _serve_group(self, servicer: BatchServicer, calls: list[BatchCall]) -> None:
        """Serves a group of batched calls and ends each with its outcome, as :meth:`_serve`
        ends a call with its handler's."""
        outcomes: list[Any]
        try:
            outcomes = await servicer.serve_group(calls)
        except asyncio.CancelledError as cancelled:  # a stop: each call ends as _serve's would
            outcomes = [cancelled] * len(calls)
        except Exception as err:  # noqa: BLE001 - each call ends UNKNOWN, logged once per call
            outcomes = [err] * len(calls)
        for call, outcome in zip(calls, outcomes, strict=True):
            stream = call.stream
            if stream.deadline_handle is not None:
                stream.deadline_handle.cancel()
            if stream.local_closed or stream.error is not None:
                continue  # reset, expired or lost meanwhile: nobody to answer
            if isinstance(outcome, BaseException):
                status = _status_of(stream, call.ctx, outcome)
                if status is not None:
                    stream.finish(status[0], status[1])
                continue
            try:
                await stream.send_response(outcome)
            except StreamReset:
                continue
            stream.finish(call.ctx.code or grpc.StatusCode.OK, call.ctx.details)


def _status_of(stream: ServerStream, ctx: ServicerContext,
               err: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status a call ends with for what its handler (or its group) raised, ``err``; None
    if the call is gone (reset, connection lost): nobody to tell."""
    if isinstance(err, grpc.aio.AbortError):
        return ctx.code or grpc.StatusCode.UNKNOWN, ctx.details
    if isinstance(err, BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(err)
    if isinstance(err, asyncio.CancelledError):
        if stream.expired:
            return grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        if stream.error is not None or stream.conn.closed:
            return None
        return grpc.StatusCode.UNAVAILABLE, "the server is stopping"
    if isinstance(err, StreamReset):
        return None
    if ctx.code is not None and ctx.code is not grpc.StatusCode.OK:
        return ctx.code, ctx.details  # aborted, then the servicer raised
    # The client learns nothing of the error but where the log keeps it.
    return grpc.StatusCode.UNKNOWN, incident(log, _method_name(stream.handler), err)


def _method_name(handler: Any) -> str:
    for attr in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        fn = getattr(handler, attr, None)
        if fn is not None:
            return getattr(fn, "__qualname__", attr)
    return "?"


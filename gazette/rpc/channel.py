"""The client side of :mod:`gazette.rpc`: a channel with grpc.aio's calling conventions.

A :class:`Channel` stands in for ``grpc.aio.Channel`` wherever a generated stub takes one
(``JournalStub(channel)``): its ``unary_unary``/``unary_stream``/``stream_unary``/
``stream_stream`` return multi-callables whose calls behave as grpc.aio's do: awaited for a
unary response, iterated or ``read()`` (``grpc.aio.EOF`` at the end) for a stream,
``write()``/``done_writing()`` for requests, ``cancel()``. A non-OK status raises
``grpc.aio.AioRpcError`` with its code and details; a cancelled call raises
``asyncio.CancelledError``.

Invariants:

* A channel dials a connection on first use and again after it is lost or told to go away.
  A connection takes new calls while it has fewer streams open than the server's
  SETTINGS_MAX_CONCURRENT_STREAMS; once every connection is full the channel dials another
  (as many as the calls in flight need), so a broker holding a Replicate stream per journal
  to one peer is not refused beyond that limit. Calls in flight on a lost connection fail with UNAVAILABLE, and calls
  the server refused before starting them (REFUSED_STREAM, beyond GOAWAY's last stream)
  fail with UNAVAILABLE too, so callers' retry policies treat them as transient.
* A call ends exactly once (status, reset, cancel, deadline); ending it resets the stream
  if our side was still open, so the server's handler is cancelled.
* With keepalive configured, a connection with calls in flight is pinged every
  ``keepalive_time``; an unanswered ping aborts it within ``keepalive_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from gazette.rpc import frames as f
from gazette.rpc import use_grpcio
from gazette.rpc.connection import DEFAULT_MAX_MESSAGE, Connection, Stream, StreamReset
from gazette.rpc.seam import RpcChannel
from gazette.rpc.tls import HANDSHAKE_TIMEOUT, ClientTLS

_USER_AGENT = "gazette-python-rpc/1"
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
LAST_STREAM_ID = (1 << 31) - 1  # client stream ids are odd and never wrap


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class ClientStream(Stream):
    __slots__ = ("status", "details", "headers_seen", "trailing", "initial", "done")

    def __init__(self, conn: ClientConnection, stream_id: int) -> None:
        super().__init__(conn, stream_id)
        self.status: grpc.StatusCode | None = None
        self.details = ""
        self.headers_seen = False
        self.initial: tuple[tuple[str, str], ...] = ()
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.done: asyncio.Future[None] = conn.loop.create_future()

    def set_status(self, code: grpc.StatusCode, details: str) -> None:
        if self.status is None:
            self.status, self.details = code, details
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, err: BaseException) -> None:
        super().fail(err)
        if self.status is None:
            if isinstance(err, grpc.aio.AioRpcError):
                self.set_status(err.code(), err.details() or "")
            else:
                self.set_status(_UNAVAILABLE, str(err))


class ClientConnection(Connection):
    def __init__(self, channel: Channel) -> None:
        super().__init__(channel.max_message)
        # Set on the instance: a class attribute of a subclass would not override the compiled
        # Connection's (mypyc keeps class-level defaults in the instance's own slots).
        self.is_client = True
        self.channel = channel
        self.next_id = 1
        self.going_away = False
        self._ping_ids = itertools.count(1)
        self._keepalive: asyncio.TimerHandle | None = None
        self._keepalive_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.channel.keepalive_time:
            self._keepalive = self.loop.call_later(self.channel.keepalive_time, self._ping_tick)

    def connection_lost(self, exc: Exception | None) -> None:
        for h in (self._keepalive, self._keepalive_deadline):
            if h is not None:
                h.cancel()
        streams = list(self.streams.values())
        self.streams.clear()
        self.closed = True
        for stream in streams:
            stream.fail(_rpc_error(_UNAVAILABLE, f"connection to {self.channel.target} lost"
                                   + (f": {exc}" if exc else "")))
        super().connection_lost(exc)
        self.channel._lost(self)

    def open_stream(self, block: bytes, end_stream: bool = False) -> ClientStream:
        sid = self.next_id
        self.next_id += 2
        if self.next_id > LAST_STREAM_ID:
            # Stream ids never wrap (RFC 9113 5.1.1): this is the connection's last stream;
            # later calls dial a new connection, and this one closes when its streams end.
            self.going_away = True
            self.channel._lost(self)
        stream = ClientStream(self, sid)
        self.streams[sid] = stream
        self.send_headers(stream, block, end_stream)
        return stream

    def on_headers(self, sid: int, headers: list[tuple[str, str]], end_stream: bool,
                   malformed: str | None) -> None:
        stream = self.streams.get(sid)
        if stream is None:
            return
        assert isinstance(stream, ClientStream)
        if not stream.headers_seen and not end_stream:
            stream.headers_seen = True
            status = next((v for k, v in headers if k == ":status"), "")
            if status != "200":
                self.reset_stream(stream, f.CANCEL, _rpc_error(
                    _http_status_code(status), f"HTTP status {status or 'missing'} from {self.channel.target}"))
            stream.initial = tuple((k, v) for k, v in headers if not k.startswith(":"))
            return
        # Trailers (or a trailers-only response).
        code: grpc.StatusCode | None = None
        details = ""
        md: list[tuple[str, str]] = []
        for k, v in headers:
            if k == "grpc-status":
                code = f.status_code(int(v)) if v.isdigit() else grpc.StatusCode.UNKNOWN
            elif k == "grpc-message":
                details = f.decode_message_text(v)
            elif not k.startswith(":") and k != "content-type":
                md.append((k, v))
        if code is None:
            status = next((v for k, v in headers if k == ":status"), "")
            code = _http_status_code(status) if status and status != "200" else grpc.StatusCode.UNKNOWN
            details = details or "response ended without grpc-status"
        stream.trailing = tuple(md)
        # Messages already queued stay readable; the status is seen after them.
        stream.on_data(memoryview(b""), True)
        stream.set_status(code, details)
        if not end_stream:
            self.reset_stream(stream, f.PROTOCOL_ERROR)
            return
        self.streams.pop(sid, None)
        if not stream.local_closed:
            # The server is done while we were still sending: stop (RFC 9113 8.1).
            self.write(f.rst_stream(sid, f.NO_ERROR))
            stream.local_closed = True
        self._maybe_close()

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.going_away = True
        self.channel._lost(self)
        for sid, stream in list(self.streams.items()):
            if sid > last_stream_id:
                self.streams.pop(sid, None)
                stream.fail(_rpc_error(_UNAVAILABLE, f"{self.channel.target} is going away"))
        self._maybe_close()

    def header_list_too_large(self, sid: int, end_stream: bool) -> None:
        stream = self.streams.get(sid)
        if stream is not None:
            self.reset_stream(stream, f.CANCEL, _rpc_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "the response's header list is over our maximum size"))

    def message_refused(self, stream: Stream, err: f.MessageRefused) -> None:
        self.reset_stream(stream, f.CANCEL, _rpc_error(err.status, str(err)))

    def _maybe_close(self) -> None:
        if self.going_away and not self.streams and self.transport is not None:
            self.transport.close()

    def end_stream(self, stream: ClientStream) -> None:
        """Our use of ``stream`` is over: reset it if it is still open."""
        if self.streams.get(stream.id) is stream:
            self.reset_stream(stream, f.CANCEL, StreamReset("call cancelled"))
            self._maybe_close()

    # -- keepalive --------------------------------------------------------------------

    def _ping_tick(self) -> None:
        self._keepalive = None
        if self.closed:
            return
        if self.streams and self._keepalive_deadline is None:
            opaque = next(self._ping_ids).to_bytes(8, "big")
            self.ping(opaque, self._ping_acked)
            self._keepalive_deadline = self.loop.call_later(self.channel.keepalive_timeout, self._ping_lost, opaque)
        self._keepalive = self.loop.call_later(self.channel.keepalive_time, self._ping_tick)

    def _ping_acked(self) -> None:
        if self._keepalive_deadline is not None:
            self._keepalive_deadline.cancel()
            self._keepalive_deadline = None

    def _ping_lost(self, opaque: bytes) -> None:
        self._keepalive_deadline = None
        self.forget_ping(opaque)
        if self.transport is not None and not self.closed:
            self.transport.abort()
            self.connection_lost(ConnectionError("keepalive ping not acknowledged"))


def _http_status_code(status: str) -> grpc.StatusCode:
    # gRPC's mapping of HTTP statuses for responses that are not gRPC.
    return {"400": grpc.StatusCode.INTERNAL, "401": grpc.StatusCode.UNAUTHENTICATED,
            "403": grpc.StatusCode.PERMISSION_DENIED, "404": grpc.StatusCode.UNIMPLEMENTED,
            "429": _UNAVAILABLE, "502": _UNAVAILABLE, "503": _UNAVAILABLE,
            "504": _UNAVAILABLE}.get(status, grpc.StatusCode.UNKNOWN)


class Channel:
    """A client channel to one target (``host:port`` or ``unix:path``)."""

    def __init__(self, target: str, options: Sequence[tuple[str, Any]] = (),
                 *, max_message: int = DEFAULT_MAX_MESSAGE, tls: ClientTLS | None = None) -> None:
        self.target = target
        self.tls = tls
        self.max_message = max_message
        opts = dict(options)
        self.keepalive_time = float(opts.get("grpc.keepalive_time_ms", 0)) / 1000.0
        self.keepalive_timeout = float(opts.get("grpc.keepalive_timeout_ms", 20000)) / 1000.0
        self._conns: list[ClientConnection] = []  # open, not going away; oldest first
        self._connecting: asyncio.Future[ClientConnection] | None = None
        self._closed = False
        self._authority = target[5:] if target.startswith("unix:") else target
        self._paths: dict[str, bytes] = {}

    def headers_for(self, path: str) -> bytes:
        block = self._paths.get(path)
        if block is None:
            block = self._paths[path] = f.request_headers(path, self._authority, _USER_AGENT)
        return block

    def connection_now(self) -> ClientConnection | None:
        """The oldest usable connection with room for another stream, or None."""
        for conn in self._conns:
            if not conn.closed and not conn.going_away and len(conn.streams) < conn.peer_max_streams:
                return conn
        return None

    async def connection(self) -> ClientConnection:
        while True:
            conn = self.connection_now()
            if conn is not None:
                return conn
            if self._closed:
                raise _rpc_error(grpc.StatusCode.CANCELLED, "the channel is closed")
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._dial())
            connecting = self._connecting
            try:
                conn = await asyncio.shield(connecting)
            finally:
                if connecting.done() and self._connecting is connecting:
                    self._connecting = None
            # Calls that waited on one dial share it; if they filled it, the next dials again.
            if not conn.closed and not conn.going_away and len(conn.streams) < conn.peer_max_streams:
                return conn

    async def _dial(self) -> ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            if self.target.startswith("unix:"):
                path = self.target[5:]
                _, conn = await loop.create_unix_connection(lambda: ClientConnection(self), path)
            else:
                host, _, port = self.target.rpartition(":")
                host = host.strip("[]") or "localhost"
                if self.tls is None:
                    _, conn = await loop.create_connection(lambda: ClientConnection(self), host, int(port))
                else:
                    _, conn = await loop.create_connection(
                        lambda: ClientConnection(self), host, int(port), ssl=self.tls.context,
                        server_hostname=host, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except (OSError, ValueError) as err:
            raise _rpc_error(_UNAVAILABLE, f"failed to connect to {self.target}: {err}") from err
        self._conns.append(conn)
        return conn

    def _lost(self, conn: ClientConnection) -> None:
        if conn in self._conns:
            self._conns.remove(conn)

    async def close(self, grace: float | None = None) -> None:
        self._closed = True
        conns, self._conns = self._conns, []
        for conn in conns:
            if conn.transport is not None and not conn.closed:
                for stream in list(conn.streams.values()):
                    conn.reset_stream(stream, f.CANCEL, _rpc_error(grpc.StatusCode.CANCELLED, "channel closed"))
                conn.transport.close()

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- multi-callables (what generated stubs call) -----------------------------------

    def unary_unary(self, method: str, request_serializer: Callable[[Any], bytes] | None = None,
                    response_deserializer: Callable[[Any], Any] | None = None,
                    _registered_method: bool = False) -> _MultiCallable:
        return _MultiCallable(self, method, request_serializer, response_deserializer, UnaryUnaryCall)

    def unary_stream(self, method: str, request_serializer: Callable[[Any], bytes] | None = None,
                     response_deserializer: Callable[[Any], Any] | None = None,
                     _registered_method: bool = False) -> _MultiCallable:
        return _MultiCallable(self, method, request_serializer, response_deserializer, UnaryStreamCall)

    def stream_unary(self, method: str, request_serializer: Callable[[Any], bytes] | None = None,
                     response_deserializer: Callable[[Any], Any] | None = None,
                     _registered_method: bool = False) -> _MultiCallable:
        return _MultiCallable(self, method, request_serializer, response_deserializer, StreamUnaryCall)

    def stream_stream(self, method: str, request_serializer: Callable[[Any], bytes] | None = None,
                      response_deserializer: Callable[[Any], Any] | None = None,
                      _registered_method: bool = False) -> _MultiCallable:
        return _MultiCallable(self, method, request_serializer, response_deserializer, StreamStreamCall)


class _MultiCallable:
    __slots__ = ("_channel", "_path", "_ser", "_deser", "_cls")

    def __init__(self, channel: Channel, path: str, ser: Callable[[Any], bytes] | None,
                 deser: Callable[[Any], Any] | None, cls: type[_Call]) -> None:
        self._channel, self._path, self._ser, self._deser, self._cls = channel, path, ser, deser, cls

    def __call__(self, request: Any = None, *, timeout: float | None = None,
                 metadata: Sequence[tuple[str, str]] | None = None, **_: Any) -> Any:
        return self._cls(self._channel, self._path, self._ser, self._deser, request, timeout, metadata)


class _Call:
    """State shared by the four kinds of call."""

    def __init__(self, channel: Channel, path: str, ser: Callable[[Any], bytes] | None,
                 deser: Callable[[Any], Any] | None, request: Any, timeout: float | None,
                 metadata: Sequence[tuple[str, str]] | None) -> None:
        self._channel = channel
        self._path = path
        self._ser = ser
        self._deser = deser
        self._request = request
        self._timeout = timeout
        self._metadata = metadata
        self._stream: ClientStream | None = None
        self._starting: asyncio.Future[ClientStream] | None = None
        self._cancelled = False
        self._error: grpc.aio.AioRpcError | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None

    def _block(self) -> bytes:
        block = self._channel.headers_for(self._path)
        if self._timeout is not None:
            block += f.timeout_header(self._timeout)
        if self._metadata:
            block += b"".join(f.literal(k.lower(), v) for k, v in self._metadata)
        return block

    def _open(self, conn: ClientConnection, end_stream: bool = False) -> ClientStream:
        stream = self._stream = conn.open_stream(self._block(), end_stream)
        if self._timeout is not None:
            self._deadline = conn.loop.call_later(self._timeout, self._expire)
        return stream

    async def _started(self) -> ClientStream:
        if self._stream is not None:
            return self._stream
        if self._cancelled:
            raise asyncio.CancelledError()
        conn = self._channel.connection_now()
        if conn is not None and self._starting is None:
            return await self._start_on(conn)
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> ClientStream:
        conn = await self._channel.connection()
        if self._stream is not None:
            return self._stream
        return await self._start_on(conn)

    async def _start_on(self, conn: ClientConnection) -> ClientStream:
        return self._open(conn)

    def _expire(self) -> None:
        stream = self._stream
        if stream is not None and stream.status is None:
            err = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self._error = err
            assert isinstance(stream.conn, ClientConnection)
            stream.conn.reset_stream(stream, f.CANCEL, err)

    def _raise_status(self, stream: ClientStream) -> None:
        if self._cancelled:
            raise asyncio.CancelledError()
        if stream.status is not grpc.StatusCode.OK:
            if self._error is None:
                self._error = grpc.aio.AioRpcError(
                    stream.status or grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(*stream.initial),
                    grpc.aio.Metadata(*stream.trailing), details=stream.details)
            raise self._error

    def _finished(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    async def _next(self, stream: ClientStream) -> Any:
        try:
            msg = await stream.next_message()
        except (StreamReset, grpc.aio.AioRpcError, f.ProtocolError):
            if stream.status is None:
                stream.set_status(_UNAVAILABLE, str(stream.error))
            self._finished()
            self._raise_status(stream)
            raise
        if msg is None:
            await stream.done
            self._finished()
            self._raise_status(stream)
            return None
        if self._deser is None:
            return bytes(msg)
        try:
            return self._deser(msg)
        except Exception as err:
            self._error = _rpc_error(grpc.StatusCode.INTERNAL, f"could not parse the response: {err}")
            self.cancel()
            raise self._error from err

    async def _send(self, request: Any, end_stream: bool = False) -> None:
        stream = await self._started()
        if stream.local_closed:
            if stream.status is not None and stream.status is not grpc.StatusCode.OK:
                self._raise_status(stream)
            raise asyncio.InvalidStateError("write after done_writing") if not self._cancelled \
                else asyncio.CancelledError()
        data = self._ser(request) if self._ser is not None else request
        try:
            await stream.conn.send_message(stream, data, end_stream)
        except StreamReset:
            self._lost(stream)
            raise

    def _lost(self, stream: ClientStream) -> None:
        """A stream that ended without a status (its connection lost, or reset) answers
        UNAVAILABLE; raises the call's error."""
        self._finished()
        if stream.status is None:
            stream.set_status(_UNAVAILABLE, str(stream.error or "the connection was lost"))
        self._raise_status(stream)

    # -- grpc.aio.Call -----------------------------------------------------------------

    def cancel(self) -> bool:
        if self._cancelled:
            return False
        stream = self._stream
        if stream is not None and stream.status is not None:
            return False
        self._cancelled = True
        self._finished()
        if self._writer is not None:
            self._writer.cancel()
        if stream is not None:
            assert isinstance(stream.conn, ClientConnection)
            stream.set_status(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
            stream.conn.end_stream(stream)
        elif self._starting is not None:
            self._starting.cancel()
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._cancelled or (self._stream is not None and self._stream.status is not None)

    def code(self) -> grpc.StatusCode | None:
        if self._cancelled:
            return grpc.StatusCode.CANCELLED
        return self._stream.status if self._stream is not None else None

    def details(self) -> str | None:
        return self._stream.details if self._stream is not None else None

    async def initial_metadata(self) -> grpc.aio.Metadata:
        stream = await self._started()
        return grpc.aio.Metadata(*stream.initial)

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        stream = await self._started()
        await stream.done
        return grpc.aio.Metadata(*stream.trailing)

    async def wait_for_connection(self) -> None:
        await self._started()

    def __del__(self) -> None:
        stream = self._stream
        if stream is not None and stream.status is None and not stream.conn.closed:
            with contextlib.suppress(Exception):
                assert isinstance(stream.conn, ClientConnection)
                stream.conn.end_stream(stream)


class UnaryUnaryCall(_Call):
    def __await__(self) -> Any:
        return self._unary().__await__()

    async def _unary(self) -> Any:
        conn = self._channel.connection_now() or await self._channel.connection()
        data = self._ser(self._request) if self._ser is not None else self._request
        stream = self._open(conn)
        try:
            await conn.send_message(stream, data, end_stream=True)
            msg = await self._next(stream)
            if msg is None:
                self._error = _rpc_error(grpc.StatusCode.INTERNAL, "the server sent no response message")
                raise self._error
            await stream.done
            self._finished()
            self._raise_status(stream)
            return msg
        except StreamReset:
            self._lost(stream)
            raise
        except asyncio.CancelledError:
            self.cancel()
            raise


async def _read(call: _Call) -> Any:
    """The next response of ``call`` (``grpc.aio.EOF`` at the end): its ``read()``."""
    try:
        msg = await call._next(await call._started())
    except asyncio.CancelledError:
        call.cancel()
        raise
    return grpc.aio.EOF if msg is None else msg


class _Responses:
    """A call's responses, for ``async for``: a class rather than an async generator, which
    the compiled build cannot compile; like one, it ends for good once a read raised."""

    def __init__(self, call: _Call) -> None:
        self._call: _Call | None = call

    def __aiter__(self) -> _Responses:
        return self

    async def __anext__(self) -> Any:
        call, self._call = self._call, None  # until the response arrives
        if call is None:
            raise StopAsyncIteration
        msg = await _read(call)
        if msg is grpc.aio.EOF:
            raise StopAsyncIteration
        self._call = call
        return msg


class UnaryStreamCall(_Call):
    """A request, then a stream of responses: ``read()`` (EOF at the end) or ``async for``."""

    async def read(self) -> Any:
        return await _read(self)

    def __aiter__(self) -> _Responses:
        return _Responses(self)

    async def _start_on(self, conn: ClientConnection) -> ClientStream:
        data = self._ser(self._request) if self._ser is not None else self._request
        stream = self._open(conn)
        try:
            await conn.send_message(stream, data, end_stream=True)
        except StreamReset:
            # The connection went away as the request left (e.g. a TLS server refusing the
            # client's certificate after the handshake): UNAVAILABLE, as any lost connection.
            self._lost(stream)
            raise
        return stream


class StreamUnaryCall(_Call):
    def __init__(self, channel: Channel, path: str, ser: Callable[[Any], bytes] | None,
                 deser: Callable[[Any], Any] | None, request: Any, timeout: float | None,
                 metadata: Sequence[tuple[str, str]] | None) -> None:
        super().__init__(channel, path, ser, deser, request, timeout, metadata)
        if self._request is None:
            return
        conn = self._channel.connection_now()
        if conn is None or hasattr(self._request, "__aiter__"):
            self._writer = asyncio.ensure_future(self._pump(self._request))
            return
        # Connected, and the requests are at hand: send what fits the windows now, and
        # leave a task only for the rest.
        stream = self._open(conn)
        ser = self._ser
        it = iter(self._request)
        for req in it:
            data = ser(req) if ser is not None else req
            if not conn.try_send_message(stream, data):
                self._writer = asyncio.ensure_future(self._pump(itertools.chain((req,), it)))
                return
        conn.write_end(stream)

    async def _pump(self, requests: Any) -> None:
        try:
            if hasattr(requests, "__aiter__"):
                async for req in requests:
                    await self._send(req)
            else:
                for req in requests:
                    await self._send(req)
            await self.done_writing()
        except (grpc.aio.AioRpcError, StreamReset, asyncio.CancelledError):
            pass

    async def write(self, request: Any) -> None:
        await self._send(request)

    async def done_writing(self) -> None:
        stream = await self._started()
        stream.conn.write_end(stream)

    def flush(self) -> None:
        """Sends what this call has written now, not at the end of the event loop's turn."""
        if self._stream is not None:
            self._stream.conn.flush()

    def __await__(self) -> Any:
        return self._response().__await__()

    async def _response(self) -> Any:
        try:
            stream = await self._started()
            msg = await self._next(stream)
            if msg is None:
                self._error = _rpc_error(grpc.StatusCode.INTERNAL, "the server sent no response message")
                raise self._error
            await stream.done
            self._finished()
            self._raise_status(stream)
            return msg
        except asyncio.CancelledError:
            self.cancel()
            raise


class StreamStreamCall(StreamUnaryCall):
    """Streams of requests and responses: written as a StreamUnaryCall, read as a
    UnaryStreamCall (``read()`` or ``async for``)."""

    async def read(self) -> Any:
        return await _read(self)

    def __aiter__(self) -> _Responses:
        return _Responses(self)

    def __await__(self) -> Any:
        raise TypeError("a stream-stream call is read, not awaited")


def insecure_channel(target: str, options: Sequence[tuple[str, Any]] = ()) -> RpcChannel:
    """A :class:`Channel` to ``target``, or grpcio's when ``GAZETTE_RPC=grpcio`` (the default
    :data:`~gazette.rpc.seam.ChannelFactory`)."""
    if use_grpcio():
        channel: RpcChannel = grpc.aio.insecure_channel(target, options=list(options))
        return channel
    return Channel(target, options)


def secure_channel(target: str, options: Sequence[tuple[str, Any]] = (),
                   tls: ClientTLS | None = None) -> RpcChannel:
    """A TLS :class:`Channel` to ``target`` trusting ``tls`` (default: the system's CAs, no
    client certificate), or grpcio's secure channel when ``GAZETTE_RPC=grpcio``."""
    tls = tls if tls is not None else ClientTLS()
    if use_grpcio():
        root, key, chain = tls.pem()
        creds = grpc.ssl_channel_credentials(root, key, chain)
        channel: RpcChannel = grpc.aio.secure_channel(target, creds, options=list(options))
        return channel
    tls.context  # noqa: B018 - a bad file fails here, at configuration, not at first dial
    return Channel(target, options, tls=tls)


__all__ = ["Channel", "ClientConnection", "insecure_channel", "secure_channel"]

"""One HTTP/2 connection carrying gRPC streams: framing, settings, flow control, pings.

:class:`Connection` is the part the server and the client share; they subclass it to open,
accept and finish streams. A :class:`Stream` buffers the gRPC messages received on it.

Invariants:

* Receive windows are replenished only as the application *consumes* messages (stream
  level) or as DATA arrives (connection level), so a stream buffers at most its window of
  unread data: a slow handler back-pressures its own peer and nobody else. A peer that
  sends beyond a stream's window has the stream reset (FLOW_CONTROL_ERROR). The connection
  window is withheld while the streams together hold more than CONNECTION_BUFFER_CAP unread
  (or, on a server, more than their share of the process's budget, ``withhold``): what one
  connection can pin is bounded by that cap plus the connection window. What the peer does
  not read of our writes is bounded too: past WRITE_BACKLOG_LIMIT queued, the connection is
  not read until the transport drains.
* Sends never exceed the peer's stream and connection windows nor its maximum frame size;
  a send waits for a WINDOW_UPDATE, or for the transport to drain, and fails if the stream
  or connection ends meanwhile.
* Each frame is written to the transport in one synchronous call, so frames of concurrent
  streams interleave but never tear.
* Loop-neutral: a transport is any with asyncio's ``Transport`` methods (``stream_transport``;
  uvloop's subclass no asyncio class), and writes go to a plain socket's descriptor directly
  only while the transport holds nothing unsent (``get_write_buffer_size()`` is 0), so bytes
  leave in the order written on asyncio's loop and on uvloop alike.
* A connection error (bad framing, HPACK failure) sends GOAWAY with its code and closes
  the transport; every stream still open then fails exactly once (``Stream.fail``).
* What a peer can make us hold or do is bounded, with the error RFC 9113 names: a header
  block (HEADERS and its CONTINUATIONs) holds at most MAX_HEADER_BLOCK encoded bytes, checked
  before any HPACK work (else GOAWAY COMPRESSION_ERROR: it is not decoded) and
  MAX_CONTINUATIONS frames (else GOAWAY ENHANCE_YOUR_CALM); it decodes in time linear in its
  size (:mod:`gazette.rpc.hpack_decoder`), to a list of at most MAX_HEADER_LIST_SIZE (as
  advertised; a longer one is decoded but refused), and a connection decodes at most
  HEADER_WORK_PER_TURN of blocks (and FRAMES_PER_TURN frames) per turn of the event loop,
  the rest of what it read waiting for the next turn; the peer's first frame is
  SETTINGS (RFC 9113 3.4); WINDOW_UPDATE increments are
  non-zero and windows stay within 2^31-1; frames arrive only on the streams their type
  allows (no DATA, RST_STREAM or WINDOW_UPDATE on idle streams or stream 0; no SETTINGS,
  PING or GOAWAY on a stream); SETTINGS values are legal. A server also rate-limits the
  control frames a client makes it answer and the streams it resets (PING, SETTINGS,
  RST_STREAM, PRIORITY: a burst of CALM_BURST, then CALM_RATE per second; beyond, GOAWAY
  ENHANCE_YOUR_CALM: the "rapid reset" attack) and refuses streams beyond its advertised
  SETTINGS_MAX_CONCURRENT_STREAMS (RST_STREAM REFUSED_STREAM).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import ClassVar, cast

from gazette._compiled import mypyc_attr
from gazette.errors import GazetteError
from gazette.rpc import frames as f
from gazette.rpc.hpack_decoder import HeaderDecoder, HpackError

log = logging.getLogger(__name__)

# Windows we grant: per stream, what one slow reader may buffer; per connection, enough
# for several streams of large appends in flight.
STREAM_WINDOW = 16 << 20
CONNECTION_WINDOW = 32 << 20
# Unread DATA all streams of a connection may hold before the connection window stops being
# replenished (each stream's own window bounds one stream; this bounds their sum): what one
# connection's requests can make us hold is at most this plus CONNECTION_WINDOW (was 64 +
# 256 MiB: 24 streams each holding 15 MiB of an unfinished message held 382 MiB).
CONNECTION_BUFFER_CAP = 32 << 20
# Bytes queued in the transport for a client that does not read them, beyond which the
# connection is not read either (until the transport drains): answers a client makes us
# write without reading them (refusals, resets, PING and SETTINGS ACKs) stay bounded.
# Messages never queue beyond the transport's high-water mark plus one frame, as their
# sends wait for it to drain.
WRITE_BACKLOG_LIMIT = 4 << 20
MAX_FRAME = 1 << 20            # largest frame we accept (we advertise it)
DEFAULT_MAX_MESSAGE = 256 << 20
_JOIN_LIMIT = 32 << 10          # frames up to this size are joined into one write

_HEADERS_FLAG_END = f.END_HEADERS | f.END_STREAM

# Bounds on what a peer may make us hold or do (RFC 9113 leaves them to the endpoint).
# Header lists: gRPC suggests clients limit response headers to 8 KiB (PROTOCOL-HTTP2.md) and
# grpc-core refuses metadata over 16 KiB by default (its hard limit), so gRPC clients keep
# within that; grpc-go's and Go's net/http2 defaults (16 MiB, 1 MiB) are far above what any
# Gazette peer sends (a capability token and a timeout take well under 4 KiB). 16 KiB keeps
# the worst block's decoding to a few milliseconds (a 64 KiB block of tiny fields: ~15 ms).
MAX_HEADER_LIST_SIZE = 16 << 10  # decoded (RFC 7541 size), advertised as SETTINGS_MAX_HEADER_LIST_SIZE
# Encoded bytes of one header block, CONTINUATIONs included, checked as frames arrive and
# before any HPACK work. A sane encoder's block is never larger than its decoded list (a
# literal costs its bytes plus a few, a field counts 32 more), so this refuses no block a
# well-behaved peer sends within the list size we advertise.
MAX_HEADER_BLOCK = MAX_HEADER_LIST_SIZE
HEADER_TABLE_SIZE = 4096        # the HPACK dynamic table we allow the peer (the default)
# Header block bytes one connection may have decoded in one turn of the event loop: past it,
# the rest of what was read waits for the next turn (and the socket is not read meanwhile),
# so a client packing many blocks into one read cannot hold the loop (~5 ms per 16 KiB).
HEADER_WORK_PER_TURN = MAX_HEADER_BLOCK
# Frames one connection may have handled in one turn: a read of 256 KiB holds up to 29,000
# empty frames (SETTINGS ACKs, empty DATA, unknown types), 40-85 ms of work; 2,048 frames of
# the costliest kind take about 6 ms. Real traffic yields rarely (2,048 small unary calls).
FRAMES_PER_TURN = 2048
_CACHED_BLOCK = 1024            # header blocks up to this size may be cached (see _on_header_block)
_CACHED_BLOCKS = 256            # ... this many per connection
_RESETS_KEPT = 256              # streams we reset whose late frames are ignored
MAX_CONTINUATIONS = 256         # CONTINUATION frames of one header block
CALM_BURST = 1000               # control frames (PING, SETTINGS, RST_STREAM, PRIORITY) in a
CALM_RATE = 200.0               # burst, then per second; beyond: GOAWAY ENHANCE_YOUR_CALM


class RateLimit:
    """A token bucket: ``take()`` is False once more than ``burst`` events came faster than
    ``rate`` per second. ``clock`` is injectable (monotonic seconds)."""

    __slots__ = ("burst", "rate", "clock", "_tokens", "_at")

    def __init__(self, burst: float, rate: float, clock: Callable[[], float]) -> None:
        self.burst, self.rate, self.clock = burst, rate, clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


# Reasons a connection's transport is not read (Connection.set_reading).
_BACKLOG = 1   # frames already read wait for the next loop turn
_WRITE_BACKLOG = 2  # the client does not read what we write (WRITE_BACKLOG_LIMIT)

class LogLimit:
    """Log lines about what peers do wrong, rate-limited process-wide: a client opening
    connection after connection to misbehave cannot flood the log. A line is at most about
    ``MAX_LINE`` characters (what came from the peer is cut short); the lines left out are
    counted in the next one written."""

    MAX_LINE: ClassVar[int] = 512  # ClassVar: read through the class, compiled too

    def __init__(self, burst: float, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = RateLimit(burst, rate, clock)
        self.suppressed = 0

    def warning(self, err: str, peer: str) -> None:
        if not self.limit.take():
            self.suppressed += 1
            return
        extra = {"err": err[:self.MAX_LINE], "peer": peer[:64]}
        if self.suppressed:
            extra["suppressed"] = str(self.suppressed)
            self.suppressed = 0
        log.warning("HTTP/2 connection error", extra=extra)


#: One connection error (GOAWAY sent) is one line; 20 at once, then one every 5 seconds.
_ERROR_LOG = LogLimit(20, 0.2)

# Frames that may wait for the end of the loop's turn (see write): past them they leave at
# once. A turn that completes many RPCs (16 small appends arriving in one read, each done
# within the turn) then sends their responses in groups, and the peer starts on the first
# group while we work on the rest. With one send per turn the two processes took turns, each
# idle while the other worked (broker 74 % + client 27 % of two cores at 100 B x16).
FLUSH_PARTS = 24
_IOV_MAX = 1024  # buffers per writev (POSIX leaves it to the platform; Linux allows 1024)


# What the protocols here (and the port's multiplexer) call on a transport: asyncio's
# ``Transport`` interface, which another event loop's transports provide without subclassing
# it (uvloop's subclass no asyncio class).
_TRANSPORT_METHODS = ("write", "writelines", "close", "abort", "is_closing", "get_extra_info",
                      "pause_reading", "resume_reading", "get_write_buffer_size",
                      "set_protocol", "get_protocol")
_checked_types: set[type] = set()


def stream_transport(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """``transport`` as a bidirectional stream transport: asyncio's own, or any event loop's
    with the same methods (checked once per type; TypeError naming what one lacks)."""
    kind = type(transport)
    if kind not in _checked_types:
        missing = [m for m in _TRANSPORT_METHODS if not callable(getattr(transport, m, None))]
        if missing:
            raise TypeError(f"{kind.__module__}.{kind.__qualname__} is not a stream transport "
                            f"(it lacks {', '.join(missing)})")
        _checked_types.add(kind)
    return cast(asyncio.Transport, transport)


def _gather_fd(transport: asyncio.Transport) -> int:
    """The descriptor of a plain socket transport (TCP or Unix) whose writes may be
    gathered, or -1 (TLS, pipes, anything else: such transports get joined writes).

    Writing to it directly is sound on any loop whose ``get_write_buffer_size()`` counts
    every byte written and not yet handed to the kernel: asyncio's selector loop, and
    uvloop's (its buffer and libuv's write queue)."""
    if (transport.get_extra_info("sslcontext") is not None
            or transport.get_extra_info("ssl_object") is not None or not hasattr(os, "writev")):
        return -1
    sock = transport.get_extra_info("socket")
    try:
        return int(sock.fileno()) if sock is not None else -1
    except (AttributeError, OSError, ValueError):
        return -1


# Read from the module at each connection, not called directly (which mypyc compiles to a
# direct call): the seam through which tests give sockets tiny send buffers.
gather_fd: Callable[[asyncio.Transport], int] = _gather_fd


class _Yield(Exception):
    """This turn's share of frames or header decoding is spent: the rest of the frames read
    waits for the next turn."""


class StreamReset(GazetteError):
    """The stream ended without its status: reset by the peer or the connection lost."""

    def __init__(self, message: str, code: int = f.CANCEL) -> None:
        super().__init__(message)
        self.code = code


# Subclassed by the client's and the server's streams and connections (channel.py, server.py).
@mypyc_attr(allow_interpreted_subclasses=True)
class Stream:
    """Receive-side state of one stream and its send window."""

    __slots__ = ("id", "conn", "send_window", "messages", "waiter", "reader", "remote_closed",
                 "local_closed", "error", "buffered", "unacked")

    def __init__(self, conn: Connection, stream_id: int) -> None:
        self.id = stream_id
        self.conn = conn
        self.send_window = conn.peer_initial_window
        self.messages: collections.deque[memoryview] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.reader = f.MessageReader(conn.max_message)
        self.remote_closed = False   # END_STREAM received
        self.local_closed = False    # END_STREAM (or RST_STREAM) sent
        self.error: BaseException | None = None
        self.buffered = 0            # received DATA bytes not yet consumed
        self.unacked = 0             # consumed bytes not yet returned by a WINDOW_UPDATE

    # -- receive ---------------------------------------------------------------------

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        # Bytes are credited back to the peer as messages are consumed (len + 5 each).
        self.buffered += len(payload)
        if self.buffered > STREAM_WINDOW:
            raise StreamReset("peer sent beyond the stream's flow-control window", f.FLOW_CONTROL_ERROR)
        if end_stream:
            self.remote_closed = True  # first: a message refused below ends a closed stream
        if payload:
            msgs = self.reader.feed(payload)
            if msgs:
                self.messages.extend(msgs)
        if self.waiter is not None and (self.messages or self.remote_closed):
            w, self.waiter = self.waiter, None
            if not w.done():
                w.set_result(None)

    def credit(self, n: int) -> None:
        """``n`` received bytes were consumed: return them to the peer's send window."""
        self.buffered -= n
        self.unacked += n
        if self.unacked >= STREAM_WINDOW >> 2 and not self.remote_closed:
            self.conn.write(f.window_update(self.id, self.unacked))
            self.unacked = 0
        if self.conn._withheld is not None:
            self.conn.replenish()

    async def next_message(self) -> memoryview | None:
        """The next message, or None once the peer has ended its side."""
        while True:
            if self.messages:
                msg = self.messages.popleft()
                self.credit(len(msg) + 5)
                return msg
            if self.error is not None:
                raise self.error
            if self.remote_closed:
                if self.reader.partial:
                    raise StreamReset("stream ended within a gRPC message", f.PROTOCOL_ERROR)
                return None
            w = self.waiter = self.conn.loop.create_future()
            await w

    def fail(self, err: BaseException) -> None:
        """The stream ended abnormally: wake its reader (and window waiters) with ``err``."""
        if self.error is None:
            self.error = err
        self.local_closed = True
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result(None)
        self.conn.wake_senders()

    def on_reset(self, code: int) -> None:
        self.fail(StreamReset(f"stream reset by peer (code {code})", code))


@mypyc_attr(allow_interpreted_subclasses=True)
class Connection(asyncio.Protocol):
    """Frame handling shared by the server and client sides."""

    #: The client side (ClientConnection sets it in its __init__: a subclass's class attribute
    #: does not override a compiled class's).
    is_client: bool = False
    #: Streams the peer may have open at once (advertised and enforced by the server).
    max_concurrent_streams: int | None = None

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.loop = asyncio.get_event_loop()
        # A message's bytes return to the peer's window once it is consumed whole, so no
        # message may exceed the window.
        self.max_message = min(max_message, STREAM_WINDOW - 5)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.closed = False
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        # Streams the peer lets us have open at once (its SETTINGS_MAX_CONCURRENT_STREAMS;
        # unlimited until it says): a client beyond it would have its streams refused.
        self.peer_max_streams = f.MAX_WINDOW
        self.send_window = f.DEFAULT_WINDOW
        # Budgets, the module's constants unless the server configures them (--server.*).
        self.connection_window = CONNECTION_WINDOW
        self.connection_buffer_cap = CONNECTION_BUFFER_CAP
        self.write_backlog_limit = WRITE_BACKLOG_LIMIT
        self._reader = f.FrameReader(MAX_FRAME)
        self._decoder = HeaderDecoder(HEADER_TABLE_SIZE, MAX_HEADER_LIST_SIZE)
        self._blocks: dict[bytes, tuple[list[tuple[str, str]], str | None]] = {}
        self._conn_unacked = 0
        self._withheld: asyncio.TimerHandle | None = None  # while the connection window waits
        self._continuation: tuple[int, int, list[bytes]] | None = None  # stream, flags, parts
        # The frame type the next frame must have: the peer's preface is a SETTINGS frame
        # (RFC 9113 3.4), a header block goes on in CONTINUATIONs; else None.
        self._expect: int | None = f.SETTINGS
        self._send_waiters: list[asyncio.Future[None]] = []
        self._paused = False
        self._fd = -1  # a socket whose writes may be gathered (see flush)
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._ping_acks: dict[bytes, Callable[[], None]] = {}
        self._continuation_bytes = 0
        self._continuation_frames = 0
        # Servers bound the control frames a client may make them answer (see _calm).
        self.calm: RateLimit | None = None
        self._turn_work = 0  # header block bytes decoded in this turn (see HEADER_WORK_PER_TURN)
        self._backlog: Iterator[tuple[int, int, int, memoryview]] | None = None
        self._hold = 0       # reasons the transport is not read (bits: _BACKLOG, ...)
        self._reset_sent: dict[int, None] = {}  # streams we reset lately, oldest first

    # -- transport events ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = stream_transport(transport)
        self._fd = gather_fd(t)
        head = f.PREFACE if self.is_client else b""
        settings = {
            f.SETTINGS_ENABLE_PUSH: 0,
            f.SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            f.SETTINGS_MAX_FRAME_SIZE: MAX_FRAME,
            f.SETTINGS_HEADER_TABLE_SIZE: HEADER_TABLE_SIZE,
            f.SETTINGS_MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
        }
        if self.max_concurrent_streams is not None:
            settings[f.SETTINGS_MAX_CONCURRENT_STREAMS] = self.max_concurrent_streams
        t.write(head + f.settings_frame(settings)
                + f.window_update(0, self.connection_window - f.DEFAULT_WINDOW))

    def data_received(self, data: bytes) -> None:
        if self._backlog is not None:  # read though paused (a transport may deliver what it holds)
            self._backlog = itertools.chain(self._backlog, self._reader.feed(data))
            return
        self._run(self._reader.feed(data))

    def _run(self, frames: Iterator[tuple[int, int, int, memoryview]]) -> None:
        self._turn_work = 0
        budget = FRAMES_PER_TURN
        try:
            for ftype, flags, sid, payload in frames:
                self._on_frame(ftype, flags, sid, payload)
                budget -= 1
                if not budget:
                    raise _Yield
        except _Yield:  # raised between frames: the rest of them is intact
            if not self.closed:
                self._backlog = frames
                self.set_reading(_BACKLOG, False)
                self.loop.call_soon(self._run_backlog)
        # A name per clause: compiled, mypyc types ``err`` by its first binding and would
        # check an HpackError bound to it against ProtocolError (a TypeError instead).
        except f.ProtocolError as err:
            self.connection_error(str(err), err.code)
        except HpackError as hpack_err:
            self.connection_error(f"bad header block: {hpack_err}", f.COMPRESSION_ERROR)
        self.frames_done()

    def frames_done(self) -> None:
        """The frames of one read (or of one turn's share of them) are handled (the server
        dispatches the calls it deferred to this point: ``server.py``)."""

    def _run_backlog(self) -> None:
        frames, self._backlog = self._backlog, None
        if frames is None or self.closed:
            return
        self._run(frames)
        if self._backlog is None:
            self.set_reading(_BACKLOG, True)

    def set_reading(self, reason: int, on: bool) -> None:
        """Stops (or resumes) reading the transport for ``reason`` (a bit): it is read while
        no reason holds it."""
        was = self._hold
        self._hold = was & ~reason if on else was | reason
        transport = self.transport
        if transport is None or self.closed or bool(was) == bool(self._hold):
            return
        if self._hold:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._backlog = None
        if self._withheld is not None:
            self._withheld.cancel()
            self._withheld = None
        err = StreamReset(f"connection lost: {exc}" if exc else "connection closed", f.CANCEL)
        for stream in list(self.streams.values()):
            stream.fail(err)
        self.streams.clear()
        self.wake_senders()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._hold & _WRITE_BACKLOG:
            self.set_reading(_WRITE_BACKLOG, True)
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def write(self, data: bytes | memoryview) -> None:
        """Queues ``data`` (whole frames) for the transport. Frames written within one turn
        of the event loop leave in one send: a unary response (headers, message, trailers)
        or a small append (headers, three messages, end) costs one syscall, not five; but
        never more than ``FLUSH_PARTS`` writes wait for the turn's end."""
        if self.transport is None or self.closed:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _JOIN_LIMIT * 8 or len(self._out) >= FLUSH_PARTS:
            self.flush()  # a producer that does not yield still meets the transport's back-pressure
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def write_large(self, head: bytes, body: bytes | memoryview) -> None:
        """Writes a frame with a large payload now: queued frames, ``head`` and ``body`` leave
        in order, in one gathered write (``body`` uncopied)."""
        if self.transport is None or self.closed:
            return
        if head:
            self._out.append(head)
        self._out.append(body)
        self.flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        self._out_bytes = 0
        out = self._out
        transport = self.transport
        if not out or transport is None or self.closed:
            out.clear()
            return
        if len(out) == 1:
            transport.write(out[0])
        elif self._fd >= 0 and not transport.get_write_buffer_size():
            self._gather(transport, out)
        else:
            transport.write(b"".join(out))
        out.clear()
        if self._paused and transport.get_write_buffer_size() > self.write_backlog_limit:
            self.set_reading(_WRITE_BACKLOG, False)  # until resume_writing

    def _gather(self, transport: asyncio.Transport, out: list[bytes | memoryview]) -> None:
        # With nothing buffered in the transport, writing to its socket directly keeps the
        # order, and one writev replaces a join (a copy of every part) or a send per part
        # (each of which, on loopback, runs the receiver's TCP stack and may wake it).
        # What the socket does not take goes to the transport, which then owns the rest.
        try:
            n = os.writev(self._fd, out if len(out) <= _IOV_MAX else out[:_IOV_MAX])
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            transport.write(b"".join(out))  # the transport reports the failure its own way
            return
        for part in out:
            size = len(part)
            if n >= size:
                n -= size
                continue
            transport.write(memoryview(part)[n:] if n else part)
            n = 0

    def connection_error(self, message: str, code: int = f.PROTOCOL_ERROR) -> None:
        _ERROR_LOG.warning(message, self.peer())
        if self.transport is not None and not self.closed:
            self.write(f.goaway(self.last_peer_stream(), code, message.encode()[:256]))
            self.flush()
            self.close_after_goaway(self.transport)
        self.connection_lost(ConnectionError(message))

    def close_after_goaway(self, transport: asyncio.Transport) -> None:
        """Closes the transport once a GOAWAY is written (a server lingers, see its own)."""
        transport.close()

    def peer(self) -> str:
        name = self.transport.get_extra_info("peername") if self.transport is not None else None
        if isinstance(name, tuple) and len(name) >= 2:
            family = "ipv6" if ":" in str(name[0]) else "ipv4"
            host = f"[{name[0]}]" if family == "ipv6" else name[0]
            return f"{family}:{host}:{name[1]}"
        return f"unix:{name}" if name else "unknown"

    # -- frames ----------------------------------------------------------------------

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: memoryview) -> None:
        if self._expect is not None:
            if ftype != self._expect:
                raise f.ProtocolError(f"expected a {'SETTINGS' if self._expect == f.SETTINGS else 'CONTINUATION'} "
                                      f"frame, not type {ftype}")
            if ftype == f.SETTINGS:
                if flags & f.ACK:
                    raise f.ProtocolError("the peer's preface is a SETTINGS ACK")
                self._expect = None
        if ftype == f.DATA:
            self._on_data(flags, sid, payload)
        elif ftype == f.HEADERS:
            if sid == 0:
                raise f.ProtocolError("HEADERS on stream 0")
            block = f.strip_padding(flags, payload, priority=True)
            self._check_header_block(len(block), 0)  # before any HPACK work
            if flags & f.END_HEADERS:
                self._on_header_block(sid, flags, bytes(block))
            else:
                self._continuation = (sid, flags, [bytes(block)])
                self._expect = f.CONTINUATION
                self._continuation_bytes, self._continuation_frames = len(block), 0
        elif ftype == f.CONTINUATION:
            if self._continuation is None or self._continuation[0] != sid:
                raise f.ProtocolError("unexpected CONTINUATION frame")
            self._continuation_bytes += len(payload)
            self._continuation_frames += 1
            self._check_header_block(self._continuation_bytes, self._continuation_frames)
            self._continuation[2].append(bytes(payload))
            if flags & f.END_HEADERS:
                csid, cflags, parts = self._continuation
                self._continuation = self._expect = None
                self._on_header_block(csid, cflags, b"".join(parts))
        elif ftype == f.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == f.SETTINGS:
            if sid != 0:
                raise f.ProtocolError("SETTINGS on a stream")
            if flags & f.ACK:
                if len(payload):
                    raise f.ProtocolError("SETTINGS ACK with a payload", f.FRAME_SIZE_ERROR)
                return
            self._calm()
            self._on_settings(f.parse_settings(payload))
            self.write(f.frame(f.SETTINGS, f.ACK, 0))
        elif ftype == f.PING:
            if sid != 0:
                raise f.ProtocolError("PING on a stream")
            if len(payload) != 8:
                raise f.ProtocolError("PING of the wrong size", f.FRAME_SIZE_ERROR)
            if flags & f.ACK:
                cb = self._ping_acks.pop(bytes(payload), None)
                if cb is not None:
                    cb()
            else:
                self._calm()
                self.write(f.frame(f.PING, f.ACK, 0, bytes(payload)))
        elif ftype == f.RST_STREAM:
            if sid == 0:
                raise f.ProtocolError("RST_STREAM on stream 0")
            if len(payload) != 4:
                raise f.ProtocolError("RST_STREAM of the wrong size", f.FRAME_SIZE_ERROR)
            if self.stream_is_idle(sid):
                raise f.ProtocolError(f"RST_STREAM on idle stream {sid}")
            self._calm()  # Opening and resetting streams in a loop ("rapid reset").
            stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.on_reset(f.u32(payload))
        elif ftype == f.GOAWAY:
            if sid != 0:
                raise f.ProtocolError("GOAWAY on a stream")
            if len(payload) < 8:
                raise f.ProtocolError("GOAWAY too short", f.FRAME_SIZE_ERROR)
            self.on_goaway(f.u32(payload) & 0x7FFFFFFF, f.u32(payload, 4), bytes(payload[8:]))
        elif ftype == f.PUSH_PROMISE:
            raise f.ProtocolError("PUSH_PROMISE though push is disabled")
        elif ftype == f.PRIORITY:
            if sid == 0:
                raise f.ProtocolError("PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error(sid, f.FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
                return
            self._calm()  # Otherwise ignored, as RFC 9113 deprecates priorities.
        # Unknown frame types are ignored, as RFC 9113 requires.

    def replenish(self) -> None:
        """Return received bytes to the peer's connection window, unless the streams hold
        more than CONNECTION_BUFFER_CAP of unread data: then look again as they consume it
        (and every 50 ms, as streams that end take their unread data with them)."""
        if self._withheld is not None:
            self._withheld.cancel()
            self._withheld = None
        if self.closed or self._conn_unacked < self.connection_window >> 2:
            return
        if self.withhold(self.buffered_bytes()):
            self._withheld = self.loop.call_later(0.05, self.replenish)
            return
        self.write(f.window_update(0, self._conn_unacked))
        self._conn_unacked = 0

    def buffered_bytes(self) -> int:
        """Request data received and not yet consumed, in all streams."""
        return sum(s.buffered for s in self.streams.values())

    def withhold(self, held: int) -> bool:
        """Whether the connection window is withheld, the streams holding ``held`` bytes."""
        return held > self.connection_buffer_cap

    def _stream_error(self, sid: int, code: int, message: str) -> None:
        """A stream error: the stream is reset (failing its reader), or, closed already,
        the peer is told with a bare RST_STREAM."""
        stream = self.streams.get(sid)
        if stream is not None:
            self.reset_stream(stream, code, f.ProtocolError(message))
        else:
            self.send_reset(sid, code)

    def _check_header_block(self, size: int, continuations: int) -> None:
        # A block we do not decode leaves the connection's HPACK state unknown: RFC 9113 4.3
        # requires the connection to end then, with COMPRESSION_ERROR ("if it does not
        # decompress a field block"). Decoding it instead, to refuse just its stream, would
        # cost time in proportion to whatever the peer sends; a peer told our
        # SETTINGS_MAX_HEADER_LIST_SIZE has no business sending more.
        if size > MAX_HEADER_BLOCK:
            raise f.ProtocolError(f"header block over {MAX_HEADER_BLOCK} bytes", f.COMPRESSION_ERROR)
        if continuations > MAX_CONTINUATIONS:
            raise f.ProtocolError(f"header block of over {MAX_CONTINUATIONS} CONTINUATION frames",
                                  f.ENHANCE_YOUR_CALM)

    def _calm(self) -> None:
        if self.calm is not None and not self.calm.take():
            raise f.ProtocolError("too many control frames or stream resets",
                                  f.ENHANCE_YOUR_CALM)

    def _on_window_update(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise f.ProtocolError("WINDOW_UPDATE of the wrong size", f.FRAME_SIZE_ERROR)
        inc = f.u32(payload) & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise f.ProtocolError("WINDOW_UPDATE of zero on the connection")
            if self.send_window + inc > f.MAX_WINDOW:
                raise f.ProtocolError("connection window over 2^31-1", f.FLOW_CONTROL_ERROR)
            self.send_window += inc
        else:
            if self.stream_is_idle(sid):
                raise f.ProtocolError(f"WINDOW_UPDATE on idle stream {sid}")
            if inc == 0:  # Malformed even on a closed stream (RFC 9113 6.9).
                self._stream_error(sid, f.PROTOCOL_ERROR, "WINDOW_UPDATE of zero")
                return
            stream = self.streams.get(sid)
            if stream is None:
                return  # A closed stream's update is harmless (RFC 9113 6.9).
            if stream.send_window + inc > f.MAX_WINDOW:
                self._stream_error(sid, f.FLOW_CONTROL_ERROR, "stream window over 2^31-1")
                return
            stream.send_window += inc
        self.wake_senders()

    def _on_data(self, flags: int, sid: int, payload: memoryview) -> None:
        n = len(payload)
        self._conn_unacked += n
        if self._conn_unacked >= self.connection_window >> 2 and self._withheld is None:
            self.replenish()
        stream = self.streams.get(sid)
        if stream is None:
            # Checked only off the open-stream path: DATA on stream 0 or an idle stream is a
            # connection error; on a closed one it counts toward the connection only, and the
            # peer learns the stream is closed (RFC 9113 5.1: a stream error, STREAM_CLOSED).
            if sid == 0 or self.stream_is_idle(sid):
                raise f.ProtocolError(f"DATA on {'stream 0' if sid == 0 else f'idle stream {sid}'}")
            if sid not in self._reset_sent:  # frames after our RST_STREAM are ignored (5.1)
                self.send_reset(sid, f.STREAM_CLOSED)
            return
        if stream.remote_closed:  # DATA after END_STREAM (RFC 9113 5.1: half-closed remote)
            self.reset_stream(stream, f.STREAM_CLOSED, f.ProtocolError("DATA after END_STREAM"))
            return
        content = f.strip_padding(flags, payload, priority=False) if flags & f.PADDED else payload
        try:
            stream.on_data(content, bool(flags & f.END_STREAM))
            if len(content) != n:
                stream.credit(n - len(content))
        # A name per clause: mypyc types a name by its first binding (see _run).
        except f.MessageRefused as refused:
            self.message_refused(stream, refused)
        except f.ProtocolError as bad:
            self.reset_stream(stream, f.PROTOCOL_ERROR, bad)
        except StreamReset as reset:
            self.reset_stream(stream, reset.code, reset)
        else:
            if stream.remote_closed:
                self.on_remote_closed(stream)

    def _on_header_block(self, sid: int, flags: int, block: bytes) -> None:
        cached = self._blocks.get(block)
        if cached is not None:
            headers, malformed = cached
        else:
            self._turn_work += len(block)
            decoder = self._decoder
            was_empty = decoder.table_empty
            headers, over = decoder.decode(block) if block else ([], False)
            if over:
                # Decoded (the HPACK state stays good) but over what we advertised.
                self.header_list_too_large(sid, bool(flags & f.END_STREAM))
                if self._turn_work > HEADER_WORK_PER_TURN:
                    raise _Yield
                return
            malformed = self.check_headers(headers)
            # A block decoded with an empty dynamic table that leaves it empty (and does not
            # resize it) neither reads nor changes HPACK state, so the same bytes always mean
            # the same headers (and verdict): peers that never index (ours) are decoded and
            # checked once per block. Small blocks only, and a bounded number of them.
            if (was_empty and decoder.table_empty and block and block[0] & 0xE0 != 0x20
                    and len(block) <= _CACHED_BLOCK and len(self._blocks) < _CACHED_BLOCKS):
                self._blocks[block] = (headers, malformed)
        self.on_headers(sid, headers, bool(flags & f.END_STREAM), malformed)
        if self._turn_work > HEADER_WORK_PER_TURN:
            raise _Yield  # checked here, off the path of DATA frames

    def _on_settings(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == f.SETTINGS_ENABLE_PUSH:
                if value > 1 or (value == 1 and self.is_client):  # A server may not push-enable.
                    raise f.ProtocolError(f"bad SETTINGS_ENABLE_PUSH {value}")
            elif key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.ProtocolError("initial window too large", f.FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > f.MAX_WINDOW:
                        raise f.ProtocolError("a stream window over 2^31-1",
                                              f.FLOW_CONTROL_ERROR)
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise f.ProtocolError("bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self.wake_senders()

    # -- hooks of the server and client --------------------------------------------------

    def check_headers(self, headers: list[tuple[str, str]]) -> str | None:
        """Why ``headers`` are malformed as what the peer opens streams with, or None (the
        verdict reaches ``on_headers``, cached with the block's decoding)."""
        return None

    def on_headers(self, sid: int, headers: list[tuple[str, str]], end_stream: bool,
                   malformed: str | None) -> None:
        raise NotImplementedError

    def header_list_too_large(self, sid: int, end_stream: bool) -> None:
        """A header block on ``sid`` decoded to more than MAX_HEADER_LIST_SIZE."""
        self._stream_error(sid, f.PROTOCOL_ERROR, "header list over its maximum size")

    def stream_is_idle(self, sid: int) -> bool:
        """Whether stream ``sid`` was never opened (frames other than HEADERS and PRIORITY
        on it are a connection error)."""
        return False

    def on_remote_closed(self, stream: Stream) -> None:
        """The peer ended its side of ``stream`` (after its last message was queued)."""

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        raise NotImplementedError

    def message_refused(self, stream: Stream, err: f.MessageRefused) -> None:
        self.reset_stream(stream, f.CANCEL, StreamReset(str(err)))

    def last_peer_stream(self) -> int:
        return 0

    # -- sending ---------------------------------------------------------------------

    def wake_senders(self) -> None:
        waiters, self._send_waiters = self._send_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def send_headers(self, stream: Stream, block: bytes, end_stream: bool) -> None:
        if stream.local_closed or self.closed:
            return
        self.write_block(stream.id, block, end_stream)
        if end_stream:
            stream.local_closed = True

    def write_block(self, sid: int, block: bytes, end_stream: bool) -> None:
        """Writes header block ``block`` on ``sid``: a HEADERS frame, followed by
        CONTINUATION frames if it is larger than the peer's SETTINGS_MAX_FRAME_SIZE."""
        flags = _HEADERS_FLAG_END if end_stream else f.END_HEADERS
        if len(block) <= self.peer_max_frame:
            self.write(f.frame(f.HEADERS, flags, sid, block))
            return
        step = self.peer_max_frame
        parts = [block[i:i + step] for i in range(0, len(block), step)]
        out = [f.frame(f.HEADERS, flags & f.END_STREAM, sid, parts[0])]
        for i, part in enumerate(parts[1:], 1):
            out.append(f.frame(f.CONTINUATION, f.END_HEADERS if i == len(parts) - 1 else 0, sid, part))
        self.write(b"".join(out))

    def try_send_message(self, stream: Stream, data: bytes | memoryview, end_stream: bool = False) -> bool:
        """Sends one gRPC message on ``stream`` if it fits the windows and the transport is
        not paused, without waiting; False (nothing sent) otherwise."""
        total = len(data) + 5
        if (total > stream.send_window or total > self.send_window or total > self.peer_max_frame
                or self._paused or stream.local_closed or self.closed):
            return False
        stream.send_window -= total
        self.send_window -= total
        head = f.frame_head(f.DATA, f.END_STREAM if end_stream else 0, stream.id, total) + f.message_prefix(total - 5)
        if total <= _JOIN_LIMIT:
            self.write(head + data)
        else:
            self.write_large(head, data)
        if end_stream:
            stream.local_closed = True
        return True

    async def send_message(self, stream: Stream, data: bytes | memoryview, end_stream: bool = False) -> None:
        """Sends one gRPC message on ``stream`` within the peer's windows."""
        if not self.try_send_message(stream, data, end_stream):
            await self._send_chunked(stream, f.message_prefix(len(data)), data, f.END_STREAM if end_stream else 0)
            if end_stream:
                stream.local_closed = True

    def write_end(self, stream: Stream) -> None:
        """Ends our side of ``stream`` with an empty DATA frame."""
        if not stream.local_closed and not self.closed:
            self.write(f.frame(f.DATA, f.END_STREAM, stream.id))
        stream.local_closed = True

    async def _send_chunked(self, stream: Stream, prefix: bytes, data: bytes | memoryview, flags: int) -> None:
        view = memoryview(data)
        pending: list[bytes | memoryview] = [prefix]
        if len(view):
            pending.append(view)
        first, plen = 0, len(prefix)
        remaining = plen + len(view)
        while remaining:
            if stream.local_closed or self.closed:
                raise stream.error or StreamReset("stream closed while sending", f.CANCEL)
            if self._paused:
                w = self.loop.create_future()
                self._drain_waiters.append(w)
                await w
                continue
            n = min(remaining, stream.send_window, self.send_window, self.peer_max_frame)
            if n <= 0:
                w = self.loop.create_future()
                self._send_waiters.append(w)
                await w
                continue
            # The frame's payload: what's left of the prefix, then the body.
            chunks: list[bytes | memoryview] = []
            take = n
            while take:
                head = pending[first]
                if len(head) <= take:
                    chunks.append(head)
                    take -= len(head)
                    first += 1
                else:
                    chunks.append(head[:take])
                    pending[first] = head[take:]
                    take = 0
            remaining -= n
            stream.send_window -= n
            self.send_window -= n
            last = flags if remaining == 0 else 0
            head = f.frame_head(f.DATA, last, stream.id, n)
            if n <= _JOIN_LIMIT:
                self.write(head + b"".join(chunks))
            else:
                self.write(head)
                for c in chunks[:-1]:
                    self.write(c)
                self.write_large(b"", chunks[-1])

    def send_reset(self, sid: int, code: int) -> None:
        """Writes RST_STREAM ``code`` on ``sid``, remembering (a bounded number of) the
        streams reset: what the peer had sent on them before it learns is ignored, as RFC
        9113 5.1 requires, rather than answered."""
        self.write(f.rst_stream(sid, code))
        reset = self._reset_sent
        reset[sid] = None
        if len(reset) > _RESETS_KEPT:
            del reset[next(iter(reset))]

    def reset_stream(self, stream: Stream, code: int, err: BaseException | None = None) -> None:
        """Resets ``stream`` (RST_STREAM ``code``) and fails it locally."""
        if not stream.local_closed or not stream.remote_closed:
            self.send_reset(stream.id, code)
        self.streams.pop(stream.id, None)
        stream.remote_closed = True
        stream.fail(err or StreamReset(f"stream reset (code {code})", code))

    def ping(self, opaque: bytes, on_ack: Callable[[], None]) -> None:
        self._ping_acks[opaque] = on_ack
        self.write(f.frame(f.PING, 0, 0, opaque))

    def forget_ping(self, opaque: bytes) -> None:
        self._ping_acks.pop(opaque, None)

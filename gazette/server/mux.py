"""One public port for gRPC and HTTP/1.1, shared by brokers and consumers.

The public port is an asyncio server that looks at the first bytes of each connection. By
default gRPC is served in this process by :mod:`gazette.rpc`, and a connection starting with the
HTTP/2 preface is handed to its protocol (``h2_protocol_factory``) just as HTTP/1.x goes to
aiohttp's, with the bytes already read (no copy, no second hop).

With grpcio serving gRPC instead (``GAZETTE_RPC=grpcio``: grpcio owns its listeners and cannot
share one with aiohttp), the preface means: connect to grpcio's private Unix socket, forward the
bytes already read, and splice the two sockets in the kernel (:mod:`gazette.server.splice`).

Invariants: a connection is handed on whole, its sniffed bytes first; after ``close()`` the
listener is gone but connections already handed on keep flowing (graceful stops finish their
RPCs); ``abort()`` ends whatever splices remain, and waits. A connection that says nothing
for ``first_bytes_timeout`` seconds is closed, and beyond ``max_connections`` open ones a new
connection is closed at once (each holds a socket, buffers and a protocol: bounded).

Descriptors: connections may hold no more than the process's soft ``RLIMIT_NOFILE`` less a
reserve and the descriptors held otherwise (:class:`gazette.server.fds.FdBudget`). At that
point a new connection sheds the oldest idle or slow ones (HTTP/1.1 keep-alive idle first,
then silent and slow-head ones, then HTTP/2 connections without streams; a connection serving
a request is never shed) and is refused only when none may be. Connections are accepted by
our own :class:`_Listener` rather than asyncio's server: a failed ``accept()`` (out of
descriptors anyway) pauses that listener a second, sheds, and logs one line per interval
with a count (asyncio's loop retried the rest of its batch and multiplied its retries: the
issue's thousands of tracebacks). Refusals log one line per interval, too.

The mux runs on asyncio's loop and on uvloop alike: it drives transports through asyncio's
``Transport`` methods only (``gazette.rpc.connection.stream_transport``; uvloop's subclass no
asyncio class), hands a connection on with ``set_protocol`` (which both loops' transports
support) and takes a socket out of the loop through a duplicate of the descriptor that both
report as ``get_extra_info("socket")``.

With TLS (``tls``: Gazette's ``--*.server-cert-file`` and friends) the listener completes the
handshake first (within ``HANDSHAKE_TIMEOUT``; ALPN offers ``h2`` and ``http/1.1``) and sniffs
the decrypted bytes the same way. A connection in its handshake holds a descriptor: it counts
as open from its accept, is shed as a silent connection is (its handshake cancelled), and at
capacity with nothing to shed a new one is closed at accept rather than handshaken and refused; our gRPC server and aiohttp run unchanged over the TLS
transport, and grpcio's connections are relayed through the loop (:class:`_Relay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any, cast

from gazette.rpc.connection import stream_transport
from gazette.rpc.tls import HANDSHAKE_TIMEOUT, ServerTLS
from gazette.server.fds import ACCEPT_BURST, RESOURCE_ERRNOS, FdBudget
from gazette.server.http import CLIENT_LOG, RANK_IDLE_H2, RANK_SLOW_HEAD
from gazette.server.logs import EveryInterval
from gazette.server.splice import CLOSING, SPLICE, Helper, Splice, join_threads
from gazette.tasks import Supervisor

log = logging.getLogger(__name__)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SNIFF_LEN = 4  # b"PRI " is never the start of an HTTP/1.x request line method we serve
FIRST_BYTES_TIMEOUT = 10.0  # seconds a new connection may stay silent
MAX_CONNECTIONS = 8192      # open connections per port
_PRUNE_MIN = 64             # closed transports the admission table may hold before a prune


class _Sniffer(asyncio.Protocol):
    """Buffers the first bytes of a connection, then hands it to gRPC or HTTP."""

    def __init__(self, mux: Multiplexer, *, accepting: bool = False,
                 handshake: asyncio.Task[None] | None = None) -> None:
        self._mux = mux
        self._handshake = handshake  # the task making a TLS connection's transport, if any
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.accepting = accepting  # counted in the mux's ``accepting`` until admitted

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        self._transport = transport = stream_transport(base)
        if self.accepting:
            self.accepting = False
            self._mux.admitted_or_gone()
        if self._handshake is not None:  # done: from now on it is an admitted transport
            self._mux._handshakes.pop(self._handshake, None)
            self._handshake = None
        if not self._mux.admit(transport):
            transport.abort()  # the mux logged it (once per interval)
            return
        self._timer = asyncio.get_running_loop().call_later(
            self._mux.first_bytes_timeout, transport.abort)

    def shed_rank(self) -> int | None:
        return RANK_SLOW_HEAD  # silent, or not yet a whole sniff: as slow as a slow head

    def shed(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._buf += data
        if len(self._buf) < _SNIFF_LEN and H2_PREFACE.startswith(bytes(self._buf)):
            return
        if bytes(self._buf[:_SNIFF_LEN]) == H2_PREFACE[:_SNIFF_LEN]:
            if self._mux.h2_protocol_factory is not None:
                self._hand_to(self._mux.h2_protocol_factory)
            elif self._mux.tls is not None:  # the kernel cannot splice what TLS encrypts
                self._hand_to(lambda: _Relay(self._mux))
            else:
                self._splice_grpc()
        else:
            self._hand_to(self._mux.http_protocol_factory)

    def _hand_to(self, factory: Callable[[], asyncio.Protocol]) -> None:
        assert self._transport is not None
        proto: Any = factory()
        self._transport.set_protocol(proto)
        proto.connection_made(self._transport)
        data, self._buf = bytes(self._buf), bytearray()
        proto.data_received(data)

    def _splice_grpc(self) -> None:
        """Takes the socket out of the event loop (a duplicate of its fd; the transport, which
        has written nothing, closes its own) and splices it."""
        transport = self._transport
        assert transport is not None
        transport.pause_reading()
        data, self._buf = bytes(self._buf), bytearray()
        try:
            client = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        except OSError as err:
            log.warning("gRPC splice: cannot take the connection's socket: %s", err)
            transport.abort()
            return
        transport.set_protocol(asyncio.Protocol())  # its connection_lost is no concern of ours
        transport.close()
        self._mux._splice(client, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._buf = bytearray()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


ACCEPT_RETRY_DELAY = 1.0  # seconds a listener pauses after accept() failed for want of resources


async def _bind(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` as asyncio's ``create_server`` binds them (every
    address ``host`` resolves to; all interfaces for ``""``), each listening with a backlog of
    ``ACCEPT_BURST``; with port 0 the later ones take the first one's port."""
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio: one per family
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            try:
                sock.bind(addr)
            except OSError as err:
                raise OSError(err.errno, f"error while attempting to bind on address {addr!r}: "
                                         f"{(err.strerror or '').lower()}") from None
            sock.listen(ACCEPT_BURST)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"no address to listen on for {host!r}")
    return socks


class _Listener:
    """Accepts the connections of one listening socket and hands them to ``_Sniffer``s.

    asyncio's own accept loop (``create_server``), when ``accept()`` fails for want of
    descriptors, goes on trying the rest of its batch and schedules a retry per failure: the
    failures (each a traceback) multiply every second. Here the first such failure pauses this
    listener for ``ACCEPT_RETRY_DELAY`` and asks the multiplexer to shed; the failures are
    counted in one line per interval. A connection is admitted once its transport is made (for
    TLS, once its handshake is done, within ``HANDSHAKE_TIMEOUT``); until then it counts in
    ``Multiplexer.accepting``.

    Plain connections accepted and not yet admitted are at most ``ACCEPT_BURST``, what the
    descriptor reserve allows for (``gazette.server.fds.reserve_for``): at that many the
    listener stops reading until admissions catch up, which takes a few loop turns and no
    client's help. (uvloop makes transports a few turns later than asyncio's loop: its
    listener accepted up to 126 before admitting, and accept() ran out of descriptors.) TLS
    connections are not held so: their handshakes are the clients' to finish or stall.
    """

    def __init__(self, mux: Multiplexer, sock: socket.socket, ssl_ctx: Any) -> None:
        self.mux, self.sock, self.ssl = mux, sock, ssl_ctx
        self._loop = asyncio.get_running_loop()
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        self.held = False  # not reading: ACCEPT_BURST accepted connections await admission

    def start(self) -> None:
        self._retry = None
        if not self._closed and not self.held:
            self._loop.add_reader(self.sock.fileno(), self._accept)

    def release(self) -> None:
        """Admissions caught up: read the listening socket again (unless paused otherwise)."""
        self.held = False
        if self._retry is None:
            self.start()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._retry is not None:
                self._retry.cancel()
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def _accept(self) -> None:
        room = ACCEPT_BURST if self.ssl is not None else ACCEPT_BURST - self.mux.accepting
        if room <= 0:
            self.held = True
            self._loop.remove_reader(self.sock.fileno())
            return
        for _ in range(room):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # gone before we took it
            except OSError as err:
                self._pause(err)
                return
            conn.setblocking(False)
            if self.ssl is not None and not self.mux.make_room():
                conn.close()  # a handshake would hold a descriptor the reserve is kept for
                continue
            self.mux.accepting += 1
            task = self.mux._connecting.spawn("accept", self._connect(conn))
            if self.ssl is not None:
                self.mux._handshakes[task] = next(self.mux._seq)

    def _pause(self, err: OSError) -> None:
        self.mux.accept_failures.event(err=os.strerror(err.errno) if err.errno else str(err))
        self._loop.remove_reader(self.sock.fileno())
        self._retry = self._loop.call_later(ACCEPT_RETRY_DELAY, self.start)
        if err.errno in RESOURCE_ERRNOS:
            self.mux._accept_exhausted()

    async def _connect(self, conn: socket.socket) -> None:
        """Makes ``conn``'s transport (after its TLS handshake, with TLS) and its ``_Sniffer``,
        which stops counting in ``accepting`` as it is admitted."""
        sniffer: _Sniffer | None = None
        task = asyncio.current_task()

        def factory() -> _Sniffer:
            nonlocal sniffer
            sniffer = _Sniffer(self.mux, accepting=True, handshake=task)
            return sniffer

        handed = False
        try:
            await self._loop.connect_accepted_socket(
                factory, conn, ssl=self.ssl,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT if self.ssl is not None else None)
            handed = True
        except (TimeoutError, OSError) as err:  # a client's failed handshake, or gone already
            CLIENT_LOG.note("accept: connection failed before it was served",
                            err=f"{type(err).__name__}: {err}")
        finally:
            if task is not None:
                self.mux._handshakes.pop(task, None)
            if sniffer is None or sniffer.accepting:  # never admitted
                self.mux.admitted_or_gone()
                if sniffer is not None:
                    sniffer.accepting = False
            if not handed:
                conn.close()


def _shed_rank(proto: Any) -> int | None:
    """A connection's shedding rank (``gazette.server.http``'s ``RANK_*``); None: keep it.
    A protocol says so itself (``shed_rank()``); an HTTP/2 one without it is idle when it has
    no open stream."""
    rank = getattr(proto, "shed_rank", None)
    if callable(rank):
        return cast(int | None, rank())
    streams = getattr(proto, "streams", None)
    if isinstance(streams, dict):
        return None if streams else RANK_IDLE_H2
    return None


class _Relay(asyncio.Protocol):
    """Relays one (TLS) gRPC connection to grpcio's socket through the event loop: the
    fallback's path when the kernel cannot splice (the public side is encrypted).

    Back-pressure both ways: a side whose peer's write buffer is full stops reading; either
    side's end of stream is forwarded, and either side's loss closes the other."""

    def __init__(self, mux: Multiplexer) -> None:
        self._mux = mux
        self._client: asyncio.Transport | None = None
        self._up: asyncio.Transport | None = None
        self._pending: list[bytes] = []
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._client = stream_transport(transport)
        self._mux._relays.add(self)
        self._mux._connecting.spawn("relay connect", self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            up, _ = await loop.create_unix_connection(lambda: _Upstream(self), self._mux.grpc_socket)
        except OSError as err:
            log.warning("gRPC relay: cannot reach the grpc socket: %s", err)
            self.abort()
            return
        if self._client is None or self._client.is_closing():
            up.close()
            return
        self._up = up
        for data in self._pending:
            up.write(data)
        self._pending = []
        if self._eof and up.can_write_eof():
            up.write_eof()

    def data_received(self, data: bytes) -> None:
        if self._up is None:
            self._pending.append(data)
        else:
            self._up.write(data)

    def eof_received(self) -> bool:
        self._eof = True
        if self._up is not None and self._up.can_write_eof():
            self._up.write_eof()
        return True  # keep the TLS side open for grpcio's remaining answers

    def connection_lost(self, exc: Exception | None) -> None:
        self._mux._relays.discard(self)
        if self._up is not None:
            self._up.close()

    # Back-pressure: the client's write buffer full pauses reading from grpcio.
    def pause_writing(self) -> None:
        if self._up is not None:
            self._up.pause_reading()

    def resume_writing(self) -> None:
        if self._up is not None:
            self._up.resume_reading()

    def abort(self) -> None:
        if self._client is not None:
            self._client.abort()
        if self._up is not None:
            self._up.abort()


class _Upstream(asyncio.Protocol):
    """grpcio's side of a :class:`_Relay`."""

    def __init__(self, relay: _Relay) -> None:
        self._relay = relay

    def data_received(self, data: bytes) -> None:
        if self._relay._client is not None:
            self._relay._client.write(data)

    def eof_received(self) -> bool:
        if self._relay._client is not None:
            self._relay._client.close()  # grpcio ended the connection: end it whole
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._relay._client is not None:
            self._relay._client.close()

    def pause_writing(self) -> None:
        if self._relay._client is not None:
            self._relay._client.pause_reading()

    def resume_writing(self) -> None:
        if self._relay._client is not None:
            self._relay._client.resume_reading()


class Multiplexer:
    """Serves ``host:port``, dispatching each connection to gRPC or HTTP/1.1.

    ``h2_protocol_factory``: serve gRPC in this process with that protocol; otherwise
    ``splice_process``: splice gRPC connections in a helper process (the default), else in
    threads of this one. With ``tls`` the port speaks TLS (mTLS if it names a client CA); gRPC
    for grpcio is then relayed through the event loop rather than spliced.
    """

    def __init__(self, grpc_socket: str, http_protocol_factory: Callable[[], asyncio.Protocol],
                 *, splice_process: bool = True,
                 h2_protocol_factory: Callable[[], asyncio.Protocol] | None = None,
                 tls: ServerTLS | None = None, fd_reserve: int | None = None) -> None:
        self.grpc_socket = grpc_socket
        self.tls = tls
        self._relays: set[_Relay] = set()
        self.http_protocol_factory = http_protocol_factory
        self.h2_protocol_factory = h2_protocol_factory
        self._splice_process = splice_process and h2_protocol_factory is None and tls is None
        self._listeners: list[_Listener] = []
        self.accepting = 0  # accepted connections not yet admitted (a TLS handshake, mostly)
        self._helper: Helper | None = None
        self._ids = itertools.count(1)
        # Every gRPC connection from its classification to its end, resolved when it ends;
        # those handed to the helper, and those spliced in this process.
        self._conns: dict[int, asyncio.Future[None]] = {}
        self._in_helper: set[int] = set()
        self._local: dict[int, Splice] = {}
        self._connecting = Supervisor("mux connect", "log")
        self.closing = False
        self.aborting = False
        self.first_bytes_timeout = FIRST_BYTES_TIMEOUT
        self.max_connections = MAX_CONNECTIONS
        # Every connection's transport while it is open (handed-on ones included: a
        # protocol change keeps the transport), in the order admitted (oldest first), with
        # its admission's sequence number; closed ones are pruned (on a count, and whenever
        # the table has doubled since the last prune: at most as many closed ones as open
        # ones, plus _PRUNE_MIN, are held). Not a weak mapping: uvloop's TLS transports
        # cannot be weakly referenced.
        self._transports: dict[asyncio.Transport, int] = {}
        self._prune_at = _PRUNE_MIN
        self._seq = itertools.count()
        # TLS connections in their handshake (the task making the transport), with the sequence
        # number of their accept: they hold a descriptor each, count in ``accepting`` and are
        # shed as silent ones are (a handshake flood cannot hold the reserve for its timeout).
        self._handshakes: dict[asyncio.Task[None], int] = {}
        self.fd_budget = FdBudget(min_reserve=fd_reserve)  # --server.fd-reserve, or a tenth of the limit
        self.shed_total = 0
        self._refusals = EveryInterval(log, "refusing connections: the port is at its limit and "
                                            "none is idle or slow enough to shed", interval=10.0)
        self.accept_failures = EveryInterval(
            log, "accept failed: out of file descriptors or memory (accepting pauses a second; "
                 "shedding idle connections)", interval=10.0)
        self._sheds = EveryInterval(log, "shed idle or slow connections to keep descriptors in reserve",
                                    interval=10.0, level=logging.INFO)

    # -- admission and shedding ---------------------------------------------------------------

    def _open_count(self) -> int:
        """Open connections, exactly: prunes closed transports."""
        for t in [t for t in self._transports if t.is_closing()]:
            self._transports.pop(t, None)
        self._prune_at = max(_PRUNE_MIN, 2 * len(self._transports))
        return len(self._transports) + len(self._conns) + self.accepting

    def capacity(self) -> int:
        """How many connections the port may hold now: ``max_connections``, and the
        descriptors the process may spend on them (``FdBudget``)."""
        return min(self.max_connections, self.fd_budget.allowed(self._open_count))

    def admit(self, transport: asyncio.Transport) -> bool:
        """Whether a new connection may stay open. At capacity the oldest idle or slow
        connections are shed (with a little headroom, so that a flood does not scan on every
        accept); if none may be, the new one is refused."""
        if not self.make_room():
            return False
        self._transports[transport] = next(self._seq)
        if len(self._transports) >= self._prune_at:  # amortised: a scan per doubling
            self._open_count()
        return True

    def make_room(self) -> bool:
        """Whether one more connection fits (shedding to make room, see :meth:`admit`): asked
        at admission, and for TLS already at accept, before a handshake takes a descriptor."""
        cap = self.capacity()
        if len(self._transports) + len(self._conns) + self.accepting >= cap:  # an upper bound: closed ones linger
            n = self._open_count()
            if n >= cap:
                n -= self.shed(n - cap + 1 + max(1, cap // 64))
                if n >= cap:
                    self._refusals.event(open=n, capacity=cap)
                    return False
        return True

    def shed(self, count: int) -> int:
        """Closes up to ``count`` connections, lowest shedding rank first and oldest first
        within a rank: HTTP/1.1 keep-alive idle ones, then silent or slow-head ones, then
        HTTP/2 connections without streams (a protocol's ``shed_rank()``; None: never); a TLS
        connection still in its handshake ranks as a silent one (its handshake is cancelled).
        Returns how many it closed."""
        ranked: list[tuple[int, int, asyncio.Transport | asyncio.Task[None]]] = []
        for t, seq in list(self._transports.items()):
            if t.is_closing():
                continue
            rank = _shed_rank(t.get_protocol())
            if rank is not None:
                ranked.append((rank, seq, t))
        ranked.extend((RANK_SLOW_HEAD, seq, task) for task, seq in self._handshakes.items() if not task.done())
        ranked.sort(key=lambda r: (r[0], r[1]))
        victims = ranked[:max(0, count)]
        for _, _, victim in victims:
            if isinstance(victim, asyncio.Task):
                victim.cancel()  # its connection closes as the handshake ends (_Listener._connect)
                self._handshakes.pop(victim, None)
                continue
            proto: Any = victim.get_protocol()
            shed = getattr(proto, "shed", None)
            if callable(shed):
                shed()
            else:
                victim.close()
            if not victim.is_closing():  # a protocol that would not: end it
                victim.abort()
            self._transports.pop(victim, None)
        self.shed_total += len(victims)
        if victims:
            self._sheds.event(len(victims))
        return len(victims)

    def admitted_or_gone(self) -> None:
        """A connection counted in ``accepting`` was admitted, or ended first: a listener
        held at ``ACCEPT_BURST`` of them reads again."""
        self.accepting -= 1
        if self.accepting < ACCEPT_BURST:
            for listener in self._listeners:
                if listener.held:
                    listener.release()

    def _accept_exhausted(self) -> None:
        """``accept()`` failed for want of descriptors: free some for when it resumes."""
        self.shed(max(1, self.capacity() // 32))

    @property
    def spliced(self) -> int:
        """How many gRPC connections are being spliced (or set up) now."""
        return len(self._conns)

    @property
    def helper_pid(self) -> int | None:
        """The splice helper's process id, while it runs."""
        return self._helper.proc.pid if self._helper is not None and self._helper.alive else None

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        if self._splice_process:
            try:
                self._helper = Helper(self)
            except (OSError, subprocess.SubprocessError) as err:
                log.warning("gRPC splice helper did not start (%s); splicing in the broker process", err)
        try:
            ssl_ctx = self.tls.context if self.tls is not None else None
            socks = await _bind(loop, host, port)
        except BaseException:  # e.g. the port is taken: the helper has nothing to do
            await self.abort()
            raise
        self._listeners = [_Listener(self, sock, ssl_ctx) for sock in socks]
        for listener in self._listeners:
            listener.start()
        return int(socks[0].getsockname()[1])

    # -- connections ---------------------------------------------------------------------

    def _splice(self, client: socket.socket, prefix: bytes) -> None:
        if self.aborting:
            client.close()
            return
        cid = next(self._ids)
        self._conns[cid] = asyncio.get_running_loop().create_future()
        self._connecting.spawn(f"connection {cid}", self._connect(cid, client, prefix))

    async def _connect(self, cid: int, client: socket.socket, prefix: bytes) -> None:
        """Connects to grpcio, forwards the sniffed bytes and starts the splice."""
        loop = asyncio.get_running_loop()
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.setblocking(False)
            await loop.sock_connect(up, self.grpc_socket)
            await loop.sock_sendall(up, prefix)
        except OSError as err:
            log.warning("gRPC splice: cannot reach the grpc socket: %s", err)
            up.close()
            client.close()
            self.finished(cid)
            return
        except BaseException:
            up.close()
            client.close()
            self.finished(cid)
            raise
        if self._helper is not None and self._helper.alive:
            self._in_helper.add(cid)
            self._helper.send(SPLICE, cid, [client, up])
            return
        sp = Splice(client, up, closing=lambda: self.closing,
                    on_done=lambda: self._finished_threadsafe(loop, cid))
        self._local[cid] = sp
        sp.start()

    def _finished_threadsafe(self, loop: asyncio.AbstractEventLoop, cid: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(self.finished, cid)

    def finished(self, cid: int) -> None:
        self._in_helper.discard(cid)
        self._local.pop(cid, None)
        fut = self._conns.pop(cid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def helper_gone(self, helper: Helper) -> None:
        """Resolves every connection the helper held: they ended with it."""
        if self._helper is helper:
            self._helper = None
        for cid in list(self._in_helper):
            self.finished(cid)

    # -- stopping ------------------------------------------------------------------------

    async def close(self) -> None:
        """Stops listening. Spliced gRPC connections carry on until grpcio ends them (its
        graceful stop), or ``abort()``."""
        if not self.closing:
            self.closing = True
            if self._helper is not None and self._helper.alive:
                self._helper.send(CLOSING, 0, [])
            for sp in list(self._local.values()):
                sp.server_closing()
        for listener in self._listeners:
            listener.close()

    async def abort(self, within: float = 5.0) -> None:
        """Stops listening, ends every spliced connection and the helper, and waits (at most
        ``within`` seconds) for them."""
        await self.close()
        self.aborting = True
        connecting = self._connecting.tasks
        for t in connecting:
            t.cancel()
        if connecting:  # bounded: a connect stuck in the kernel must not hold the stop
            await asyncio.wait(connecting, timeout=within)
        for relay in list(self._relays):
            relay.abort()
        threads = [t for sp in self._local.values() for t in sp.threads]
        for sp in list(self._local.values()):
            sp.abort()
        if self._helper is not None:
            await self._helper.stop(within)
        pending = list(self._conns.values())
        if pending:
            await asyncio.wait(pending, timeout=within)
        if threads:  # done with their connections; let them return, too
            await asyncio.to_thread(join_threads, threads, within)

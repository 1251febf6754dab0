"""Kernel splicing of gRPC connections to grpcio's private socket (the ``GAZETTE_RPC=grpcio``
fallback of :mod:`gazette.server.mux`).

One public port for gRPC and the HTTP/1.1 gateway.

The broker's public port is an asyncio server that looks at the first bytes of
each connection. By default gRPC is served in this process by
:mod:`gazette.rpc`, and a connection starting with the HTTP/2 preface is handed
to its protocol (``h2_protocol_factory``) just as HTTP/1.x goes to aiohttp's.

With grpcio serving gRPC instead (``GAZETTE_RPC=grpcio``: grpcio owns its
listeners and cannot share one with aiohttp):

* anything but the HTTP/2 client preface is HTTP/1.x: the transport is handed,
  with the bytes already read, to aiohttp's protocol in this process (no copy,
  no second hop);
* the preface (``PRI * HTTP/2.0``) means gRPC: the broker connects to grpcio's
  private Unix socket, forwards the bytes already read, and the two sockets
  leave the event loop to be *spliced in the kernel*: ``os.splice`` through a
  pipe, one small thread per direction, so no gRPC byte is copied through
  Python.

Where the splicing runs. The splice threads run in a **helper process**
(``python -c ... helper_main``, started with the multiplexer, receiving each
connection's two fds over a ``SOCK_SEQPACKET`` control socket). Threads in
the broker process would have to take the GIL back from the event loop after
every splice call: while the loop is saturated with Python work they starve
(measured below the in-loop relay they replace), and each hand-off forces the
loop thread off the GIL. In the helper, no gRPC byte costs the broker's event
loop anything. The helper ignores SIGINT and SIGTERM (sent to a whole
process group, they must not end splices while the broker drains). If the
helper cannot start or dies, the multiplexer logs it
and splices in threads of the broker process instead; without ``os.splice``
(not Linux) the threads copy through a buffer.

Invariants of a spliced connection:

* bytes are forwarded in order and unchanged, the sniffed ones first;
* back-pressure is the kernel's: a direction blocks writing while its
  destination's buffer is full, and so stops reading its source;
* an end of stream is forwarded as one (``shutdown(SHUT_WR)``) and the other
  direction carries on until it ends too (half-close);
* any error in either direction (reset, broken pipe) shuts both sockets down,
  which wakes the other direction's thread; the sockets and pipes are closed
  once, by whichever thread finishes last, so no fd outlives its connection
  and none is closed while another thread may still use it;
* after ``Multiplexer.close()`` the listener is gone but spliced connections
  keep flowing, so grpcio's graceful stop can finish their RPCs; once grpcio
  ends one (its side reaches end of stream) the whole connection is torn down
  rather than left half-open. ``Multiplexer.abort()`` ends any that remain, the
  helper with them, and waits. If the broker process dies, the helper reads
  end of stream on its control socket and does the same.

A direction blocked writing to a grpc side that never reads does not notice
its client going away (nothing reads the client); grpcio always reads, and
``abort()`` wakes it regardless. Clients that can (local tools, benchmarks)
may dial grpcio's socket directly and skip the splice.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["HelperOwner", "CLOSING", "DONE", "PIPE_SIZE", "SPLICE", "THREAD_NAME", "Helper", "Splice", "copy_sockets", "helper_main", "join_threads"]

log = logging.getLogger(__name__)


# Each direction's pipe. Bigger pipes move more per splice call (fewer syscalls per byte);
# past the per-user pipe budget the kernel refuses the resize and the default size is kept.
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
THREAD_NAME = "gazette-mux-splice"

# Control messages, parent to helper: splice (two fds attached), closing. Helper to parent:
# done. Each is a kind byte and a connection id.
_MSG = struct.Struct("=cQ")
SPLICE, CLOSING, DONE = b"S", b"C", b"D"
_HELPER_CODE = "from gazette.server.splice import helper_main; helper_main()"
_HELPER_FD_ENV = "GAZETTE_MUX_CONTROL_FD"


class HelperOwner(Protocol):
    """What a :class:`Helper` reports to (the multiplexer that started it)."""

    aborting: bool
    """Set once the owner aborts: the helper's end is then expected, not an incident."""

    def finished(self, cid: int) -> None:
        """Connection ``cid`` was torn down (both directions ended)."""

    def helper_gone(self, helper: Helper) -> None:
        """``helper`` died or stopped; its connections are gone with it."""


def copy_sockets(src: socket.socket, dst: socket.socket) -> None:
    """Moves bytes from src to dst (blocking sockets) until src's end of stream: in the
    kernel through a pipe where ``os.splice`` exists (Linux), else through a buffer."""
    if not hasattr(os, "splice"):
        buf = bytearray(PIPE_SIZE)
        view = memoryview(buf)
        while n := src.recv_into(buf):
            dst.sendall(view[:n])
        return
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            size = fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            size = 1 << 16  # Linux's default pipe capacity
        sfd, dfd = src.fileno(), dst.fileno()
        while n := os.splice(sfd, w, size):  # blocks until some bytes, end of stream or shutdown
            while n:
                n -= os.splice(r, dfd, n)
    finally:
        os.close(r)
        os.close(w)


class Splice:
    """Two connected blocking sockets spliced both ways by two daemon threads.

    ``on_done`` is called once, from a worker thread, after both threads are finished
    and both sockets closed. ``closing()`` tells whether the server is stopping: then the
    grpc side's end of stream ends the whole connection.
    """

    def __init__(self, client: socket.socket, upstream: socket.socket, *,
                 closing: Callable[[], bool], on_done: Callable[[], None]) -> None:
        self._client: socket.socket | None = client
        self._upstream: socket.socket | None = upstream
        self._closing = closing
        self._on_done = on_done
        # Guards the sockets' lifetimes: shutdown() from one thread never races close()
        # (and so never reaches an fd number reused by someone else).
        self._lock = threading.Lock()
        self._running = 0
        self._aborted = False
        self._grpc_ended = False
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        client, up = self._client, self._upstream
        assert client is not None and up is not None
        client.setblocking(True)
        up.setblocking(True)
        self._running = 2
        for args in ((client, up, True), (up, client, False)):
            t = threading.Thread(target=self._run, args=args, name=THREAD_NAME, daemon=True)
            try:
                t.start()
                self.threads.append(t)
            except BaseException:  # out of threads: end the connection, not the server
                log.exception("gRPC splice: cannot start a thread")
                self.abort()
                self._finished_one()
                if args[2]:
                    self._finished_one()
                return

    def abort(self) -> None:
        """Shuts both sockets down: each direction's blocked splice returns and its thread
        finishes."""
        with self._lock:
            self._aborted = True
            for s in (self._client, self._upstream):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

    def server_closing(self) -> None:
        """The server stops: a connection grpcio already ended is over."""
        if self._grpc_ended:
            self.abort()

    def _run(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        try:
            self._pump(src, dst, upward)
        except BaseException:  # never let a worker die with its sockets open
            log.exception("gRPC splice: worker failed")
            self.abort()
        finally:
            self._finished_one()

    def _pump(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        """Moves src's bytes to dst until src's end of stream, then ends dst's sending side;
        an error aborts the connection."""
        try:
            copy_sockets(src, dst)
            if not upward:
                self._grpc_ended = True
                if self._closing():  # grpcio ended it while the server stops: nothing to relay
                    self.abort()
                    return
            with self._lock:
                if not self._aborted:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
        except OSError:
            self.abort()

    def _finished_one(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running > 0:
                return
            for s in (self._client, self._upstream):
                if s is not None:
                    s.close()
            self._client = self._upstream = None
        self._on_done()


def join_threads(threads: list[threading.Thread], within: float) -> None:
    deadline = time.monotonic() + within
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


# -- the helper process ------------------------------------------------------------------


def helper_main() -> None:
    """Splices the connections the broker sends over the control socket, until it closes."""
    logging.basicConfig(level=logging.WARNING, format="gazette mux helper: %(levelname)s %(message)s")
    # The broker decides when we stop (end of stream on the control socket), also on a
    # terminal's Ctrl-C or a SIGTERM to the whole group, while it drains.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctl = socket.socket(fileno=int(os.environ[_HELPER_FD_ENV]))
    send_lock = threading.Lock()
    state_lock = threading.Lock()
    splices: dict[int, Splice] = {}
    closing = threading.Event()

    def done(cid: int) -> None:
        with state_lock:
            splices.pop(cid, None)
        with send_lock, contextlib.suppress(OSError):  # the broker is gone: nobody to tell
            ctl.send(_MSG.pack(DONE, cid))

    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, _MSG.size, 2)
        except OSError:
            msg, fds = b"", []
        if len(msg) != _MSG.size:
            for fd in fds:
                os.close(fd)
            break  # the broker closed us, or died
        kind, cid = _MSG.unpack(msg)
        if kind == CLOSING:
            with state_lock:
                closing.set()
                current = list(splices.values())
            for sp in current:
                sp.server_closing()
        elif kind == SPLICE and len(fds) == 2:
            client, up = (socket.socket(fileno=fd) for fd in fds)
            sp = Splice(client, up, closing=closing.is_set, on_done=functools.partial(done, cid))
            with state_lock:
                splices[cid] = sp
            sp.start()
        else:
            for fd in fds:
                os.close(fd)
    with state_lock:
        current = list(splices.values())
    for sp in current:
        sp.abort()
    join_threads([t for sp in current for t in sp.threads], 5.0)


class Helper:
    """The broker's side of the helper process: sends it connections, learns when they end."""

    def __init__(self, mux: HelperOwner) -> None:
        self._mux = mux
        self._loop = asyncio.get_running_loop()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # The helper imports this very package, wherever it was imported from here.
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
            env = dict(os.environ, PYTHONPATH=path, **{_HELPER_FD_ENV: str(child.fileno())})
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _HELPER_CODE], pass_fds=(child.fileno(),), env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        self._ctl = parent
        self.alive = True
        # Messages the socket could not take yet: (message, sockets to pass and then close).
        self._outbox: list[tuple[bytes, list[socket.socket]]] = []
        self._loop.add_reader(parent.fileno(), self._on_readable)

    def send(self, kind: bytes, cid: int, socks: list[socket.socket]) -> None:
        self._outbox.append((_MSG.pack(kind, cid), socks))
        if len(self._outbox) == 1:
            self._flush()

    def _flush(self) -> None:
        while self._outbox and self.alive:
            msg, socks = self._outbox[0]
            try:
                if socks:
                    socket.send_fds(self._ctl, [msg], [s.fileno() for s in socks])
                else:
                    self._ctl.send(msg)
            except BlockingIOError:
                self._loop.add_writer(self._ctl.fileno(), self._flush)
                return
            except OSError:
                self._gone()
                return
            self._outbox.pop(0)
            for s in socks:  # in flight: the kernel holds the helper's references now
                s.close()
        with contextlib.suppress(Exception):
            self._loop.remove_writer(self._ctl.fileno())

    def _on_readable(self) -> None:
        while True:
            try:
                msg = self._ctl.recv(_MSG.size)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if len(msg) != _MSG.size:
                self._gone()
                return
            kind, cid = _MSG.unpack(msg)
            if kind == DONE:
                self._mux.finished(cid)

    def _gone(self) -> None:
        """The helper exited (or its socket broke): its connections went with it."""
        if not self.alive:
            return
        self.alive = False
        if not self._mux.aborting:
            log.error("gRPC splice helper (pid %d) exited; splicing in the broker process from now on",
                      self.proc.pid)
        for fd_op in (self._loop.remove_reader, self._loop.remove_writer):
            with contextlib.suppress(Exception):
                fd_op(self._ctl.fileno())
        for _, socks in self._outbox:
            for s in socks:
                s.close()
        self._outbox.clear()
        self._ctl.close()
        if not self._mux.aborting and self.proc.poll() is None:
            # Its control socket broke: whatever it still runs is lost to us. Reap it.
            self.proc.kill()
            self._loop.run_in_executor(None, self.proc.wait)
        self._mux.helper_gone(self)

    async def stop(self, within: float) -> None:
        """Ends the helper: every connection it splices is aborted, then it exits."""
        if self.alive:
            for _, socks in self._outbox:  # never sent: end them here
                for s in socks:
                    s.close()
            self._outbox.clear()
            with contextlib.suppress(OSError):
                self._ctl.shutdown(socket.SHUT_WR)
        try:
            async with asyncio.timeout(within):  # not wait_for: see gazette.allocator.announce
                await asyncio.to_thread(self.proc.wait)
        except TimeoutError:
            log.error("gRPC splice helper (pid %d) did not exit; killing it", self.proc.pid)
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        self._gone()


# -- the port ------------------------------------------------------------------------------

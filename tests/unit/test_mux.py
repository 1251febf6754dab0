"""The public port's multiplexer over real sockets.

A fake grpcio (an asyncio Unix-socket server, echoing or scripted by the test) stands behind
the port's gRPC splice, and a real aiohttp ``web.Server`` behind its HTTP/1.1 side. Cases:
bytes pass both ways intact whatever the chunking (the preface itself split anywhere);
half-close propagates in each direction while the other keeps flowing; resets, early closes,
junk and an unreachable grpc socket leave no thread or fd behind and the port keeps serving;
many concurrent connections; a real grpcio server behind the splice, stopped after the
multiplexer closes (the broker's order), ends every splice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_h2 import ECHO, with_echo

from gazette.rpc.server import RpcServer
from gazette.server.mux import H2_PREFACE, Multiplexer
from gazette.server.splice import THREAD_NAME
from gazette.testing.eventually import eventually

pytestmark = pytest.mark.both_loops  # the transport on asyncio's loop and on uvloop (conftest)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUT = 30.0


def splice_threads(mux: Multiplexer) -> int:
    """Splice threads of this process, or of the multiplexer's helper (its every thread but
    the main one)."""
    here = sum(1 for t in threading.enumerate() if t.name == THREAD_NAME)
    pid = mux.helper_pid
    return here + (len(os.listdir(f"/proc/{pid}/task")) - 1 if pid is not None else 0)


def open_fds(mux: Multiplexer) -> int:
    """Open fds of this process and of the multiplexer's helper."""
    pid = mux.helper_pid
    return len(os.listdir("/proc/self/fd")) + (len(os.listdir(f"/proc/{pid}/fd")) if pid else 0)


def is_process(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


# Where the splice runs: the helper process (the broker's default), threads of this process,
# those threads where os.splice does not exist (a buffer copy).
MODES = ["helper-process", "in-process", "in-process-no-splice"]


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echoes until end of stream, then ends its own side."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
        await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Closes abruptly: an RST, not a FIN."""
    sock = writer.transport.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def http_handler(request: web.BaseRequest) -> web.StreamResponse:
    body = await request.read()
    return web.Response(text=f"{request.method} {request.path} {len(body)}")


@dataclass
class Rig:
    """A multiplexer on a loopback port, a fake grpcio behind it and aiohttp beside it."""

    port: int
    mux: Multiplexer
    backend: asyncio.Server
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def dial(self, preface: bytes = H2_PREFACE) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        if preface:
            writer.write(preface)
        return reader, writer

    async def grpc_side(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The next connection the fake grpcio accepted (scripted backends only)."""
        return await asyncio.wait_for(self.accepted.get(), TIMEOUT)


@contextlib.contextmanager
def no_splice(mode: str) -> Iterator[None]:
    """Hides os.splice for the no-splice mode."""
    saved = getattr(os, "splice", None)
    if mode == "in-process-no-splice" and saved is not None:
        del os.splice
    try:
        yield
    finally:
        if saved is not None:
            os.splice = saved


@contextlib.asynccontextmanager
async def rig(mode: str, handler: Handler | None = echo) -> AsyncIterator[Rig]:
    """A rig splicing as ``mode`` says; ``handler`` serves each grpc-side connection, None
    queues them for the test."""
    tmp = tempfile.mkdtemp(prefix="mux-")  # short: Unix socket paths are limited
    path = os.path.join(tmp, "grpc.sock")
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if handler is None:
            accepted.put_nowait((reader, writer))
        else:
            tasks.append(asyncio.current_task())  # type: ignore[arg-type]
            await handler(reader, writer)

    backend = await asyncio.start_unix_server(on_connect, path)
    http = web.Server(http_handler)
    process = mode == "helper-process"
    mux = Multiplexer(path, http, splice_process=process)
    port = await mux.start("127.0.0.1", 0)
    assert (mux.helper_pid is not None) == process
    r = Rig(port, mux, backend, accepted, tasks)
    try:
        with no_splice(mode):
            yield r
    finally:
        await mux.abort()
        backend.close()
        await backend.wait_closed()
        await http.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), TIMEOUT)


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), TIMEOUT)


# -- bytes pass intact -----------------------------------------------------------------------


async def roundtrip(r: Rig, first: list[int], chunks: list[int], seed: int) -> None:
    """Sends the preface cut at ``first`` then ``chunks`` of random bytes; the echo must be
    byte-identical, and ending our side ends the echo's."""
    rnd = random.Random(seed)
    payload = rnd.randbytes(sum(chunks))
    reader, writer = await r.dial(preface=b"")
    sent = bytearray()

    async def send() -> None:
        at = 0
        for cut in [*sorted(first), len(H2_PREFACE)]:
            writer.write(H2_PREFACE[at:cut])
            sent.extend(H2_PREFACE[at:cut])
            at = cut
            await writer.drain()
        at = 0
        for n in chunks:
            writer.write(payload[at:at + n])
            at += n
            await writer.drain()
        sent.extend(payload)
        writer.write_eof()

    sender = asyncio.create_task(send())
    got = await read_to_eof(reader)
    await sender
    writer.close()
    assert got == bytes(sent)


chunk_sizes = st.lists(st.one_of(st.integers(1, 64), st.integers(1, 1 << 16),
                                 st.integers(1 << 16, 3 << 20)), min_size=0, max_size=12)


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    """A new event loop: asyncio's, or uvloop's (the test skipped without uvloop)."""
    if name == "uvloop":
        return pytest.importorskip("uvloop").new_event_loop()  # type: ignore[no-any-return]
    return asyncio.new_event_loop()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(st.integers(1, len(H2_PREFACE) - 1), max_size=4, unique=True),
       chunks=chunk_sizes, seed=st.integers(0, 2**32))
def test_bytes_pass_both_ways_intact(mode: str, loop: str, first: list[int], chunks: list[int],
                                     seed: int) -> None:
    async def run() -> None:
        async with rig(mode) as r:
            await roundtrip(r, first, chunks, seed)
            await eventually(lambda: r.mux.spliced == 0, "the splice ends with the connection")

    with asyncio.Runner(loop_factory=lambda: new_loop(loop)) as runner:
        runner.run(run())


@pytest.mark.parametrize("mode", MODES)
async def test_many_concurrent_connections(mode: str) -> None:
    async with rig(mode) as r:
        threads, fds = splice_threads(r.mux), open_fds(r.mux)
        rnd = random.Random(7)
        await asyncio.gather(*(
            roundtrip(r, [], [rnd.randint(1, 1 << 16) for _ in range(rnd.randint(1, 8))], i)
            for i in range(48)))
        await eventually(lambda: r.mux.spliced == 0 and splice_threads(r.mux) == threads
                         and open_fds(r.mux) <= fds, "every splice's threads and fds are gone")


# -- half-close ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_client_half_close_reaches_grpc_while_grpc_keeps_sending(mode: str) -> None:
    async with rig(mode, handler=None) as r:
        reader, writer = await r.dial()
        writer.write(b"request")
        writer.write_eof()
        up_reader, up_writer = await r.grpc_side()
        assert await read_to_eof(up_reader) == H2_PREFACE + b"request"
        # Our end of stream arrived; the other direction still flows.
        big = os.urandom(4 << 20)
        up_writer.write(big)
        await up_writer.drain()
        assert await read_exactly(reader, len(big)) == big
        assert r.mux.spliced == 1
        up_writer.write_eof()
        assert await read_to_eof(reader) == b""
        await eventually(lambda: r.mux.spliced == 0, "both ends done: the splice ends")
        writer.close()
        up_writer.close()


@pytest.mark.parametrize("mode", MODES)
async def test_grpc_half_close_reaches_client_while_client_keeps_sending(mode: str) -> None:
    async with rig(mode, handler=None) as r:
        reader, writer = await r.dial()
        up_reader, up_writer = await r.grpc_side()
        up_writer.write(b"goaway")
        up_writer.write_eof()
        assert await read_to_eof(reader) == b"goaway"
        big = os.urandom(4 << 20)
        writer.write(big)
        await writer.drain()
        assert await read_exactly(up_reader, len(H2_PREFACE) + len(big)) == H2_PREFACE + big
        assert r.mux.spliced == 1
        writer.write_eof()
        assert await read_to_eof(up_reader) == b""
        await eventually(lambda: r.mux.spliced == 0, "both ends done: the splice ends")
        writer.close()
        up_writer.close()


# -- failures leave nothing behind ---------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_resets_mid_transfer_leak_no_thread_or_fd(mode: str) -> None:
    async with rig(mode, handler=None) as r:
        threads, fds = splice_threads(r.mux), open_fds(r.mux)
        pairs = []
        for _ in range(16):
            reader, writer = await r.dial()
            up_reader, up_writer = await r.grpc_side()
            pairs.append((reader, writer, up_reader, up_writer))
        # Both directions in flight, with unread bytes queued at each end.
        for _, writer, _, up_writer in pairs:
            writer.write(os.urandom(1 << 20))
            up_writer.write(os.urandom(1 << 20))
        await eventually(lambda: splice_threads(r.mux) == threads + 2 * len(pairs),
                         "splices running")
        for i, (_, writer, _, up_writer) in enumerate(pairs):
            reset(writer if i % 2 else up_writer)  # either end resets
        for i, (reader, writer, up_reader, up_writer) in enumerate(pairs):
            other = up_reader if i % 2 else reader
            with contextlib.suppress(ConnectionError):
                await read_to_eof(other)  # the surviving end learns it is over
            writer.close()
            up_writer.close()
        await eventually(lambda: r.mux.spliced == 0 and splice_threads(r.mux) == threads
                         and open_fds(r.mux) <= fds, "reset splices release their threads and fds")


@pytest.mark.parametrize("mode", MODES)
async def test_early_close_junk_and_unreachable_grpc_do_not_break_the_port(mode: str) -> None:
    async with rig(mode) as r:
        fds = open_fds(r.mux)
        # Closes before saying anything, or part-way through the preface.
        for first in (b"", b"P", b"PRI"):
            reader, writer = await r.dial(preface=first)
            if first == b"P":
                reset(writer)
            else:
                writer.close()
        # Junk is HTTP's to refuse.
        reader, writer = await r.dial(preface=b"\x00\x01\x02junk\r\n\r\n")
        assert (await read_to_eof(reader)).split(b" ", 2)[1] == b"400"
        writer.close()
        # A preface with nothing after it, then gone.
        reader, writer = await r.dial()
        reset(writer)
        await eventually(lambda: r.mux.spliced == 0 and splice_threads(r.mux) == 0, "splices gone")
        # gRPC still spliced, HTTP still served.
        await roundtrip(r, [], [1 << 20], 1)
        reader, writer = await r.dial(preface=b"")
        writer.write(b"PUT /a/journal HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert await asyncio.wait_for(reader.readuntil(b"PUT /a/journal 3"), TIMEOUT)
        writer.write(b"GET /again HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await read_to_eof(reader)).endswith(b"GET /again 0")
        writer.close()
        await eventually(lambda: r.mux.spliced == 0 and open_fds(r.mux) <= fds, "nothing left open")

        # The grpc socket gone: the client is disconnected, nothing leaks.
        os.unlink(r.mux.grpc_socket)
        reader, writer = await r.dial()
        with contextlib.suppress(ConnectionError):
            assert await read_to_eof(reader) == b""
        writer.close()
        await eventually(lambda: r.mux.spliced == 0 and splice_threads(r.mux) == 0
                         and open_fds(r.mux) <= fds, "a failed splice releases everything")


# -- stopping --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_close_keeps_splices_until_grpc_ends_them_and_abort_ends_the_rest(
        mode: str) -> None:
    async with rig(mode, handler=None) as r:
        helper = r.mux.helper_pid
        reader, writer = await r.dial()
        up_reader, up_writer = await r.grpc_side()
        quiet_reader, quiet_writer = await r.dial()
        await r.grpc_side()
        await r.mux.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", r.port)
        # In flight before close: still relayed (grpcio's graceful stop finishes its RPCs).
        writer.write(b"late request")
        assert await read_exactly(up_reader, len(H2_PREFACE) + 12) == H2_PREFACE + b"late request"
        up_writer.write(b"late response")
        assert await read_exactly(reader, 13) == b"late response"
        # grpcio ends the connection: torn down whole, though the client never closed.
        up_writer.close()
        assert await read_to_eof(reader) == b""
        await eventually(lambda: r.mux.spliced == 1, "the ended splice is gone")
        # abort() ends what is left and waits for its threads.
        await r.mux.abort()
        assert r.mux.spliced == 0 and splice_threads(r.mux) == 0
        assert await read_to_eof(quiet_reader) == b""
        if helper is not None:  # the helper has exited, and been reaped
            assert r.mux.helper_pid is None and not is_process(helper)
        writer.close()
        quiet_writer.close()


async def _echo_stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
    async for req in requests:
        yield req


@pytest.mark.parametrize("mode", MODES)
async def test_real_grpc_behind_the_splice_and_the_brokers_stop_order(mode: str) -> None:
    tmp = tempfile.mkdtemp(prefix="mux-")
    path = os.path.join(tmp, "grpc.sock")
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    server = grpc.aio.server(options=opts)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_echo_stream)}),))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    http = web.Server(http_handler)
    mux = Multiplexer(path, http, splice_process=mode == "helper-process")
    port = await mux.start("127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts)
    try:
        with no_splice(mode):
            await grpc_echo_through(mux, channel, server)
    finally:
        await channel.close()
        await mux.abort()
        await server.stop(None)
        await http.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


async def grpc_echo_through(mux: Multiplexer, channel: grpc.aio.Channel,
                            server: grpc.aio.Server) -> None:
    call = channel.stream_stream("/test.Echo/Stream")
    msgs = [os.urandom(n) for n in (1, 1000, 1 << 20, 5 << 20, 3)]

    async def requests() -> AsyncIterator[bytes]:
        for m in msgs:
            yield m

    got = [m async for m in call(requests())]
    assert got == msgs
    assert mux.spliced == 1
    # The broker's order: the port closes, then grpcio stops (gracefully).
    await mux.close()
    again = [m async for m in call(requests())]
    assert again == msgs
    await server.stop(grace=1.0)
    await eventually(lambda: mux.spliced == 0 and splice_threads(mux) == 0,
                     "grpcio's stop ends the splice, though the client channel stays open")


# -- the helper process ----------------------------------------------------------------------


async def test_a_dead_helper_ends_its_splices_and_the_port_splices_in_process() -> None:
    async with rig("helper-process", handler=None) as r:
        reader, writer = await r.dial()
        await r.grpc_side()
        pid = r.mux.helper_pid
        assert pid is not None and r.mux.spliced == 1
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ConnectionError):
            await read_to_eof(reader)  # its connections died with it
        await eventually(lambda: r.mux.helper_pid is None and r.mux.spliced == 0,
                         "the multiplexer learns the helper is gone")
        writer.close()
        reader, writer = await r.dial()
        up_reader, up_writer = await r.grpc_side()
        writer.write(b"after")
        assert await read_exactly(up_reader, len(H2_PREFACE) + 5) == H2_PREFACE + b"after"
        assert sum(1 for t in threading.enumerate() if t.name == THREAD_NAME) == 2
        writer.close()
        up_writer.close()


HOLDER = """
import asyncio, sys
from gazette.server.mux import Multiplexer

async def main():
    mux = Multiplexer(sys.argv[1], asyncio.Protocol)
    port = await mux.start("127.0.0.1", 0)
    print(port, mux.helper_pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_the_helper_exits_with_the_broker_and_ignores_group_signals() -> None:
    async with rig("helper-process", handler=None) as r:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLDER, r.mux.grpc_socket, stdout=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None
            port, pid = map(int, (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).split())
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(H2_PREFACE)
            up_reader, up_writer = await r.grpc_side()
            writer.write(b"spliced")  # through the helper: it is up and running
            assert await read_exactly(up_reader, len(H2_PREFACE) + 7) == H2_PREFACE + b"spliced"
            # A terminal's Ctrl-C or a SIGTERM to the group leaves the broker to decide.
            os.kill(pid, signal.SIGINT)
            os.kill(pid, signal.SIGTERM)
            writer.write(b"still")
            assert await read_exactly(up_reader, 5) == b"still"
            proc.kill()  # the broker dies: the helper ends its splices and exits
            assert await read_to_eof(up_reader) == b""
            with contextlib.suppress(ConnectionError):
                await read_to_eof(reader)

            def exited() -> bool:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        return f.read().rsplit(")", 1)[1].split()[0] == "Z"
                except FileNotFoundError:
                    return True

            await eventually(exited, "the helper exits")
            writer.close()
            up_writer.close()
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def test_a_busy_port_fails_start_and_leaves_no_helper() -> None:
    async with rig("helper-process") as r:
        before = child_processes()
        mux = Multiplexer(r.mux.grpc_socket, asyncio.Protocol)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(OSError):
                await mux.start("127.0.0.1", taken.getsockname()[1])
        assert mux.helper_pid is None and child_processes() == before


def child_processes() -> set[int]:
    """This process's children (running or not yet reaped)."""
    pids: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            pids.update(int(p) for p in f.read().split())
    return pids


async def test_tls_port_serves_grpc_and_http_on_either_loop(tmp_path: Path) -> None:
    """A TLS port (``tls``): gRPC through our server (large messages: the TLS transport's
    writes, never a direct one to its socket) and HTTP/1.1 on one port, many connections
    admitted and closed (the admission table prunes them)."""
    import ssl

    import trustme

    from gazette.rpc.channel import secure_channel
    from gazette.rpc.tls import ClientTLS, ServerTLS

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "server.pem").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    srv = with_echo(RpcServer())

    class Hello(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            if b"\r\n\r\n" in data:
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")  # type: ignore[attr-defined]
                self.transport.close()

    mux = Multiplexer(str(tmp_path / "unused.sock"), Hello, h2_protocol_factory=srv.protocol,
                      tls=ServerTLS(str(tmp_path / "server.pem"), str(tmp_path / "server.key")))
    port = await mux.start("127.0.0.1", 0)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    try:
        for _ in range(3 * 64):  # past the admission table's first prunes
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(TIMEOUT):
                assert (await reader.read()).endswith(b"\r\n\r\nhello")
            writer.close()
        assert len(mux._transports) <= 2 * 64
        channel = secure_channel(f"127.0.0.1:{port}", tls=ClientTLS(ca_file=str(tmp_path / "ca.pem")))
        try:
            echo = channel.unary_unary(ECHO)
            for size in (100, 64 << 10, 4 << 20):
                body = os.urandom(size)
                async with asyncio.timeout(TIMEOUT):
                    assert await echo(body) == body
        finally:
            await channel.close()
    finally:
        await mux.abort()
        await srv.stop(0)


async def test_plain_connections_awaiting_admission_stay_within_the_reserve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At ACCEPT_BURST connections accepted and not yet admitted (what the descriptor reserve
    allows for) the listener stops accepting, and reads again as they are admitted: admission
    held back here, 150 clients leave exactly ACCEPT_BURST accepted, and all are served once
    it proceeds."""
    from gazette.server import mux as mux_module
    from gazette.server.fds import ACCEPT_BURST

    gate = asyncio.Event()
    peak = 0
    connect = mux_module._Listener._connect

    async def slow_connect(self: Any, conn: socket.socket) -> None:
        nonlocal peak
        peak = max(peak, self.mux.accepting)
        await gate.wait()
        await connect(self, conn)

    monkeypatch.setattr(mux_module._Listener, "_connect", slow_connect)
    async with rig("in-process") as r:
        n = ACCEPT_BURST + 50
        clients = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", r.port) for _ in range(n)))
        await eventually(lambda: r.mux.accepting == ACCEPT_BURST and r.mux._listeners[0].held,
                         "the listener holds at ACCEPT_BURST connections awaiting admission")
        gate.set()
        for _, writer in clients:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        for reader, writer in clients:
            async with asyncio.timeout(TIMEOUT):
                assert (await reader.read()).startswith(b"HTTP/1.1 200")
            writer.close()
        assert peak == ACCEPT_BURST and r.mux.accepting == 0 and not r.mux._listeners[0].held

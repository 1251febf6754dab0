"""``--server.*`` budget flags: sizes parse as documented, a bad value exits naming its flag, the
defaults are the library's constants, and each value reaches the component it configures (the
RPC server's connections, the multiplexer's descriptor budget, the HTTP/1.1 handler)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.server import Broker
from gazette.cli.serve import build_parser
from gazette.cli.serve import config_from_args as serve_config
from gazette.consumer.run import config_from_args as consume_config
from gazette.consumer.run import consumer_parser
from gazette.rpc import connection
from gazette.rpc import frames as f
from gazette.rpc.server import MAX_BUFFERED, RpcServer
from gazette.server import fds
from gazette.server.grpc import build_server
from gazette.server.http import HTTP_HEAD_TIMEOUT, GuardedHandler, http_protocol_factory, start_app
from gazette.server.limits import ServerLimits, parse_size
from gazette.server.mux import Multiplexer


def _serve(*argv: str) -> Any:
    return serve_config(build_parser().parse_args(["serve", "--broker.id", "broker-one", *argv]))


def _consume(*argv: str) -> Any:
    return consume_config(consumer_parser(None, "test").parse_args(list(argv)))


@pytest.mark.parametrize("text,size", [("256MiB", 256 << 20), ("64KiB", 64 << 10), ("1GiB", 1 << 30),
                                       ("1048576", 1 << 20), ("1MB", 10**6), ("2k", 2000), ("1.5Mi", 3 << 19),
                                       (" 12 B ", 12)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@given(n=st.integers(0, 1 << 40), unit=st.sampled_from(["", "B", "KiB", "MiB", "GiB", "kB", "MB", "GB", "mib"]))
def test_a_size_is_its_count_times_its_unit(n: int, unit: str) -> None:
    mult = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}
    assert parse_size(f"{n}{unit}") == n * mult[unit.lower()]


@pytest.mark.parametrize("text", ["", "MiB", "12 parsecs", "-1MiB", "1e6", "0x10", "1 MiB B"])
def test_not_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_defaults_are_the_librarys_constants() -> None:
    for limits in (_serve().limits, _consume().limits):
        assert limits == ServerLimits(
            max_buffered=MAX_BUFFERED, connection_window=connection.CONNECTION_WINDOW,
            connection_buffer=connection.CONNECTION_BUFFER_CAP, max_unread=connection.WRITE_BACKLOG_LIMIT,
            fd_reserve=None, http_head_timeout=HTTP_HEAD_TIMEOUT)


def test_flags_and_environment_set_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--server.max-buffered", "64MiB", "--server.connection-window", "1MiB",
            "--server.connection-buffer", "2MiB", "--server.max-unread", "512KiB",
            "--server.fd-reserve", "200", "--server.http-head-timeout", "3s"]
    want = ServerLimits(max_buffered=64 << 20, connection_window=1 << 20, connection_buffer=2 << 20,
                        max_unread=512 << 10, fd_reserve=200, http_head_timeout=3.0)
    assert _serve(*argv).limits == want
    assert _consume(*argv).limits == want
    monkeypatch.setenv("SERVER_MAX_BUFFERED", "1GiB")
    assert _serve().limits.max_buffered == 1 << 30
    assert _consume().limits.max_buffered == 1 << 30


@pytest.mark.parametrize("flag,value", [
    ("--server.max-buffered", "lots"), ("--server.max-buffered", "0"),
    ("--server.connection-window", "1KiB"), ("--server.connection-window", "2GiB"),
    ("--server.connection-buffer", "-5"), ("--server.max-unread", "4 MiBs"),
    ("--server.fd-reserve", "-1"), ("--server.fd-reserve", "ten"),
    ("--server.http-head-timeout", "0s"), ("--server.http-head-timeout", "10"),
])
def test_a_bad_value_exits_naming_the_flag(flag: str, value: str) -> None:
    for config in (_serve, _consume):
        with pytest.raises(SystemExit, match=rf"^gazette: invalid {flag}\b"):
            config(flag, value)


def test_the_broker_process_keeps_its_limits() -> None:
    config = _serve("--server.max-buffered", "64MiB")
    broker = Broker(config)
    try:
        assert broker.limits is config.limits and broker.limits.max_buffered == 64 << 20
    finally:
        shutil.rmtree(broker.scratch_dir, ignore_errors=True)


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        out.append((data[pos + 3], int.from_bytes(data[pos + 5 : pos + 9], "big"), data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


async def test_the_rpc_server_grants_the_configured_window() -> None:
    limits = _serve("--server.max-buffered", "64MiB", "--server.connection-window", "1MiB",
                    "--server.connection-buffer", "3MiB", "--server.max-unread", "256KiB").limits
    server = build_server("unused.sock", limits)
    assert isinstance(server, RpcServer) and server.max_buffered == 64 << 20
    conn = server.protocol()
    assert (conn.connection_window, conn.connection_buffer_cap, conn.write_backlog_limit) == (
        1 << 20, 3 << 20, 256 << 10)
    assert conn.withhold((3 << 20) + 1) and not conn.withhold(3 << 20)

    # On the wire: the server's preface grants the client the configured connection window.
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f.PREFACE + f.settings_frame({}))
        data = b""
        while not any(t == f.WINDOW_UPDATE for t, _, _ in _frames(data)):
            chunk = await asyncio.wait_for(reader.read(4096), 10)
            assert chunk, "server closed before granting its window"
            data += chunk
        (increment,) = [struct.unpack(">I", p)[0] for t, sid, p in _frames(data) if t == f.WINDOW_UPDATE and sid == 0]
        assert increment + f.DEFAULT_WINDOW == 1 << 20
    finally:
        writer.close()
        await server.stop(0)


def test_the_fd_reserve_replaces_a_tenth_of_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fds, "nofile_limit", lambda: (10_000, 10_000))
    monkeypatch.setattr(fds, "open_fds", lambda: 50)
    default = fds.FdBudget()
    assert default.allowed(lambda: 0) == 10_000 - 1_000 - fds.ACCEPT_BURST - 50
    mux = Multiplexer("unused.sock", lambda: asyncio.Protocol(), fd_reserve=3_000)
    assert mux.fd_budget.allowed(lambda: 0) == 10_000 - 3_000 - fds.ACCEPT_BURST - 50


async def test_the_http_handler_takes_the_head_timeout() -> None:
    runner = await start_app([])
    try:
        handler = http_protocol_factory(runner, head_timeout=_serve("--server.http-head-timeout", "2500ms")
                                        .limits.http_head_timeout)()
        assert isinstance(handler, GuardedHandler) and handler.head_timeout == 2.5
        # and a head that does not complete in time closes the connection
        sock_a, sock_b = socket.socketpair()
        loop = asyncio.get_running_loop()
        proto = http_protocol_factory(runner, head_timeout=0.2)()
        transport, _ = await loop.connect_accepted_socket(lambda: proto, sock_a)
        sock_b.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        sock_b.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock_b)
        await asyncio.wait_for(reader.read(), 10)  # the server closes it (no answer is due)
        assert reader.at_eof()
        writer.close()
        transport.close()
    finally:
        await runner.cleanup()

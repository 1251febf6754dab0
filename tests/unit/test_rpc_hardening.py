"""Probes of our HTTP/2 server with raw frames, one per limit: each ends as RFC 9113
prescribes (GOAWAY or RST_STREAM with the code it names), bounded, while a well-behaved client
on another connection keeps being served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from raw_h2 import DEADLINE, ECHO, PARK, Raw, serving, with_echo

from gazette.rpc import frames as f
from gazette.rpc.connection import CALM_BURST, MAX_HEADER_BLOCK, RateLimit
from gazette.rpc.server import RpcServer

pytestmark = pytest.mark.both_loops  # the transport on asyncio's loop and on uvloop (conftest)


@pytest.fixture
async def server() -> AsyncIterator[tuple[RpcServer, int]]:
    srv = with_echo(RpcServer(max_concurrent_streams=8))
    async with serving(srv) as port:
        yield srv, port


async def _stillserving(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        echo = channel.unary_unary(ECHO)
        assert await asyncio.wait_for(echo(b"hello"), DEADLINE) == b"hello"


async def test_advertises_and_enforces_max_concurrent_streams(server: Any) -> None:
    srv, port = server
    raw = await Raw.connect(port)
    settings = await raw.until(f.SETTINGS)
    assert settings is not None
    assert (f.SETTINGS_MAX_CONCURRENT_STREAMS, 8) in f.parse_settings(memoryview(settings[3]))
    for i in range(8):
        raw.headers(1 + 2 * i, PARK)  # Parked: they stay open.
    raw.headers(17, PARK)
    assert await raw.rst_code(17) == f.REFUSED_STREAM
    await _stillserving(port)
    raw.close()


async def test_continuation_flood_is_cut_off(server: Any) -> None:
    _, port = server
    raw = await Raw.connect(port)
    raw.headers(1, flags=0)  # No END_HEADERS: CONTINUATION frames must follow.
    chunk = b"\x00" * (16 << 10)
    for _ in range(4 * MAX_HEADER_BLOCK // len(chunk)):
        raw.send(f.frame(f.CONTINUATION, 0, 1, chunk))
    # Not decoded: the HPACK state is lost, so the connection ends (RFC 9113 4.3).
    assert await raw.goaway_code() == f.COMPRESSION_ERROR
    await _stillserving(port)


async def test_empty_continuation_frames_are_counted_too(server: Any) -> None:
    _, port = server
    raw = await Raw.connect(port)
    raw.headers(1, flags=0)
    for _ in range(1000):
        raw.send(f.frame(f.CONTINUATION, 0, 1))
    assert await raw.goaway_code() == f.ENHANCE_YOUR_CALM


async def test_rapid_reset_ends_with_enhance_your_calm(server: Any) -> None:
    _, port = server
    raw = await Raw.connect(port)
    for i in range(CALM_BURST + 500):
        sid = 1 + 2 * i
        raw.headers(sid, PARK)
        raw.send(f.rst_stream(sid, f.CANCEL))
    assert await raw.goaway_code() == f.ENHANCE_YOUR_CALM
    await _stillserving(port)


async def test_ping_flood_ends_with_enhance_your_calm(server: Any) -> None:
    _, port = server
    raw = await Raw.connect(port)
    for i in range(CALM_BURST + 500):
        raw.send(f.frame(f.PING, 0, 0, i.to_bytes(8, "big")))
    assert await raw.goaway_code() == f.ENHANCE_YOUR_CALM


@pytest.mark.parametrize("probe, code", [
    (lambda raw: raw.send(f.window_update(0, 0)), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.window_update(0, f.MAX_WINDOW)), f.FLOW_CONTROL_ERROR),
    (lambda raw: raw.send(f.window_update(9, 1)), f.PROTOCOL_ERROR),        # idle stream
    (lambda raw: raw.send(f.frame(f.DATA, 0, 5, b"x")), f.PROTOCOL_ERROR),  # idle stream
    (lambda raw: raw.send(f.frame(f.DATA, 0, 0, b"x")), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.rst_stream(0, f.CANCEL)), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.frame(f.RST_STREAM, 0, 1, b"\x00")), f.FRAME_SIZE_ERROR),
    (lambda raw: raw.send(f.frame(f.PING, 0, 1, bytes(8))), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.frame(f.PING, 0, 0, bytes(7))), f.FRAME_SIZE_ERROR),
    (lambda raw: raw.send(f.settings_frame({f.SETTINGS_ENABLE_PUSH: 2})), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 31})),
     f.FLOW_CONTROL_ERROR),
    (lambda raw: raw.send(f.settings_frame({f.SETTINGS_MAX_FRAME_SIZE: 100})), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.frame(f.SETTINGS, 0, 1, b"")), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.frame(f.SETTINGS, f.ACK, 0, bytes(6))), f.FRAME_SIZE_ERROR),
    (lambda raw: raw.send(f.frame(f.GOAWAY, 0, 1, bytes(8))), f.PROTOCOL_ERROR),
    (lambda raw: raw.send(f.frame(f.PRIORITY, 0, 0, bytes(5))), f.PROTOCOL_ERROR),
    (lambda raw: raw.headers(2), f.PROTOCOL_ERROR),                          # even stream id
], ids=["conn-window-zero", "conn-window-overflow", "window-idle-stream", "data-idle-stream",
        "data-stream-0", "rst-stream-0", "rst-size", "ping-on-stream", "ping-size",
        "settings-enable-push", "settings-window", "settings-frame-size", "settings-on-stream",
        "settings-ack-payload", "goaway-on-stream", "priority-stream-0", "even-stream"])
async def test_illegal_frames_are_connection_errors(server: Any, probe: Any, code: int) -> None:
    _, port = server
    raw = await Raw.connect(port)
    probe(raw)
    assert await raw.goaway_code() == code
    await _stillserving(port)


async def test_stream_window_errors_reset_only_that_stream(server: Any) -> None:
    _, port = server
    raw = await Raw.connect(port)
    raw.headers(1, PARK)
    raw.headers(3, PARK)
    raw.send(f.window_update(1, 0))
    assert await raw.rst_code(1) == f.PROTOCOL_ERROR
    raw.send(f.window_update(3, f.MAX_WINDOW))
    assert await raw.rst_code(3) == f.FLOW_CONTROL_ERROR
    # The connection itself is fine: a new stream on it is served.
    raw.headers(5, ECHO, flags=f.END_HEADERS)
    raw.send(f.frame(f.DATA, f.END_STREAM, 5, f.message_prefix(2) + b"hi"))
    assert await raw.until(f.DATA, 5) is not None
    raw.close()


def test_rate_limit_refills_with_time() -> None:
    now = [0.0]
    limit = RateLimit(3, 2.0, lambda: now[0])
    assert [limit.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.5  # One token back.
    assert [limit.take(), limit.take()] == [True, False]
    now[0] = 100.0  # Never beyond the burst.
    assert [limit.take() for _ in range(4)] == [True, True, True, False]


# -- the shared port: silent, half-sent and surplus connections --------------------------------


@pytest.fixture
async def port_rig(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> AsyncIterator[Any]:
    from aiohttp import web

    import gazette.rpc.server as rpc_server
    import gazette.server.http as http
    from gazette.server.mux import Multiplexer

    monkeypatch.setattr(http, "HTTP_IDLE_TIMEOUT", 0.5)
    monkeypatch.setattr(rpc_server, "PREFACE_TIMEOUT", 0.5)

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    runner = await http.start_app([web.get("/hello", hello)])
    srv = with_echo(RpcServer())
    assert runner.server is not None
    mux = Multiplexer(str(tmp_path / "grpc.sock"), runner.server, h2_protocol_factory=srv.protocol)
    mux.first_bytes_timeout = 0.5
    mux.max_connections = 20
    port = await mux.start("127.0.0.1", 0)
    try:
        yield mux, port
    finally:
        await mux.abort()
        await srv.stop(0)
        await runner.cleanup()


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (EOF or reset) within the deadline."""
    try:
        while await asyncio.wait_for(reader.read(1 << 16), DEADLINE):
            pass
    except ConnectionResetError:
        pass
    return True


async def _http_ok(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    body = await asyncio.wait_for(reader.read(), DEADLINE)
    assert body.startswith(b"HTTP/1.1 200") and body.endswith(b"hello")
    writer.close()


@pytest.mark.parametrize("opening", [b"", b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Half: ", b"PRI ",
                                     f.PREFACE[:20]],
                         ids=["silent", "half-http-request", "h2-sniffed-only", "half-h2-preface"])
async def test_slow_connections_are_closed(port_rig: Any, opening: bytes) -> None:
    _, port = port_rig
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(opening)
    assert await _closed(reader)
    await _http_ok(port)
    await _stillserving(port)


async def test_connections_beyond_the_limit_are_closed(port_rig: Any) -> None:
    mux, port = port_rig
    held = []
    for _ in range(mux.max_connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # Kept alive afterwards.
        held.append((reader, writer))
    for reader, _ in held:
        assert (await asyncio.wait_for(reader.readuntil(b"hello"), DEADLINE)).endswith(b"hello")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await _closed(reader)
    for _, w in held:
        w.close()
    # Once they are gone, new connections are served again.
    async def served() -> None:
        while True:
            try:
                await _http_ok(port)
                return
            except (AssertionError, ConnectionError):
                await asyncio.sleep(0.05)
    await asyncio.wait_for(served(), DEADLINE)


async def test_streams_that_are_not_read_pin_a_bounded_amount(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    import gazette.rpc.connection as connection

    monkeypatch.setattr(connection, "CONNECTION_WINDOW", 2 << 20)
    monkeypatch.setattr(connection, "CONNECTION_BUFFER_CAP", 1 << 20)

    async def sink(requests: Any, context: Any) -> bytes:
        await asyncio.Event().wait()  # Never reads what the client sends.
        return b""

    srv = with_echo(RpcServer(), Sink=grpc.stream_unary_rpc_method_handler(sink))
    async with serving(srv) as port:
        raw = await Raw.connect(port)
        streams = [1, 3, 5, 7]  # Each may take 16 MiB (its window): 64 MiB in all, unbounded.
        for sid in streams:
            raw.headers(sid, "/test.Echo/Sink")
        chunk = f.message_prefix(16 << 10) + bytes(16 << 10)
        window, sent, ping = f.DEFAULT_WINDOW, 0, 0
        while True:
            while window >= len(chunk):
                raw.send(f.frame(f.DATA, 0, streams[sent // len(chunk) % 4], chunk))
                window -= len(chunk)
                sent += len(chunk)
            # A PING's ACK comes after every WINDOW_UPDATE our DATA earned so far.
            ping += 1
            raw.send(f.frame(f.PING, 0, 0, ping.to_bytes(8, "big")))
            assert await raw.until(f.PING) is not None
            grants = sum(f.u32(memoryview(p)) for t, _, s, p in raw.seen
                         if t == f.WINDOW_UPDATE and s == 0)
            raw.seen = [fr for fr in raw.seen if fr[0] not in (f.PING, f.WINDOW_UPDATE)]
            if not grants and window < len(chunk):
                break  # Stalled: the connection window is withheld.
            window += grants
            assert sent < 32 << 20, "the connection window was never withheld"
        # Bounded by the cap plus the connection window (and the initial 64 KiB).
        assert sent <= (1 << 20) + (2 << 20) + f.DEFAULT_WINDOW
        raw.close()
        await _stillserving(port)


async def test_client_stream_ids_never_wrap(server: Any) -> None:
    from gazette.rpc.channel import LAST_STREAM_ID, insecure_channel

    _, port = server
    channel = insecure_channel(f"127.0.0.1:{port}")
    try:
        echo = channel.unary_unary(ECHO)
        assert await echo(b"a") == b"a"
        first = channel.connection_now()
        assert first is not None
        first.next_id = LAST_STREAM_ID  # The connection's last stream id.
        assert await echo(b"b") == b"b"
        assert channel.connection_now() is None  # That connection is going away.
        assert await echo(b"c") == b"c"  # On a new connection, from stream 1.
        second = channel.connection_now()
        assert second is not None and second is not first and second.next_id == 3
    finally:
        await channel.close()


async def test_client_spreads_streams_over_connections_at_the_servers_limit(server: Any) -> None:
    """Our channel never opens more streams on a connection than the server's
    SETTINGS_MAX_CONCURRENT_STREAMS (8 here): beyond it, it dials another connection, so no
    call is refused (a broker holds a Replicate stream per journal to each peer)."""
    from gazette.rpc.channel import insecure_channel
    from gazette.testing.eventually import eventually

    _, port = server
    channel = insecure_channel(f"127.0.0.1:{port}")
    try:
        echo, park = channel.unary_unary(ECHO), channel.unary_unary(PARK)
        assert await echo(b"a") == b"a"  # The server's SETTINGS are in.
        parked = [asyncio.ensure_future(park(b"")) for _ in range(20)]
        await eventually(lambda: sum(len(c.streams) for c in channel._conns) == 20,
                         "20 parked calls open", within=DEADLINE)
        assert [len(c.streams) for c in channel._conns] == [8, 8, 4]
        assert not any(p.done() for p in parked)  # None refused.
        assert await echo(b"b") == b"b"  # Room on the third.
        for p in parked:
            p.cancel()
        await asyncio.gather(*parked, return_exceptions=True)
        assert await echo(b"c") == b"c"  # The first has room again, and takes it.
        assert channel.connection_now() is channel._conns[0]
    finally:
        await channel.close()


async def test_idle_connections_are_sent_away(monkeypatch: pytest.MonkeyPatch) -> None:
    import gazette.rpc.server as rpc_server

    monkeypatch.setattr(rpc_server, "IDLE_TIMEOUT", 0.4)
    async with serving(with_echo(RpcServer())) as port:
        busy = await Raw.connect(port)
        busy.headers(1, PARK)  # An RPC in progress keeps its connection.
        idle = await Raw.connect(port)
        assert await idle.goaway_code() == f.NO_ERROR
        busy.send(f.frame(f.PING, 0, 0, bytes(8)))
        assert await busy.until(f.PING) is not None
        assert not any(fr[0] == f.GOAWAY for fr in busy.seen)
        # Our client dials again after a GOAWAY.
        await _stillserving(port)
        busy.close()

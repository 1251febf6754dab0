"""Descriptors of a serving process: the limit raised at start, a reserve kept for new
connections by shedding idle and slow ones, request heads bounded in time, and accept failures
logged once per interval.

The server side runs in a child process (``fd_server.py``: the multiplexer and the guarded
aiohttp handler, as brokers and consumers serve HTTP/1.1) under a lowered ``RLIMIT_NOFILE``;
the clients are raw sockets of this process, whose own limit is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gazette.server import fds
from gazette.server.fds import FdBudget, raise_nofile_limit, reserve_for
from gazette.testing.cluster import Cluster
from gazette.testing.eventually import eventually

pytestmark = pytest.mark.both_loops  # the transport on asyncio's loop and on uvloop (conftest)

SERVER = Path(__file__).with_name("fd_server.py")
DEADLINE = 30.0


# --- in-process units ------------------------------------------------------------------------


def test_raise_nofile_limit_raises_soft_to_hard(caplog: pytest.LogCaptureFixture) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(hard, 512) if hard != resource.RLIM_INFINITY else 512
    if lowered >= hard:
        pytest.skip(f"hard limit {hard} leaves no room to lower the soft one")
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered - 1, hard))
    try:
        with caplog.at_level(logging.INFO, logger="gazette.server.fds"):
            got = raise_nofile_limit()
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert now > lowered - 1 and got == now
        if hard != resource.RLIM_INFINITY:
            assert now == hard
        lines = [r for r in caplog.records if r.name == "gazette.server.fds"]
        assert len(lines) == 1 and "raised" in lines[0].getMessage()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_budget_keeps_a_reserve() -> None:
    now = [0.0]
    budget = FdBudget(refresh=1.0, clock=lambda: now[0])
    soft = fds.nofile_limit()[0]
    held = fds.open_fds()
    assert held is not None
    allowed = budget.allowed(lambda: 0)
    assert allowed == max(0, soft - reserve_for(soft) - budget.others)
    assert budget.others >= held - 1  # everything open counts when there are no connections
    assert reserve_for(1024) == 102 + fds.ACCEPT_BURST and reserve_for(100) == 64 + fds.ACCEPT_BURST
    # Between refreshes the count is not asked for (it may cost the caller a scan).
    assert budget.allowed(lambda: pytest.fail("counted between refreshes")) == allowed  # type: ignore[func-returns-value]


# --- a child server under a lowered limit ------------------------------------------------------


@dataclass
class Child:
    proc: asyncio.subprocess.Process
    port: int
    stderr_path: Path

    async def line(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(DEADLINE):
            while True:
                raw = await self.proc.stdout.readline()
                assert raw, f"server exited; log:\n{self.log()[-3000:]}"
                text = raw.decode().strip()
                if text.startswith(prefix):
                    return text

    async def command(self, cmd: str, reply: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.line(reply)

    async def stats(self) -> dict[str, int]:
        text = await self.command("stats", "stats ")
        return {k: int(v) for k, v in (f.split("=") for f in text.split()[1:])}

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def running_loop() -> str:
    """The running loop's name for ``--event-loop``: the child serves on the test's loop."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


@contextlib.asynccontextmanager
async def child(tmp_path: Path, limit: int, head_timeout: float = 60.0) -> AsyncIterator[Child]:
    err = tmp_path / "server.log"
    with err.open("wb") as errf:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SERVER), "--limit", str(limit), "--head-timeout", str(head_timeout),
            "--event-loop", running_loop(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    c = Child(proc, 0, err)
    try:
        c.port = int((await c.line("port ")).split()[1])
        yield c
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def request(port: int, path: str = "/ready") -> tuple[bytes, float]:
    """One GET on a new connection: (status line, seconds taken)."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = await reader.read()
    finally:
        writer.close()
    return data.split(b"\r\n", 1)[0], time.monotonic() - t0


async def test_healthy_clients_are_served_while_idle_and_slow_connections_fill_the_limit(tmp_path: Path) -> None:
    limit = 256
    async with child(tmp_path, limit) as srv:
        conns: list[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            # Keep-alive connections that made one request and went idle, then connections
            # holding half a request head, then silent ones: 1.5x what the limit leaves room for.
            for kind, n in (("idle", 150), ("slow", 150), ("silent", 60)):
                for _ in range(n):
                    r, w = await asyncio.open_connection("127.0.0.1", srv.port)
                    if kind == "idle":
                        w.write(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
                        async with asyncio.timeout(DEADLINE):
                            await r.readuntil(b"ready\n")
                    elif kind == "slow":
                        w.write(b"GET /ready HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    conns.append((kind, r, w))
            latencies = []
            for _ in range(30):
                async with asyncio.timeout(DEADLINE):
                    status, took = await request(srv.port)
                assert status == b"HTTP/1.1 200 OK"
                latencies.append(took)
            stats = await srv.stats()
            print(f"\nhealthy GETs with {len(conns)} idle/slow/silent connections under a limit of {limit}: "
                  f"median {statistics.median(latencies) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms; "
                  f"shed {stats['shed']}, open {stats['open']}, server fds {stats['fds']}")
            assert stats["fds"] < limit, stats
            # At least every idle one was shed (silent ones may also have timed out, if slow).
            assert stats["shed"] >= 150, stats
            # Idle keep-alive connections went first: every one of them was closed.
            async with asyncio.timeout(DEADLINE):
                for kind, r, _ in conns:
                    if kind == "idle":
                        assert await r.read() == b""
            log = srv.log()
            assert "Traceback" not in log, log[-3000:]
            assert "accept failed" not in log, log[-3000:]  # the reserve held: never out of descriptors
            assert all(len(line) <= 1024 for line in log.splitlines())
        finally:
            for _, _, w in conns:
                w.close()


async def test_a_request_head_is_due_within_the_head_timeout(tmp_path: Path) -> None:
    async with child(tmp_path, 1024, head_timeout=0.5) as srv:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"GET /ready HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        async with asyncio.timeout(DEADLINE):
            assert await r.read() == b""  # closed by the server
        w.close()
        # A keep-alive connection's next head has its own clock, from its first byte.
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(DEADLINE):
            await r.readuntil(b"ready\n")
            w.write(b"GET /ready HTTP/1.1\r\n")
            assert await r.read() == b""
        w.close()
        await eventually(lambda: srv.log().count("request head not complete in time") == 2,
                         "a line for each timed-out head")
        assert "Traceback" not in srv.log()


async def test_accept_failures_are_logged_once_and_accepting_resumes(tmp_path: Path) -> None:
    async with child(tmp_path, 256) as srv:
        await srv.command("hog", "hogged ")
        # A client arrives while the server has no descriptor left: each accept() fails.
        pending = asyncio.ensure_future(request(srv.port))
        for _ in range(3):
            await srv.line("exhausted")  # the listener pauses a second after each failure
        stats = await srv.stats()
        # One failed accept per pause: asyncio's own loop failed up to 100 per retry, and
        # scheduled a retry per failure (thousands a second after a few seconds).
        assert 3 <= stats["failures"] <= 4, stats
        assert not pending.done()
        await srv.command("free", "freed")
        async with asyncio.timeout(DEADLINE):
            status, took = await pending
        assert status == b"HTTP/1.1 200 OK"
        log = srv.log()
        assert log.count("accept failed") == 1, log[-3000:]
        assert "Traceback" not in log
        print(f"\nserved after {took:.2f} s, {stats['failures']} failed accepts, one log line")


# --- a real broker whose limit an operator lowered -------------------------------------------------


async def test_broker_serves_healthy_appends_while_idle_and_slow_connections_fill_its_limit(
        cluster: Cluster) -> None:
    import grpc

    from gazette.protocol import protocol_pb2 as pb
    from gazette.protocol import protocol_pb2_grpc as pb_grpc

    broker = cluster.add_broker("local", "tight-otter")
    assert broker.pid is not None and "file descriptor limit" in broker.log_text()
    journal = "descriptors/healthy"
    spec = pb.JournalSpec(name=journal, replication=1)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 60
    req = pb.ApplyRequest()
    req.changes.add(upsert=spec, expect_mod_revision=0)
    with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        assert pb_grpc.JournalStub(channel).Apply(req, timeout=DEADLINE).status == pb.OK  # type: ignore[no-untyped-call]

    async def put(data: bytes) -> tuple[bytes, float]:
        t0 = time.monotonic()
        r, w = await asyncio.open_connection("127.0.0.1", broker.port)
        try:
            w.write(f"PUT /{journal} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
                    "Connection: close\r\n\r\n".encode() + data)
            answer = await r.read()
        finally:
            w.close()
        return answer.split(b"\r\n", 1)[0], time.monotonic() - t0

    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while (await put(b"first\n"))[0] != b"HTTP/1.1 204 No Content":  # until the journal is assigned
        assert loop.time() < deadline, "the journal took no append"
        await asyncio.sleep(0.05)
    # The operator lowers the soft limit to what the broker holds plus room for ~100 connections
    # beyond the reserve; the broker reads its limit on every accept.
    held = len(os.listdir(f"/proc/{broker.pid}/fd"))
    limit = held + reserve_for(held + 300) + 100
    _, hard = resource.prlimit(broker.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (limit, hard))
    conns: list[asyncio.StreamWriter] = []
    peak = 0
    try:
        for kind, n in (("idle", 150), ("slow", 150), ("silent", 60)):
            for _ in range(n):
                r, w = await asyncio.open_connection("127.0.0.1", broker.port)
                if kind == "idle":
                    w.write(b"GET /debug/ready HTTP/1.1\r\nHost: x\r\n\r\n")
                    async with asyncio.timeout(DEADLINE):
                        await r.readuntil(b"ready\n")
                elif kind == "slow":
                    w.write(b"GET /debug/ready HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                conns.append(w)
                peak = max(peak, len(os.listdir(f"/proc/{broker.pid}/fd")))
        latencies = []
        for i in range(30):
            async with asyncio.timeout(DEADLINE):
                st, took = await put(f"healthy {i}\n".encode())
            assert st == b"HTTP/1.1 204 No Content"
            latencies.append(took)
            peak = max(peak, len(os.listdir(f"/proc/{broker.pid}/fd")))
        print(f"\nbroker at RLIMIT_NOFILE {limit} (held {held} before), {len(conns)} idle/slow/silent "
              f"connections: 30 healthy appends, median {statistics.median(latencies) * 1e3:.1f} ms, "
              f"max {max(latencies) * 1e3:.1f} ms; peak fds {peak}")
        assert peak < limit
        log = broker.log_text()
        assert "Traceback" not in log, log[-4000:]
        assert "shed idle or slow connections" in log
    finally:
        for w in conns:
            w.close()
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (hard, hard))


# --- shedding order, in process ------------------------------------------------------------------


async def test_idle_keep_alive_connections_are_shed_before_idle_http2_ones(tmp_path: Path) -> None:
    from aiohttp import web

    from gazette.rpc.server import RpcServer
    from gazette.server.http import http_protocol_factory, start_app
    from gazette.server.mux import H2_PREFACE, Multiplexer

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    runner = await start_app([web.get("/ready", ready)])
    srv = RpcServer()
    mux = Multiplexer(str(tmp_path / "grpc.sock"), http_protocol_factory(runner), h2_protocol_factory=srv.protocol)
    mux.max_connections = 6
    port = await mux.start("127.0.0.1", 0)
    writers: list[asyncio.StreamWriter] = []
    try:
        h2 = []
        for _ in range(3):  # the oldest: HTTP/2 connections with no stream open
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # and an empty SETTINGS
            async with asyncio.timeout(DEADLINE):
                await r.readexactly(9)  # the server's SETTINGS header
            h2.append(r)
            writers.append(w)
        idle = []
        for _ in range(3):  # then keep-alive connections, idle after one request
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(DEADLINE):
                await r.readuntil(b"ready\n")
            idle.append(r)
            writers.append(w)
        async with asyncio.timeout(DEADLINE):
            status, _ = await request(port)  # at capacity: sheds two, idle HTTP/1.1 first
            assert status == b"HTTP/1.1 200 OK"
            for r in idle[:2]:
                assert await r.read() == b""
        assert mux.shed_total == 2
        assert len(srv._connections) == 3 and not any(r.at_eof() for r in h2)
    finally:
        for w in writers:
            w.close()
        await mux.abort()
        await srv.stop(0)
        await runner.cleanup()


async def test_tls_handshakes_count_toward_the_limit_and_are_shed_as_silent(tmp_path: Path) -> None:
    # A TLS connection holds its descriptor from accept on, through a handshake that may take
    # HANDSHAKE_TIMEOUT (10 s). Silent clients that never start theirs fill the port: they count
    # as open (``accepting``), and a healthy client's connection sheds the oldest of them at
    # accept (before, they could not be shed, and the healthy one was refused once its own
    # handshake was done).
    import ssl

    import trustme
    from aiohttp import web

    from gazette.rpc.tls import ServerTLS
    from gazette.server.http import http_protocol_factory, start_app
    from gazette.server.mux import Multiplexer

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key, ca_file = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    client_ctx = ssl.create_default_context(cafile=str(ca_file))

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    runner = await start_app([web.get("/ready", ready)])
    mux = Multiplexer(str(tmp_path / "grpc.sock"), http_protocol_factory(runner),
                      tls=ServerTLS(str(chain), str(key)))
    mux.max_connections = 6
    port = await mux.start("127.0.0.1", 0)
    silent: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(6):  # TCP connections that never send a ClientHello
            silent.append(await asyncio.open_connection("127.0.0.1", port))
        await eventually(lambda: mux.accepting == 6 and len(mux._handshakes) == 6, "six handshakes pending",
                         within=DEADLINE)
        for _ in range(3):  # each healthy client is served at once, well within the handshake timeout
            async with asyncio.timeout(5.0):
                r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
                w.write(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = await r.read()
                w.close()
            assert data.startswith(b"HTTP/1.1 200 OK"), data[:100]
        # The oldest silent ones were shed (closed by the server), the newest keep their turn.
        async with asyncio.timeout(DEADLINE):
            assert await silent[0][0].read() == b"" and await silent[1][0].read() == b""
        assert mux.shed_total >= 2
        # and the books balance: each shed handshake left ``accepting`` as its task ended
        await eventually(lambda: mux.accepting == len(mux._handshakes) == 6 - mux.shed_total,
                         "the shed handshakes uncounted", within=DEADLINE)
    finally:
        for _, w in silent:
            w.close()
        await mux.abort()
        await runner.cleanup()


async def test_at_capacity_with_nothing_to_shed_a_tls_connection_is_refused_before_its_handshake(
        tmp_path: Path) -> None:
    # Every connection serving a request (never shed): a new TLS connection is closed at accept,
    # a refusal, rather than holding a descriptor through a handshake only to be refused.
    import ssl

    import trustme
    from aiohttp import web

    from gazette.rpc.tls import ServerTLS
    from gazette.server.http import http_protocol_factory, start_app
    from gazette.server.mux import Multiplexer

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key, ca_file = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    release = asyncio.Event()
    serving = 0

    async def hold(_: web.Request) -> web.Response:
        nonlocal serving
        serving += 1
        await release.wait()
        return web.Response(text="done\n")

    runner = await start_app([web.get("/hold", hold)])
    mux = Multiplexer(str(tmp_path / "grpc.sock"), http_protocol_factory(runner),
                      tls=ServerTLS(str(chain), str(key)))
    mux.max_connections = 3
    port = await mux.start("127.0.0.1", 0)
    busy: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(3):
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
            w.write(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append((r, w))
        await eventually(lambda: serving == 3, "three requests in progress", within=DEADLINE)
        refused = mux._refusals.total
        r, w = await asyncio.open_connection("127.0.0.1", port)  # would start a handshake
        async with asyncio.timeout(DEADLINE):
            assert await r.read() == b""
        w.close()
        assert mux._refusals.total == refused + 1 and mux.accepting == 0 and not mux._handshakes
        release.set()
        for r, _ in busy:  # and the requests in progress were not disturbed
            async with asyncio.timeout(DEADLINE):
                assert (await r.readuntil(b"done\n")).startswith(b"HTTP/1.1 200 OK")
    finally:
        release.set()
        for _, w in busy:
            w.close()
        await mux.abort()
        await runner.cleanup()

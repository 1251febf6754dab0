"""gazette.rpc against grpcio, over real loopback sockets.

A small Journal servicer (Apply unary, Read server-streaming, Append client-streaming,
Replicate bidi) is served by our :class:`RpcServer` and by ``grpc.aio.server()``, and called
through our :class:`Channel` and through ``grpc.aio.insecure_channel``; each case runs on
every client x server pair where both sides matter. Requests carry a command in a string
field: ``echo:...``, ``abort:CODE:details``, ``raise`` or ``block:tag`` (the handler parks on
a :class:`Gate` the test observes: started, cancelled, ended, and can release).

Cases: the four call kinds with messages beyond 16 KiB frames and the 64 KiB default window;
``abort`` codes and exact details (non-ASCII, '%'); an escaping exception is UNKNOWN and the
server keeps serving; unknown methods are UNIMPLEMENTED; client cancellation and deadlines
cancel the handler; stopping the server lets running RPCs finish within grace and refuses
new ones; a lost connection fails calls with UNAVAILABLE and the channel dials again; many
concurrent calls on one channel; keepalive gives up on a peer that never answers; garbage
instead of the HTTP/2 preface (or broken framing) closes that connection with GOAWAY only;
a hand-driven client's CONTINUATION, padding and HPACK indexing are understood. Known bugs of
gazette.rpc (now fixed) are kept as regular tests of the behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import inspect
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import hpack
import pytest

from gazette.protocol import protocol_pb2 as pb
from gazette.rpc import connection as rpc_connection
from gazette.rpc import frames as f
from gazette.rpc.channel import Channel, insecure_channel
from gazette.rpc.server import RpcServer

pb_grpc: Any = importlib.import_module("gazette.protocol.protocol_pb2_grpc")

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_loops]  # both: asyncio's loop and uvloop (conftest)

WITHIN = 5.0        # deadline for anything that should happen promptly
CANCEL_WITHIN = 1.0  # deadline for a cancellation to reach a handler (also what a strict xfail costs)
KINDS = ["ours", "grpcio"]
NASTY = "ünïcödé 100% %25 %zz \t€ 𝄞 — done"  # details that need percent-encoding


def pattern(i: int, size: int) -> bytes:
    """``size`` bytes that differ with ``i``."""
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


# -- the servicer ----------------------------------------------------------------------------


@dataclass
class Gate:
    """What the test sees of a handler parked on ``block:tag``."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Svc(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.gates: dict[str, Gate] = {}

    def gate(self, tag: str) -> Gate:
        return self.gates.setdefault(tag, Gate())

    async def park(self, tag: str) -> None:
        gate = self.gate(tag)
        gate.started.set()
        try:
            await gate.release.wait()
        except asyncio.CancelledError:
            gate.cancelled.set()
            raise
        finally:
            gate.ended.set()

    async def command(self, cmd: str, ctx: Any) -> None:
        """Runs the commands that are not ``echo``."""
        if cmd.startswith("abort:"):
            _, code, details = cmd.split(":", 2)
            await ctx.abort(grpc.StatusCode[code], details)
        elif cmd == "raise":
            raise RuntimeError("servicer bug")
        elif cmd.startswith("block:"):
            await self.park(cmd[6:])

    async def Apply(self, req: pb.ApplyRequest, ctx: Any) -> pb.ApplyResponse:
        cmd = req.changes[0].delete if req.changes else ""
        if cmd.startswith("metadata:"):
            md = dict(ctx.invocation_metadata() or ())
            cmd = str(md.get(cmd[9:], "<missing>"))
        await self.command(cmd, ctx)
        return pb.ApplyResponse(header=pb.Header(process_id=pb.ProcessSpec.ID(suffix=cmd)))

    async def Read(self, req: pb.ReadRequest, ctx: Any) -> AsyncIterator[pb.ReadResponse]:
        """``req.offset`` responses of ``req.end_offset`` bytes, then the command."""
        for i in range(req.offset):
            yield pb.ReadResponse(offset=i, content=pattern(i, req.end_offset))
        if req.journal.startswith("block:"):
            yield pb.ReadResponse(offset=-1)  # the client knows the handler is running
        await self.command(req.journal, ctx)

    async def Append(self, reqs: AsyncIterator[pb.AppendRequest], ctx: Any) -> pb.AppendResponse:
        """Commits the content of its requests: how many, their length and SHA-1."""
        journal, count, h = "", 0, hashlib.sha1()
        total = 0
        async for req in reqs:
            if count == 0:
                journal = req.journal
                await self.command(journal, ctx)
            count += 1
            total += len(req.content)
            h.update(req.content)
        return pb.AppendResponse(commit=pb.Fragment(journal=journal, begin=count, end=total,
                                                    backing_store=h.hexdigest()))

    async def Replicate(self, reqs: AsyncIterator[pb.ReplicateRequest], ctx: Any) -> AsyncIterator[pb.ReplicateResponse]:
        """A response per request: its length and SHA-1, padded with ``content_delta`` bytes."""
        i = 0
        async for req in reqs:
            await self.command(req.deprecated_journal, ctx)
            resp = pb.ReplicateResponse(fragment=pb.Fragment(
                journal=req.deprecated_journal, begin=i, end=len(req.content), backing_store=sha(req.content)))
            if req.content_delta:
                resp.registers.labels.add(name="pad", value="y" * req.content_delta)
            yield resp
            i += 1


def apply_req(cmd: str) -> pb.ApplyRequest:
    return pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete=cmd)])


# -- servers, channels -------------------------------------------------------------------------


@dataclass
class Served:
    kind: str
    port: int
    svc: Svc
    stop: Callable[[float | None], Awaitable[None]]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


async def serve(kind: str, max_message: int | None = None) -> Served:
    svc = Svc()
    if kind == "ours":
        ours = RpcServer() if max_message is None else RpcServer(max_message=max_message)
        pb_grpc.add_JournalServicer_to_server(svc, ours)
        port = await ours.start("127.0.0.1", 0)
        return Served(kind, port, svc, ours.stop)
    server = grpc.aio.server(options=[] if max_message is None else [("grpc.max_receive_message_length", max_message)])
    pb_grpc.add_JournalServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Served(kind, port, svc, server.stop)


def dial(kind: str, target: str, max_message: int | None = None) -> Any:
    if kind == "ours":
        return Channel(target) if max_message is None else Channel(target, max_message=max_message)
    limit = [] if max_message is None else [("grpc.max_receive_message_length", max_message)]
    return grpc.aio.insecure_channel(target, options=limit)


@pytest.fixture(params=KINDS, ids=lambda k: f"server-{k}")
def server_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=KINDS, ids=lambda k: f"client-{k}")
def client_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def served(server_kind: str) -> AsyncIterator[Served]:
    s = await serve(server_kind)
    try:
        yield s
    finally:
        await s.stop(0)


@dataclass
class Rig:
    served: Served
    channel: Any
    stub: Any

    @property
    def svc(self) -> Svc:
        return self.served.svc


@pytest.fixture
async def rig(served: Served, client_kind: str) -> AsyncIterator[Rig]:
    channel = dial(client_kind, served.target)
    try:
        yield Rig(served, channel, pb_grpc.JournalStub(channel))
    finally:
        await channel.close()


async def within(aw: Awaitable[Any], seconds: float = WITHIN) -> Any:
    return await asyncio.wait_for(aw, seconds)


async def rpc_error(aw: Awaitable[Any], seconds: float = WITHIN) -> grpc.aio.AioRpcError:
    """The AioRpcError ``aw`` fails with (within ``seconds``)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(aw, seconds)
    return err.value


async def read_all(call: Any) -> list[Any]:
    out = []
    async for msg in call:
        out.append(msg)
    return out


async def assert_serving(stub: Any, what: str = "still serving") -> None:
    resp = await within(stub.Apply(apply_req(f"echo:{what}")))
    assert resp.header.process_id.suffix == f"echo:{what}"


# Server kinds for behaviours ours once lacked (now fixed): both must show them.
BOTH_SERVERS = [pytest.param("ours", id="server-ours"), pytest.param("grpcio", id="server-grpcio")]


# -- the four call kinds ------------------------------------------------------------------------


async def test_unary(rig: Rig) -> None:
    for cmd in ["echo:", f"echo:{NASTY}", "echo:" + "x" * 200_000]:
        resp = await within(rig.stub.Apply(apply_req(cmd)))
        assert resp.header.process_id.suffix == cmd


async def test_unary_with_metadata_and_a_timeout_in_time(rig: Rig) -> None:
    resp = await within(rig.stub.Apply(apply_req("metadata:x-test"), timeout=30, metadata=[("x-test", "v 1")]))
    assert resp.header.process_id.suffix == "v 1"


@pytest.mark.parametrize(("count", "size"), [(0, 0), (1, 0), (300, 20_000), (3, 1_000_000)])
async def test_server_streaming(rig: Rig, count: int, size: int) -> None:
    got = await within(read_all(rig.stub.Read(pb.ReadRequest(journal="echo:", offset=count, end_offset=size))))
    assert [r.offset for r in got] == list(range(count))
    assert all(r.content == pattern(i, size) for i, r in enumerate(got))


async def test_server_streaming_with_read(rig: Rig) -> None:
    call = rig.stub.Read(pb.ReadRequest(journal="echo:", offset=3, end_offset=70_000))
    for i in range(3):
        resp = await within(call.read())
        assert (resp.offset, resp.content) == (i, pattern(i, 70_000))
    assert await within(call.read()) is grpc.aio.EOF
    code = call.code()  # grpcio's is a coroutine
    assert (await code if inspect.isawaitable(code) else code) == grpc.StatusCode.OK


def append_requests(sizes: list[int]) -> list[pb.AppendRequest]:
    return [pb.AppendRequest(journal="echo:a")] + [pb.AppendRequest(content=pattern(i, n)) for i, n in enumerate(sizes)]


def expect_commit(resp: pb.AppendResponse, sizes: list[int]) -> None:
    data = b"".join(pattern(i, n) for i, n in enumerate(sizes))
    assert (resp.commit.journal, resp.commit.begin, resp.commit.end, resp.commit.backing_store) == (
        "echo:a", len(sizes) + 1, len(data), sha(data))


@pytest.mark.parametrize("sizes", [[], [10, 0, 20], [3_000_000, 3_000_000, 3_000_000, 17]], ids=["none", "small", "3MB"])
async def test_client_streaming_from_an_iterator(rig: Rig, sizes: list[int]) -> None:
    expect_commit(await within(rig.stub.Append(iter(append_requests(sizes)))), sizes)


async def test_client_streaming_from_an_async_iterator(rig: Rig) -> None:
    sizes = [100_000] * 10

    async def gen() -> AsyncIterator[pb.AppendRequest]:
        for req in append_requests(sizes):
            await asyncio.sleep(0)  # interleave with the transport
            yield req

    expect_commit(await within(rig.stub.Append(gen())), sizes)


async def test_client_streaming_with_write(rig: Rig) -> None:
    sizes = [70_000, 1, 3_000_000]
    call = rig.stub.Append()
    for req in append_requests(sizes):
        await within(call.write(req))
    await within(call.done_writing())
    expect_commit(await within(call), sizes)


async def test_bidi_ping_pong(rig: Rig) -> None:
    call = rig.stub.Replicate()
    for i, n in enumerate([0, 10, 20_000, 100_000, 1_000_000]):
        content = pattern(i, n)
        await within(call.write(pb.ReplicateRequest(deprecated_journal=f"echo:{i}", content=content, content_delta=n)))
        resp = await within(call.read())
        assert (resp.fragment.journal, resp.fragment.begin, resp.fragment.end, resp.fragment.backing_store) == (
            f"echo:{i}", i, n, sha(content))
        assert [(lb.name, len(lb.value)) for lb in resp.registers.labels] == ([("pad", n)] if n else [])
    await within(call.done_writing())
    assert await within(call.read()) is grpc.aio.EOF


async def test_bidi_from_an_iterator(rig: Rig) -> None:
    reqs = [pb.ReplicateRequest(deprecated_journal=f"echo:{i}", content=pattern(i, 50_000), content_delta=30_000)
            for i in range(40)]
    got = await within(read_all(rig.stub.Replicate(iter(reqs))))
    assert [(r.fragment.begin, r.fragment.end, r.fragment.backing_store, len(r.registers.labels[0].value))
            for r in got] == [(i, 50_000, sha(pattern(i, 50_000)), 30_000) for i in range(40)]


async def test_gathered_writes_that_overflow_the_socket_arrive_whole(
        served: Served, client_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Our connections write queued frames with one writev straight to the socket; with send
    # buffers of a few KiB most of each write is left over and goes through the transport.
    # Messages both ways must arrive whole and in order.
    if served.kind == client_kind == "grpcio":
        pytest.skip("neither end is ours")
    real = rpc_connection.gather_fd
    gathered: list[int] = []

    def tiny_buffers(transport: asyncio.Transport) -> int:
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        fd = real(transport)
        gathered.append(fd)
        return fd

    monkeypatch.setattr(rpc_connection, "gather_fd", tiny_buffers)
    channel = dial(client_kind, served.target)
    try:
        stub = pb_grpc.JournalStub(channel)
        sizes = [300_000, 40_000, 1_000_000, 70_000]
        expect_commit(await within(stub.Append(iter(append_requests(sizes)))), sizes)
        reqs = [pb.ReplicateRequest(deprecated_journal=f"echo:{i}", content=pattern(i, 200_000), content_delta=100_000)
                for i in range(8)]
        got = await within(read_all(stub.Replicate(iter(reqs))))
        assert [(r.fragment.begin, r.fragment.backing_store, len(r.registers.labels[0].value)) for r in got] == [
            (i, sha(pattern(i, 200_000)), 100_000) for i in range(8)]
    finally:
        await channel.close()
    assert gathered and all(fd >= 0 for fd in gathered)  # our ends wrote gathered


# -- statuses ----------------------------------------------------------------------------------


@pytest.mark.parametrize("details", [NASTY, "", "plain", "%", "a" * 3000])
async def test_abort_unary(rig: Rig, details: str) -> None:
    err = await rpc_error(rig.stub.Apply(apply_req(f"abort:NOT_FOUND:{details}")))
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, details)
    await assert_serving(rig.stub)


async def test_abort_after_streamed_responses(rig: Rig) -> None:
    call = rig.stub.Read(pb.ReadRequest(journal=f"abort:FAILED_PRECONDITION:{NASTY}", offset=5, end_offset=30_000))
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for resp in call:
            got.append(resp)
    assert [r.offset for r in got] == list(range(5))
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, NASTY)


async def test_abort_while_the_client_is_still_sending(rig: Rig) -> None:
    reqs = [pb.AppendRequest(journal=f"abort:RESOURCE_EXHAUSTED:{NASTY}")] + [
        pb.AppendRequest(content=pattern(i, 1_000_000)) for i in range(8)]
    err = await rpc_error(rig.stub.Append(iter(reqs)))
    if not isinstance(rig.channel, Channel) and err.code() == grpc.StatusCode.INTERNAL:
        # grpcio's client, on a busy machine, sometimes ends this race "Internal error from
        # Core" instead of the server's status: its request writer fails on the stream the
        # server closed (trailers, then RST_STREAM NO_ERROR, as RFC 9113 8.1 asks), seen against
        # grpcio's own server and against ours (grpcio 1.85 on the floors job). Our client
        # must not (the next assertion, for every pair with it).
        await assert_serving(rig.stub)
        return
    assert (err.code(), err.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, NASTY)
    await assert_serving(rig.stub)


async def test_abort_bidi(rig: Rig) -> None:
    call = rig.stub.Replicate()
    await within(call.write(pb.ReplicateRequest(deprecated_journal="echo:0")))
    assert (await within(call.read())).fragment.journal == "echo:0"
    await within(call.write(pb.ReplicateRequest(deprecated_journal=f"abort:ABORTED:{NASTY}")))
    err = await rpc_error(call.read())
    assert (err.code(), err.details()) == (grpc.StatusCode.ABORTED, NASTY)


async def test_an_escaping_exception_is_unknown(rig: Rig, served: Served) -> None:
    err = await rpc_error(rig.stub.Apply(apply_req("raise")))
    assert err.code() == grpc.StatusCode.UNKNOWN
    if served.kind == "ours":  # grpcio's own server sends the exception's text.
        assert "servicer bug" not in (err.details() or "")
        assert (err.details() or "").startswith("internal error (incident ")
    await assert_serving(rig.stub)
    err = await rpc_error(read_all(rig.stub.Read(pb.ReadRequest(journal="raise", offset=2, end_offset=10))))
    assert err.code() == grpc.StatusCode.UNKNOWN
    err = await rpc_error(rig.stub.Append(iter([pb.AppendRequest(journal="raise")])))
    assert err.code() == grpc.StatusCode.UNKNOWN
    await assert_serving(rig.stub)


@pytest.mark.parametrize("path", ["/protocol.Journal/Nope", "/no.Such/Service", "/"])
async def test_unknown_method_is_unimplemented(rig: Rig, path: str) -> None:
    unary = rig.channel.unary_unary(path, request_serializer=pb.ApplyRequest.SerializeToString,
                                    response_deserializer=pb.ApplyResponse.FromString)
    err = await rpc_error(unary(apply_req("echo:")))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    streaming = rig.channel.unary_stream(path, request_serializer=pb.ReadRequest.SerializeToString,
                                         response_deserializer=pb.ReadResponse.FromString)
    err = await rpc_error(read_all(streaming(pb.ReadRequest())))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    # A refused client stream whose requests are still being sent.
    sending = rig.channel.stream_unary(path, request_serializer=pb.AppendRequest.SerializeToString,
                                       response_deserializer=pb.AppendResponse.FromString)
    err = await rpc_error(sending(iter([pb.AppendRequest(content=pattern(i, 1_000_000)) for i in range(4)])))
    if isinstance(rig.channel, Channel):
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    else:  # grpcio's request writer may lose the race to the status and report its own failure
        assert err.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL), err
    await assert_serving(rig.stub)


# -- cancellation, deadlines --------------------------------------------------------------------

# a client's RST_STREAM cancels its handler's task


@pytest.mark.parametrize("server_kind", BOTH_SERVERS)
async def test_client_cancellation_cancels_the_handler(rig: Rig) -> None:
    svc, stub = rig.svc, rig.stub
    unary = asyncio.ensure_future(stub.Apply(apply_req("block:unary")))
    reading = stub.Read(pb.ReadRequest(journal="block:read"))
    assert (await within(reading.read())).offset == -1
    bidi = stub.Replicate()
    await within(bidi.write(pb.ReplicateRequest(deprecated_journal="block:bidi")))
    gates = [svc.gate(tag) for tag in ("unary", "read", "bidi")]
    await within(asyncio.gather(*(g.started.wait() for g in gates)))

    unary.cancel()
    assert reading.cancel()
    assert bidi.cancel()
    assert reading.cancelled() and bidi.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await within(unary)
    with pytest.raises(asyncio.CancelledError):
        await within(reading.read())
    for tag, g in zip(("unary", "read", "bidi"), gates, strict=True):
        assert await within(g.cancelled.wait(), CANCEL_WITHIN), tag
        assert g.ended.is_set()
    await assert_serving(stub)


async def test_deadline_exceeded_cancels_the_handler(rig: Rig) -> None:
    svc, stub = rig.svc, rig.stub
    started = time.monotonic()
    err = await rpc_error(stub.Apply(apply_req("block:unary"), timeout=0.2))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started >= 0.19
    await within(svc.gate("unary").cancelled.wait())

    reading = stub.Read(pb.ReadRequest(journal="block:read", offset=2, end_offset=100), timeout=0.2)
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for resp in reading:
            got.append(resp.offset)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert got == [0, 1, -1]
    await within(svc.gate("read").cancelled.wait())
    await assert_serving(stub)


# -- stopping, losing connections ----------------------------------------------------------------


async def test_stop_lets_running_calls_finish_within_grace(rig: Rig) -> None:
    svc, stub = rig.svc, rig.stub
    running = asyncio.ensure_future(stub.Apply(apply_req("block:running")))
    gate = svc.gate("running")
    await within(gate.started.wait())
    stopping = asyncio.ensure_future(rig.served.stop(20))

    # Calls that start once the stop took effect are refused with UNAVAILABLE. Those racing
    # it may run, or (grpcio's server, for streams arriving before its GOAWAY did) be CANCELLED.
    racing = {grpc.StatusCode.CANCELLED} if rig.served.kind == "grpcio" else set()
    deadline = time.monotonic() + WITHIN
    while True:
        try:
            await within(stub.Apply(apply_req("echo:new")))
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                break
            assert err.code() in racing, err
        assert time.monotonic() < deadline, "new calls were not refused"
        await asyncio.sleep(0.01)
    assert (await rpc_error(stub.Apply(apply_req("echo:new")))).code() == grpc.StatusCode.UNAVAILABLE
    assert not running.done() and not gate.cancelled.is_set()

    gate.release.set()
    assert (await within(running)).header.process_id.suffix == "block:running"
    await within(stopping)  # long before the grace period ends
    assert not gate.cancelled.is_set()


# calls cancelled at the end of stop()'s grace end UNAVAILABLE (retryable), as grpcio's do


@pytest.mark.parametrize("server_kind", BOTH_SERVERS)
async def test_stop_past_grace_ends_calls_with_unavailable(rig: Rig, server_kind: str) -> None:
    svc, stub = rig.svc, rig.stub
    reading = stub.Read(pb.ReadRequest(journal="block:read"))
    assert (await within(reading.read())).offset == -1
    await within(rig.served.stop(0))
    err = await rpc_error(reading.read())
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    if server_kind == "ours":
        # Our server cancels the handler it gave up on. (grpcio's own server, on a loaded
        # machine, sometimes leaves it running past stop(0): about 1 run in 8 here; its
        # clients still see UNAVAILABLE, which is what this compares.)
        await within(svc.gate("read").cancelled.wait())


class Proxy:
    """A TCP relay to ``port`` whose connections the test can sever."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self.tasks.discard(task)

    def sever(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        self.sever()
        if self.tasks:
            await within(asyncio.gather(*self.tasks, return_exceptions=True))
        await self.server.wait_closed()


async def test_a_lost_connection_fails_calls_with_unavailable(served: Served, client_kind: str) -> None:
    proxy = Proxy(served.port)
    channel = dial(client_kind, await proxy.start())
    try:
        stub = pb_grpc.JournalStub(channel)
        await assert_serving(stub, "before")
        reading = stub.Read(pb.ReadRequest(journal="block:read"))
        assert (await within(reading.read())).offset == -1
        unary = asyncio.ensure_future(stub.Apply(apply_req("block:unary")))
        await within(served.svc.gate("unary").started.wait())
        proxy.sever()
        assert (await rpc_error(reading.read())).code() == grpc.StatusCode.UNAVAILABLE
        assert (await rpc_error(unary)).code() == grpc.StatusCode.UNAVAILABLE
        for tag in ("read", "unary"):
            await within(served.svc.gate(tag).cancelled.wait())
        # The channel dials again for the next call.
        deadline = time.monotonic() + WITHIN
        while True:
            try:
                await assert_serving(stub, "after")
                break
            except grpc.aio.AioRpcError as err:  # grpcio may still be backing off
                assert client_kind == "grpcio" and err.code() == grpc.StatusCode.UNAVAILABLE, err
                assert time.monotonic() < deadline, "the channel did not reconnect"
                await asyncio.sleep(0.05)
    finally:
        await channel.close()
        await proxy.close()


# closing a channel resets its streams, which cancels their handlers


@pytest.mark.parametrize(("server_kind", "client_kind"), [
    pytest.param("ours", "ours", id="server-ours-client-ours"),
    pytest.param("ours", "grpcio", id="server-ours-client-grpcio"),
    pytest.param("grpcio", "ours", id="server-grpcio-client-ours"),
    pytest.param("grpcio", "grpcio", id="server-grpcio-client-grpcio"),
])
async def test_closing_the_channel_ends_calls_in_flight(served: Served, client_kind: str) -> None:
    channel = dial(client_kind, served.target)
    stub = pb_grpc.JournalStub(channel)
    reading = stub.Read(pb.ReadRequest(journal="block:read"))
    assert (await within(reading.read())).offset == -1
    await within(channel.close())
    # grpcio's calls raise CancelledError, ours AioRpcError(CANCELLED).
    with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)) as err:
        await within(reading.read())
    if isinstance(err.value, grpc.aio.AioRpcError):
        assert err.value.code() == grpc.StatusCode.CANCELLED
    # Our server is held to ending the cancelled handler within CANCEL_WITHIN. grpcio's own
    # server (here only as the oracle for the clients) ends it on grpcio's schedule, which is
    # not ours to time: on the floors job's grpcio it passed 5 s on both loops.
    if served.kind == "ours":
        await within(served.svc.gate("read").ended.wait(), CANCEL_WITHIN)


# a request over the server's max_message ends the call RESOURCE_EXHAUSTED


@pytest.mark.parametrize("server_kind", BOTH_SERVERS)
async def test_an_oversized_request_is_resource_exhausted(server_kind: str, client_kind: str) -> None:
    served = await serve(server_kind, max_message=1000)
    channel = dial(client_kind, served.target)
    try:
        stub = pb_grpc.JournalStub(channel)
        err = await rpc_error(stub.Apply(apply_req("echo:" + "x" * 2000)))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        await assert_serving(stub)
    finally:
        await channel.close()
        await served.stop(0)


# a response over the channel's max_message raises AioRpcError RESOURCE_EXHAUSTED


@pytest.mark.parametrize("client_kind", [
    pytest.param("ours", id="client-ours"),
    pytest.param("grpcio", id="client-grpcio"),
])
async def test_an_oversized_response_is_resource_exhausted(served: Served, client_kind: str) -> None:
    channel = dial(client_kind, served.target, max_message=1000)
    try:
        stub = pb_grpc.JournalStub(channel)
        err = await rpc_error(stub.Apply(apply_req("echo:" + "x" * 2000)))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        await assert_serving(stub)
    finally:
        await channel.close()


# -- load -------------------------------------------------------------------------------------


async def test_many_concurrent_calls_on_one_channel(rig: Rig) -> None:
    stub = rig.stub

    async def unary(i: int) -> None:
        resp = await stub.Apply(apply_req(f"echo:{i}:" + "z" * (i * 97)))
        assert resp.header.process_id.suffix == f"echo:{i}:" + "z" * (i * 97)

    async def reading(i: int) -> None:
        got = await read_all(stub.Read(pb.ReadRequest(journal="echo:", offset=50, end_offset=1000 + i)))
        assert [(r.offset, r.content) for r in got] == [(k, pattern(k, 1000 + i)) for k in range(50)]

    async def appending(i: int) -> None:
        sizes = [40_000 + i] * 5
        expect_commit(await stub.Append(iter(append_requests(sizes))), sizes)

    async def replicating(i: int) -> None:
        reqs = [pb.ReplicateRequest(deprecated_journal=f"echo:{i}", content=pattern(k, 5000)) for k in range(20)]
        got = await read_all(stub.Replicate(iter(reqs)))
        assert [(r.fragment.journal, r.fragment.begin) for r in got] == [(f"echo:{i}", k) for k in range(20)]

    calls = ([unary(i) for i in range(200)] + [reading(i) for i in range(20)]
             + [appending(i) for i in range(10)] + [replicating(i) for i in range(10)])
    await within(asyncio.gather(*calls), 20)


# -- our transport's own -------------------------------------------------------------------------


async def test_keepalive_fails_calls_to_a_silent_peer() -> None:
    """A peer that accepts TCP but never speaks HTTP/2: the unanswered keepalive ping fails
    the calls in flight with UNAVAILABLE."""
    connected = asyncio.Event()
    handlers: set[asyncio.Task[Any]] = set()

    async def discard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        connected.set()
        with contextlib.suppress(ConnectionError):
            while await reader.read(1 << 16):
                pass
        writer.close()

    silent = await asyncio.start_server(discard, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    channel = Channel(f"127.0.0.1:{port}", options=[("grpc.keepalive_time_ms", 200), ("grpc.keepalive_timeout_ms", 300)])
    try:
        stub = pb_grpc.JournalStub(channel)
        started = time.monotonic()
        unary = stub.Apply(apply_req("echo:"))
        reading = read_all(stub.Read(pb.ReadRequest(journal="echo:")))
        errors = await within(asyncio.gather(rpc_error(unary), rpc_error(reading)), 3.0)
        assert [e.code() for e in errors] == [grpc.StatusCode.UNAVAILABLE] * 2
        assert connected.is_set()
        assert 0.4 <= time.monotonic() - started < 3.0
    finally:
        await channel.close()
        silent.close()
        await within(asyncio.gather(*handlers, return_exceptions=True))
        await silent.wait_closed()


def frame_bytes(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return f.frame(ftype, flags, sid, payload)


GREETING = f.PREFACE + f.settings_frame({})
BAD_STREAMS = {
    "http1": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", f.PROTOCOL_ERROR),
    "zeros": (b"\0" * 24, f.PROTOCOL_ERROR),
    "preface-then-junk": (f.PREFACE[:10] + b"junk" * 10, f.PROTOCOL_ERROR),
    "oversized-frame": (GREETING + f.frame_head(f.DATA, 0, 1, (1 << 20) + 1), f.FRAME_SIZE_ERROR),
    "bad-hpack": (GREETING + frame_bytes(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"), f.COMPRESSION_ERROR),
    "headers-on-stream-0": (GREETING + frame_bytes(f.HEADERS, f.END_HEADERS, 0, f.METHOD_POST), f.PROTOCOL_ERROR),
    "even-stream-id": (GREETING + frame_bytes(f.HEADERS, f.END_HEADERS, 2, f.METHOD_POST), f.PROTOCOL_ERROR),
    "push-promise": (GREETING + frame_bytes(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\2"), f.PROTOCOL_ERROR),
    "bad-settings": (f.PREFACE + frame_bytes(f.SETTINGS, 0, 0, b"\0" * 5), f.FRAME_SIZE_ERROR),
    "short-ping": (GREETING + frame_bytes(f.PING, 0, 0, b"\0" * 7), f.FRAME_SIZE_ERROR),
}


@pytest.mark.parametrize("case", list(BAD_STREAMS))
async def test_garbage_closes_only_its_connection(case: str) -> None:
    served = await serve("ours")
    channel = Channel(served.target)
    try:
        stub = pb_grpc.JournalStub(channel)
        await assert_serving(stub, "before")
        reading = stub.Read(pb.ReadRequest(journal="block:read"))  # in flight throughout
        assert (await within(reading.read())).offset == -1

        data, code = BAD_STREAMS[case]
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(data)
        received = await within(reader.read())  # until the server closes the connection
        writer.close()
        frames = list(f.FrameReader(f.MAX_FRAME_LIMIT).feed(received))
        assert frames and frames[-1][0] == f.GOAWAY, frames
        assert f.u32(frames[-1][3], 4) == code

        await assert_serving(stub, "after")
        served.svc.gate("read").release.set()
        assert await within(reading.read()) is grpc.aio.EOF
    finally:
        await channel.close()
        await served.stop(0)


class RawClient:
    """A hand-driven HTTP/2 client: frames in, frames out, an independent HPACK codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = f.FrameReader(f.MAX_FRAME_LIMIT)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f.PREFACE + f.settings_frame({}))
        return cls(reader, writer)

    def block(self, path: str) -> bytes:
        return bytes(self.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "raw"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("x-raw", "yes")]))

    async def response(self, sid: int) -> tuple[list[tuple[str, str]], bytes, list[tuple[str, str]]]:
        """Response headers, DATA and trailers of stream ``sid``."""
        blocks: list[list[tuple[str, str]]] = []
        data = bytearray()
        while True:
            chunk = await within(self.reader.read(1 << 16))
            assert chunk, "connection closed"
            for ftype, flags, fsid, payload in self.frames.feed(chunk):
                if ftype == f.SETTINGS and not flags & f.ACK:
                    self.writer.write(f.frame(f.SETTINGS, f.ACK, 0))
                if fsid != sid:
                    continue
                assert ftype in (f.HEADERS, f.DATA), (ftype, flags, bytes(payload))
                if ftype == f.DATA:
                    data += payload
                else:
                    assert flags & f.END_HEADERS
                    blocks.append([(str(k), str(v)) for k, v in self.decoder.decode(bytes(payload))])
                    if flags & f.END_STREAM:
                        assert len(blocks) == 2, blocks
                        return blocks[0], bytes(data), blocks[1]

    def close(self) -> None:
        self.writer.close()


async def test_a_hand_driven_client_with_continuation_padding_and_indexing() -> None:
    """Requests as other HTTP/2 stacks may send them: a header block split over CONTINUATION
    frames, padding and priority fields, HPACK dynamic-table references, a message split over
    DATA frames."""
    served = await serve("ours")
    raw = await RawClient.connect(served.port)
    try:
        path = "/protocol.Journal/Apply"
        for sid in (1, 3, 5):
            block = raw.block(path)  # the first adds to the dynamic table, the next refer to it
            body = apply_req(f"echo:{sid}").SerializeToString()
            msg = f.message_prefix(len(body)) + body
            head, rest = block[:3], block[3:]
            padded = bytes([7]) + b"\0\0\0\0\x10" + head + b"\0" * 7  # pad length, priority, ..., padding
            raw.writer.write(
                f.frame(f.HEADERS, f.PADDED | f.PRIORITY_FLAG, sid, padded)
                + f.frame(f.CONTINUATION, 0, sid, rest[:1])
                + f.frame(f.CONTINUATION, f.END_HEADERS, sid, rest[1:])
                + f.frame(f.DATA, f.PADDED, sid, bytes([3]) + msg[:4] + b"\0\0\0")
                + f.frame(f.DATA, 0, sid, msg[4:10])
                + f.frame(f.DATA, f.END_STREAM, sid, msg[10:]))
            headers, data, trailers = await raw.response(sid)
            assert headers == [(":status", "200"), ("content-type", "application/grpc")]
            assert trailers == [("grpc-status", "0")]
            reader = f.MessageReader(1 << 20)
            [resp] = reader.feed(memoryview(data))
            assert pb.ApplyResponse.FromString(bytes(resp)).header.process_id.suffix == f"echo:{sid}"
        # An unknown method: a trailers-only response.
        raw.writer.write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 7, raw.block("/x/y")))
        reader_frames: list[tuple[int, int, int, bytes]] = []
        while not any(t == f.HEADERS and sid == 7 for t, _, sid, _ in reader_frames):
            chunk = await within(raw.reader.read(1 << 16))
            assert chunk
            reader_frames += [(t, fl, sid, bytes(p)) for t, fl, sid, p in raw.frames.feed(chunk)]
        [(_, flags, _, block)] = [fr for fr in reader_frames if fr[0] == f.HEADERS and fr[2] == 7]
        assert flags & f.END_STREAM
        trailers_only = {str(k): str(v) for k, v in raw.decoder.decode(block)}
        assert trailers_only["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])
    finally:
        raw.close()
        await served.stop(0)



async def test_a_message_larger_than_the_stream_window_is_refused() -> None:
    """A message's window is returned when it is consumed whole, so the maximum message is
    one window: a larger one is refused (RESOURCE_EXHAUSTED), never left hanging."""
    served = await serve("ours")
    channel = Channel(served.target)
    try:
        stub = pb_grpc.JournalStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await within(stub.Append(iter(append_requests([17 << 20]))), 5.0)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        sizes = [8 << 20]
        expect_commit(await within(stub.Append(iter(append_requests(sizes))), 5.0), sizes)
    finally:
        await channel.close()
        await served.stop(0)


async def test_insecure_channel_follows_gazette_rpc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GAZETTE_RPC", raising=False)
    ours = insecure_channel("127.0.0.1:1")
    assert isinstance(ours, Channel)
    await ours.close()
    monkeypatch.setenv("GAZETTE_RPC", "grpcio")
    theirs: Any = insecure_channel("127.0.0.1:1")
    assert not isinstance(theirs, Channel)
    await theirs.close()

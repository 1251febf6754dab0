"""Batched methods of :class:`gazette.rpc.server.RpcServer` (``add_batch_servicer``).

A connection fed frames in memory (``RecordingTransport``): the calls of a batched method whose
whole request stream arrives in one read are handed to the servicer together, grouped by key;
a call still sending when the read ends, one the servicer declines and one whose message does
not decode are served alone by the method's handler; a call reset while its group runs is not
answered; an elapsed deadline ends its call alone; a group that fails or is stopped ends each of
its calls with a status. Every call gets exactly one end. A property: for any interleaving
of calls' frames cut into reads anywhere, the groups are exactly the whole calls of a read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import hpack
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fuzz.targets import RecordingTransport
from gazette.rpc import frames as f
from gazette.rpc.server import BatchCall, RpcServer, ServerConnection
from gazette.testing.eventually import eventually

JOIN = "/test.Batch/Join"
DEADLINE = 10.0


def _deserialize(data: bytes | memoryview) -> bytes:
    if bytes(data) == b"garbage":
        raise ValueError("not a request")
    return bytes(data)


async def _join_alone(requests: Any, context: Any) -> bytes:
    return b"alone:" + b"".join([r async for r in requests])


class Servicer:
    """Groups calls by their first request; ``b"alone"`` declines."""

    def __init__(self) -> None:
        self.groups: list[int] = []
        self.grouped: list[list[int]] = []  # each group's stream ids
        self.hold: asyncio.Event | None = None
        self.fail: BaseException | None = None
        self.keyed = 0  # calls group_key was asked about

    def group_key(self, call: BatchCall) -> object | None:
        self.keyed += 1
        first = call.requests[0] if call.requests else b""
        return None if first == b"alone" else first

    async def serve_group(self, calls: list[BatchCall]) -> list[Any]:
        self.groups.append(len(calls))
        self.grouped.append([c.stream.id for c in calls])
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        return [b"group:" + b"".join(c.requests) for c in calls]


def _server(servicer: Servicer) -> RpcServer:
    srv = RpcServer()
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Batch", {
        "Join": grpc.stream_unary_rpc_method_handler(_join_alone, request_deserializer=_deserialize)})])
    srv.add_batch_servicer(JOIN, servicer)
    return srv


def call_frames(sid: int, *messages: bytes, end: bool = True, timeout: float | None = None) -> bytes:
    block = f.request_headers(JOIN, "t", "t") + (f.timeout_header(timeout) if timeout else b"")
    out = [f.frame(f.HEADERS, f.END_HEADERS, sid, block)]
    for i, m in enumerate(messages):
        last = end and i == len(messages) - 1
        out.append(f.frame(f.DATA, f.END_STREAM if last else 0, sid, f.message_prefix(len(m)) + m))
    if end and not messages:
        out.append(f.frame(f.DATA, f.END_STREAM, sid))
    return b"".join(out)


class Peer:
    """The client's side of one in-memory connection: what it sent, what it got back."""

    def __init__(self, servicer: Servicer) -> None:
        self.servicer = servicer
        self.server = _server(servicer)
        self.conn = ServerConnection(self.server)
        self.transport = RecordingTransport()
        self.conn.connection_made(self.transport)
        self.conn.data_received(f.PREFACE + f.settings_frame({}))
        self._decoder = hpack.Decoder()
        self._reader = f.FrameReader(f.MAX_FRAME_LIMIT)
        self._seen = 0
        self.data: dict[int, bytes] = {}
        self.status: dict[int, str] = {}
        self.ends: dict[int, int] = {}  # trailers (or resets) per stream: exactly one each

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def read(self) -> None:
        self.conn.flush()
        new = bytes(self.transport.out[self._seen:])
        self._seen = len(self.transport.out)
        for ftype, _flags, sid, payload in self._reader.feed(new):
            if ftype == f.DATA:
                self.data[sid] = self.data.get(sid, b"") + bytes(payload)[5:]
            elif ftype == f.HEADERS:
                fields = {str(k): str(v) for k, v in self._decoder.decode(bytes(payload))}
                if "grpc-status" in fields:
                    self.status[sid] = fields["grpc-status"]
                    self.ends[sid] = self.ends.get(sid, 0) + 1
            elif ftype == f.RST_STREAM and sid not in self.status:
                self.ends[sid] = self.ends.get(sid, 0) + 1

    async def until(self, check: Callable[[], bool]) -> None:
        def done() -> bool:
            self.read()
            return check()
        await eventually(done, "the server's answers", DEADLINE)

    async def close(self) -> None:
        await self.server.stop(0)


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = Peer(Servicer())
    try:
        yield p
    finally:
        await p.close()


def code(name: str) -> str:
    return str(grpc.StatusCode[name].value[0])


async def test_whole_calls_of_one_read_are_grouped_by_key(peer: Peer) -> None:
    peer.send(call_frames(1, b"k", b"1") + call_frames(3, b"alone", b"2") + call_frames(5, b"k", b"3")
              + call_frames(7, b"k", b"4", end=False) + call_frames(9, b"j", b"5"))
    await peer.until(lambda: len(peer.status) == 4)
    assert peer.servicer.groups == [2]  # the two whole "k" calls; "j" alone is a group of one
    assert peer.data == {1: b"group:k1", 3: b"alone:alone2", 5: b"group:k3", 9: b"alone:j5"}
    assert set(peer.status.values()) == {code("OK")}
    # The call still sending when the read ended is served alone once it ends.
    peer.send(f.frame(f.DATA, f.END_STREAM, 7, f.message_prefix(1) + b"!"))
    await peer.until(lambda: 7 in peer.status)
    assert peer.data[7] == b"alone:k4!" and peer.status[7] == code("OK")
    assert set(peer.ends.values()) == {1}


async def test_a_lone_call_of_a_read_starts_alone_unkeyed(peer: Peer) -> None:
    peer.send(call_frames(1, b"k", b"1"))  # whole
    await peer.until(lambda: 1 in peer.status)
    peer.send(call_frames(3, b"k", b"garbage"))  # whole, undecodable
    await peer.until(lambda: 3 in peer.status)
    peer.send(call_frames(5, b"k", end=False))  # still sending when its read ends
    peer.send(f.frame(f.DATA, f.END_STREAM, 5, f.message_prefix(1) + b"2"))
    await peer.until(lambda: 5 in peer.status)
    assert peer.data == {1: b"alone:k1", 5: b"alone:k2"}
    assert (peer.status[1], peer.status[3], peer.status[5]) == (code("OK"), code("INVALID_ARGUMENT"), code("OK"))
    assert peer.servicer.keyed == 0 and peer.servicer.groups == []
    assert set(peer.ends.values()) == {1}


async def test_a_call_that_does_not_decode_is_invalid_argument_alone(peer: Peer) -> None:
    peer.send(call_frames(1, b"k", b"garbage") + call_frames(3, b"k", b"1") + call_frames(5, b"k", b"2"))
    await peer.until(lambda: len(peer.status) == 3)
    assert peer.servicer.groups == [2]
    assert peer.status[1] == code("INVALID_ARGUMENT")
    assert (peer.data[3], peer.data[5]) == (b"group:k1", b"group:k2")


async def test_a_call_reset_while_its_group_runs_is_not_answered(peer: Peer) -> None:
    peer.servicer.hold = asyncio.Event()
    peer.send(call_frames(1, b"k", b"1") + call_frames(3, b"k", b"2"))
    await peer.until(lambda: peer.servicer.groups == [2])
    peer.send(f.rst_stream(1, f.CANCEL))
    peer.servicer.hold.set()
    await peer.until(lambda: 3 in peer.status)
    assert peer.status == {3: code("OK")} and 1 not in peer.data


async def test_an_elapsed_deadline_ends_its_call_alone(peer: Peer) -> None:
    peer.servicer.hold = asyncio.Event()
    peer.send(call_frames(1, b"k", b"1", timeout=0.01) + call_frames(3, b"k", b"2"))
    await peer.until(lambda: 1 in peer.status)
    assert peer.status == {1: code("DEADLINE_EXCEEDED")}
    peer.servicer.hold.set()
    await peer.until(lambda: 3 in peer.status)
    assert peer.status[3] == code("OK") and 1 not in peer.data
    assert set(peer.ends.values()) == {1}


@pytest.mark.parametrize("stop", [False, True])
async def test_a_failed_or_stopped_group_ends_each_call(stop: bool, peer: Peer) -> None:
    if stop:
        peer.servicer.hold = asyncio.Event()  # never set: the server's stop cancels the group
    else:
        peer.servicer.fail = RuntimeError("broken servicer")
    peer.send(call_frames(1, b"k", b"1") + call_frames(3, b"k", b"2"))
    await peer.until(lambda: peer.servicer.groups == [2])
    if stop:
        await peer.server.stop(0)
    await peer.until(lambda: len(peer.status) == 2)
    want = code("UNAVAILABLE") if stop else code("UNKNOWN")
    assert peer.status == {1: want, 3: want}


_KEYS = [b"a", b"b", b"alone"]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_arrival_groups_exactly_the_whole_calls_of_a_read(data: st.DataObject) -> None:
    """Calls' frames interleaved in any order and cut into reads anywhere: every call is
    answered once, and the groups are exactly the calls of one key (two or more) whose headers
    and end of stream both arrived in the same read."""
    calls = data.draw(st.lists(st.tuples(st.sampled_from(_KEYS), st.lists(st.binary(min_size=1, max_size=8),
                                                                           max_size=2)),
                               min_size=1, max_size=8))
    order = data.draw(st.permutations([i for i, (_, msgs) in enumerate(calls) for _ in range(len(msgs) + 3)]))
    sids: dict[int, int] = {}
    taken = [0] * len(calls)
    frames: list[tuple[int, bool, bytes]] = []  # call, ends it, frame
    for i in order:
        key, msgs = calls[i]
        step, taken[i] = taken[i], taken[i] + 1
        if step == 0:
            sids[i] = 1 + 2 * len(sids)
            frames.append((i, False, f.frame(f.HEADERS, f.END_HEADERS, sids[i], f.request_headers(JOIN, "t", "t"))))
        else:
            # The key, the messages, then an empty DATA frame ending the stream.
            last = step == len(msgs) + 2
            m = b"" if last else [key, *msgs][step - 1]
            payload = b"" if last else f.message_prefix(len(m)) + m
            frames.append((i, last, f.frame(f.DATA, f.END_STREAM if last else 0, sids[i], payload)))
    stream = b"".join(fr for _, _, fr in frames)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=6)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    def read_of(end: int) -> int:  # the read holding byte end - 1
        return sum(1 for c in cuts if c < end)

    pos, opened, ended = 0, {}, {}
    for i, last, fr in frames:
        pos += len(fr)
        if fr[3] == f.HEADERS:
            opened[i] = read_of(pos)
        if last:
            ended[i] = read_of(pos)
    expected: dict[tuple[int, bytes], set[int]] = {}
    for i, (key, _) in enumerate(calls):
        if key != b"alone" and opened[i] == ended[i]:
            expected.setdefault((opened[i], key), set()).add(sids[i])
    want_groups = sorted(sorted(g) for g in expected.values() if len(g) > 1)
    grouped = {sid for g in want_groups for sid in g}
    event(f"groups: {min(len(want_groups), 2)}")

    async def run() -> None:
        servicer = Servicer()
        peer = Peer(servicer)
        try:
            for chunk in reads:
                peer.send(chunk)
                await asyncio.sleep(0)  # the loop's turn between reads, as on a socket
            await peer.until(lambda: len(peer.status) == len(calls))
            assert sorted(sorted(g) for g in servicer.grouped) == want_groups
            for i, (key, msgs) in enumerate(calls):
                sid = sids[i]
                body = b"".join([key, *msgs])
                assert peer.data.get(sid) == (b"group:" if sid in grouped else b"alone:") + body
                assert peer.status[sid] == code("OK")
            assert set(peer.ends.values()) == {1}
        finally:
            await peer.close()

    asyncio.run(run())

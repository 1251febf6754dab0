"""The replication pipeline and the peer's Replicate serving, in process.

Peers are real ``replicate.serve`` coroutines over real spools, behind in-memory streams
(``FakePeer``) that can hold back their responses. The pipeline is the primary's real
``Pipeline``. Cases: replicas converge; full duplex (a later append streams while an earlier
one's acknowledgements are held back, and each reads its own, in order); synchronisation
answers (roll forward, read through a later revision, mismatches as errors); failures
(a peer that breaks fails the append; teardown rolls back everywhere); the content fast
path decodes exactly what protobuf would.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.broker.pipeline import Pipeline, ReplicationError, encode_content
from gazette.broker.replicate import ReplicateStreamError, serve
from gazette.broker.resolver import Resolution
from gazette.broker.spool import Spool
from gazette.broker.wire import decode_request
from gazette.fragment import Fragment
from gazette.protocol import protocol_pb2 as pb

JOURNAL = "a/journal"
MEMBERS = [("zone-a", "first"), ("zone-a", "second"), ("zone-b", "third")]
PRIMARY = 0


def route(members: list[tuple[str, str]] = MEMBERS, primary: int = PRIMARY) -> pb.Route:
    r = pb.Route(primary=primary)
    for zone, suffix in members:
        r.members.add(zone=zone, suffix=suffix)
    return r


def header(revision: int = 10, r: pb.Route | None = None) -> pb.Header:
    h = pb.Header()
    h.route.CopyFrom(r if r is not None else route())
    h.process_id.CopyFrom(h.route.members[h.route.primary])
    h.etcd.revision = revision
    h.etcd.cluster_id = h.etcd.member_id = h.etcd.raft_term = 1
    return h


@dataclass
class FakeBroker:
    """What ``serve`` needs of a broker: a resolver answering for one local replica."""

    local: int
    status: int = pb.OK
    revision: int = 10
    peer_route: pb.Route = field(default_factory=route)
    replica: Any = None

    def __post_init__(self) -> None:
        self.replica = SimpleNamespace(
            spool=Spool(JOURNAL), spool_lock=asyncio.Lock(), cancelled=False, route_signal=asyncio.Event())
        self.resolver = self

    def cached(self, journal: str, **_: Any) -> Resolution | None:
        return None  # nothing cached: every append resolves

    async def resolve(self, journal: str, **_: Any) -> Resolution:
        assert journal == JOURNAL
        h = header(self.revision, self.peer_route)
        zone, suffix = MEMBERS[self.local]
        h.process_id.zone, h.process_id.suffix = zone, suffix
        return Resolution(status=self.status, header=h, local_id=h.process_id, replica=self.replica,
                          signal=self.replica.route_signal)


class FakePeer:
    """A PeerStream into ``serve`` of a FakeBroker; responses can be held back (``hold``)."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.requests: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.responses: asyncio.Queue[pb.ReplicateResponse | BaseException | None] = asyncio.Queue()
        self.released = asyncio.Event()
        self.released.set()
        self.written: list[bytes] = []
        self.fail_writes: BaseException | None = None
        self.task = asyncio.ensure_future(self._serve())

    @property
    def spool(self) -> Spool:
        spool: Spool = self.broker.replica.spool
        return spool

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    async def _requests(self) -> AsyncIterator[bytes]:
        while (data := await self.requests.get()) is not None:
            yield data

    async def _serve(self) -> None:
        try:
            await serve(self.broker, self._requests(), self.responses.put)  # type: ignore[arg-type]
        except BaseException as err:  # noqa: BLE001 - handed to the reader, like a gRPC status
            await self.responses.put(err)
            if isinstance(err, asyncio.CancelledError):
                raise
            return
        await self.responses.put(None)

    async def write(self, data: bytes) -> None:
        if self.fail_writes is not None:
            self.task.cancel()  # as with gRPC, a broken stream is broken both ways
            raise self.fail_writes
        self.written.append(data)
        await self.requests.put(data)

    async def read(self) -> pb.ReplicateResponse | None:
        await self.released.wait()
        got = await self.responses.get()
        if isinstance(got, BaseException):
            raise got
        return got

    async def done_writing(self) -> None:
        await self.requests.put(None)

    def ended(self) -> bool:
        return self.task.done() or self.fail_writes is not None  # as a reset gRPC stream

    def cancel(self) -> None:
        self.task.cancel()


class Cluster:
    """A primary spool and pipeline over two FakePeers (route members 1 and 2)."""

    def __init__(self) -> None:
        self.spool = Spool(JOURNAL)
        self.lock = asyncio.Lock()
        self.peers = {1: FakePeer(FakeBroker(1)), 2: FakePeer(FakeBroker(2))}

    async def pipeline(self, hdr: pb.Header | None = None) -> Pipeline:
        await self.lock.acquire()
        return Pipeline(hdr or header(), self.spool, self.lock.release, [None, self.peers[1], self.peers[2]])

    def spools(self) -> list[Spool]:
        return [self.spool, self.peers[1].spool, self.peers[2].spool]


def proposal(frag: Fragment | pb.Fragment, *, ack: bool = True, hdr: pb.Header | None = None,
             registers: pb.LabelSet | None = None) -> pb.ReplicateRequest:
    req = pb.ReplicateRequest(proposal=frag if isinstance(frag, pb.Fragment) else frag.to_proto(),
                              acknowledge=ack)
    if registers is not None:
        req.registers.CopyFrom(registers)
    if hdr is not None:
        req.header.CopyFrom(hdr)
    return req


async def sync(pln: Pipeline, hdr: pb.Header | None = None) -> tuple[int, pb.LabelSet | None, int]:
    await pln.scatter(proposal(pln.spool.fragment, hdr=hdr or pln.header))
    wait_for, close_after = pln.barrier()
    await wait_for
    out = await pln.gather_sync()
    close_after.set_result(None)
    return out


async def append(pln: Pipeline, content: bytes, chunk: int = 7) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
    """Scatters one append's content and commit; returns its read barrier (wait_for, close_after)."""
    delta = 0
    for i in range(0, len(content), chunk):
        part = content[i:i + chunk]
        await pln.scatter_content(part, delta)
        delta += len(part)
    await pln.scatter(proposal(pln.spool.next_fragment()))
    return pln.barrier()


async def read_acks(pln: Pipeline, barrier: tuple[asyncio.Future[None], asyncio.Future[None]],
                    log: list[str], name: str) -> None:
    wait_for, close_after = barrier
    await wait_for
    log.append(f"{name} reads")
    await pln.gather_ok()
    close_after.set_result(None)
    log.append(f"{name} acked")


# --- tests ----------------------------------------------------------------------------------


async def test_replicas_converge_on_the_primary_spool() -> None:
    c = Cluster()
    pln = await c.pipeline()
    assert await sync(pln) == (0, None, 0)
    log: list[str] = []
    for i in range(5):
        await read_acks(pln, await append(pln, f"record {i}\n".encode() * (i + 1)), log, str(i))
    assert pln.recv_err() is None and pln.send_err() is None
    frags = {s.fragment for s in c.spools()}
    assert len(frags) == 1
    (frag,) = frags
    content = b"".join(f"record {i}\n".encode() * (i + 1) for i in range(5))
    assert (frag.begin, frag.end, frag.sum) == (0, len(content), hashlib.sha1(content).digest())
    # Every peer was sent each content chunk exactly once, in the one encoding.
    assert c.peers[1].written[1:] == c.peers[2].written[1:]


async def test_full_duplex_appends_read_their_own_acks_in_order() -> None:
    c = Cluster()
    pln = await c.pipeline()
    await sync(pln)
    log: list[str] = []
    c.peers[2].hold()  # the first append's acknowledgements are late
    first = await append(pln, b"first\n")
    reader1 = asyncio.ensure_future(read_acks(pln, first, log, "first"))
    # While the first awaits its acks, the second streams and commits (send side is free).
    second = await append(pln, b"second\n")
    reader2 = asyncio.ensure_future(read_acks(pln, second, log, "second"))
    await asyncio.sleep(0)
    for _ in range(5):  # give the readers every chance to run out of turn
        await asyncio.sleep(0)
    assert log == ["first reads"]
    assert c.peers[1].spool.fragment.end == len(b"first\nsecond\n")  # peer 1 already has both
    c.peers[2].release()
    await asyncio.gather(reader1, reader2)
    assert log == ["first reads", "first acked", "second reads", "second acked"]
    assert pln.recv_err() is None
    assert all(r is not None and r.status == pb.OK for r in pln.recv_resp[1:])
    assert {s.fragment.end for s in c.spools()} == {13}


async def test_sync_rolls_forward_to_a_peer_ahead_and_takes_its_registers() -> None:
    c = Cluster()
    regs = pb.LabelSet()
    regs.labels.add(name="reg", value="ahead")
    # Peer 2 committed content the others never saw (say, from a primary that died).
    p2 = c.peers[2].spool
    p2.apply(pb.ReplicateRequest(content=b"abandoned\n"))
    assert p2.apply(proposal(p2.next_fragment(), registers=regs)).status == pb.OK
    pln = await c.pipeline()
    roll_to, roll_regs, read_through = await sync(pln)
    assert (roll_to, read_through) == (10, 0) and roll_regs == regs
    # Propose everyone roll to an empty fragment at the largest offset: all agree.
    await pln.scatter(proposal(Fragment(JOURNAL, roll_to, roll_to), registers=roll_regs))
    wait_for, close_after = pln.barrier()
    await wait_for
    assert await pln.gather_sync() == (0, None, 0)
    close_after.set_result(None)
    assert {(s.fragment.begin, s.fragment.end) for s in c.spools()} == {(10, 10)}
    assert all(s.registers == regs for s in c.spools())


async def test_sync_rolls_a_peer_behind_to_our_end() -> None:
    c = Cluster()
    c.spool.apply(pb.ReplicateRequest(content=b"ours\n"))
    c.spool.must_apply(proposal(c.spool.next_fragment()))
    pln = await c.pipeline()
    # Peers roll to an empty fragment at our end, which they cannot extend ours from.
    roll_to, _, _ = await sync(pln)
    assert roll_to == 5
    await pln.scatter(proposal(Fragment(JOURNAL, 5, 5)))
    wait_for, close_after = pln.barrier()
    await wait_for
    assert await pln.gather_sync() == (0, None, 0)
    close_after.set_result(None)
    assert {(s.fragment.begin, s.fragment.end) for s in c.spools()} == {(5, 5)}


async def test_sync_reads_through_a_later_revision_of_a_different_route() -> None:
    c = Cluster()
    later = route(MEMBERS[:2] + [("zone-b", "fourth")])
    c.peers[2].broker.peer_route = later
    c.peers[2].broker.revision = 42
    pln = await c.pipeline()
    assert await sync(pln) == (0, None, 42)
    assert pln.recv_err() is None
    # The same route at a later revision is no reason to re-resolve: it is an error here.
    c2 = Cluster()
    c2.peers[1].broker.revision = 99
    c2.peers[1].broker.peer_route = route(primary=1)
    c2.peers[1].broker.status = pb.OK
    pln2 = await c2.pipeline(header(99))
    roll_to, _, read_through = await sync(pln2, header(99))
    assert read_through == 0 and pln2.recv_err() is not None
    assert "WRONG_ROUTE" in str(pln2.recv_err())


async def test_sync_refusal_and_unexpected_mismatch_are_errors() -> None:
    c = Cluster()
    c.peers[1].broker.status = pb.NOT_JOURNAL_BROKER
    # Peer 2 holds different content at the same offsets: no roll can reconcile that.
    c.spool.apply(pb.ReplicateRequest(content=b"mine\n"))
    c.spool.must_apply(proposal(c.spool.next_fragment()))
    p2 = c.peers[2].spool
    p2.apply(pb.ReplicateRequest(content=b"them\n"))
    p2.must_apply(proposal(p2.next_fragment()))
    pln = await c.pipeline()
    await sync(pln)
    assert pln.broken
    assert isinstance(pln.recv_errs[1], ReplicationError) and "NOT_JOURNAL_BROKER" in str(pln.recv_errs[1])
    assert isinstance(pln.recv_errs[2], ReplicationError) and "PROPOSAL_MISMATCH" in str(pln.recv_errs[2])


async def test_a_failed_peer_fails_the_append_and_teardown_rolls_back_everywhere() -> None:
    c = Cluster()
    pln = await c.pipeline()
    await sync(pln)
    await read_acks(pln, await append(pln, b"kept\n"), [], "kept")
    # Content reaches every spool; then peer 1's stream breaks before the commit.
    await pln.scatter_content(b"lost\n", 0)
    c.peers[1].fail_writes = ConnectionResetError("peer went away")
    await pln.scatter(proposal(pln.spool.next_fragment()))
    for _ in range(3):
        await asyncio.sleep(0)  # the sender task meets the failure
    assert isinstance(pln.send_err(), ReplicationError)
    assert "peer went away" in str(pln.send_err()) and pln.broken
    # As the append state machine does: tear the broken pipeline down.
    await pln.shutdown(expect_err=True)
    assert not c.lock.locked()  # the spool is released
    await asyncio.wait_for(asyncio.gather(c.peers[1].task, c.peers[2].task, return_exceptions=True), 5)
    # Peer 1 never saw the commit and rolled the pending content back when its stream ended.
    assert (c.peers[1].spool.fragment.end, c.peers[1].spool.delta) == (5, 0)
    assert not c.peers[1].broker.replica.spool_lock.locked()
    assert not c.peers[2].broker.replica.spool_lock.locked()


async def test_shutdown_reads_every_peers_end_of_stream_in_turn() -> None:
    c = Cluster()
    pln = await c.pipeline()
    await sync(pln)
    c.peers[1].hold()
    first = await append(pln, b"pending ack\n")
    log: list[str] = []
    reader = asyncio.ensure_future(read_acks(pln, first, log, "first"))
    shutdown = asyncio.ensure_future(pln.shutdown(expect_err=False))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not shutdown.done()  # waits for the earlier append's turn on the receive side
    c.peers[1].release()
    await asyncio.wait_for(asyncio.gather(reader, shutdown), 5)
    assert log == ["first reads", "first acked"]
    assert pln.recv_err() is None
    assert {s.fragment.end for s in c.spools()} == {12}


async def test_serve_answers_wrong_route_and_refuses_bad_streams() -> None:
    broker = FakeBroker(1, peer_route=route(primary=1), revision=11)

    async def run(*reqs: bytes) -> list[pb.ReplicateResponse]:
        async def it() -> AsyncIterator[bytes]:
            for r in reqs:
                yield r
        out: list[pb.ReplicateResponse] = []

        async def send(resp: pb.ReplicateResponse) -> None:
            out.append(resp)
        await serve(broker, it(), send)  # type: ignore[arg-type]
        return out

    out = await run(proposal(Fragment(JOURNAL, 0, 0), hdr=header()).SerializeToString())
    assert [r.status for r in out] == [pb.WRONG_ROUTE]
    assert out[0].header.etcd.revision == 11
    broker.peer_route = route()
    with pytest.raises(ReplicateStreamError) as info:
        await run(proposal(Fragment(JOURNAL, 0, 0)).SerializeToString())  # no header
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ReplicateStreamError):
        await run(b"\xff\xff\xff")
    with pytest.raises(ReplicateStreamError) as info:  # content at the wrong delta
        await run(proposal(Fragment(JOURNAL, 0, 0), hdr=header()).SerializeToString(),
                  encode_content(b"abc", 5))
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not broker.replica.spool_lock.locked()
    assert broker.replica.spool.delta == 0


@settings(max_examples=200, deadline=None)
@given(content=st.binary(min_size=1, max_size=300), delta=st.integers(0, (1 << 63) - 1))
def test_content_fast_path_decodes_as_protobuf(content: bytes, delta: int) -> None:
    wire = encode_content(content, delta)
    assert wire == pb.ReplicateRequest(content=content, content_delta=delta).SerializeToString()
    got = decode_request(wire)
    assert isinstance(got, tuple)
    assert (bytes(got[0]), got[1]) == (content, delta)


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=50), delta=st.integers(0, 1000), ack=st.booleans(),
       begin=st.integers(0, 1000), journal=st.sampled_from(["", JOURNAL]))
def test_other_requests_take_the_protobuf_path(content: bytes, delta: int, ack: bool, begin: int,
                                               journal: str) -> None:
    req = pb.ReplicateRequest(content=content, content_delta=delta, acknowledge=ack)
    if journal:
        req.proposal.journal = journal
        req.proposal.begin = req.proposal.end = begin
    wire = req.SerializeToString()
    got = decode_request(wire)
    if isinstance(got, tuple):
        assert (bytes(got[0]), got[1]) == (content, delta) and not ack and not journal
    else:
        assert got == req

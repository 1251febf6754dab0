"""The append state machine over a real replica, pipeline and in-process peers.

A ``FSMBroker`` stands in for the broker around ``append.append``: it resolves the journal to a
route of three members (this broker primary), dials peers as ``FakePeer`` streams into
``replicate.serve`` over spools of their own (a rebuilt pipeline dials the same peers again),
and records route advertisements. Cases: concurrent appends are pipelined (one streams while an
earlier one awaits its acknowledgements) and answered in offset order; a peer failing fails the
append, and the next append rebuilds the pipeline; a peer ahead makes the first append land
after its offset; stores beyond the head refuse appends until an explicit offset confirms it; a
client cancelled mid-append leaves nothing behind anywhere.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_pipeline import JOURNAL, MEMBERS, FakeBroker, FakePeer, header, route

from gazette.allocator import keys
from gazette.auth import NO_AUTH, Verifier
from gazette.broker import append as append_mod
from gazette.broker.flow import READ_AHEAD
from gazette.broker.health import HealthTicker
from gazette.broker.persister import Persister
from gazette.broker.pipeline import PeerStream, ReplicationError
from gazette.broker.replica import Replica
from gazette.broker.resolver import Resolution
from gazette.broker.spool import Spool
from gazette.etcd.keyspace import KeyValue
from gazette.fragment import CoverSet, Fragment
from gazette.fragment.stores import Stores
from gazette.protocol import protocol_pb2 as pb


class FSMBroker:
    """Just enough of a Broker for ``append.append`` (see the module docstring)."""

    def __init__(self, tmp: Path, tg: asyncio.TaskGroup) -> None:
        self.spec = pb.JournalSpec(name=JOURNAL, replication=3)
        self.spec.fragment.length = 1 << 20
        self.spec.fragment.compression_codec = pb.NONE
        self.spec.fragment.stores.append("file:///")
        self.spec.fragment.refresh_interval.seconds = 3600
        (tmp / "store").mkdir()
        self.stores = Stores(file_root=str(tmp / "store"))
        self.persister = Persister(self.stores, lambda _: self.spec)
        self.tmp, self.tg = tmp, tg
        self.replica = Replica(JOURNAL, self.spec, str(tmp), self.stores, self.persister, tg)
        self.replica.set_primary(True)
        self.resolver = self
        self.peer_brokers = {1: FakeBroker(1), 2: FakeBroker(2)}
        self.streams: list[FakePeer] = []
        self.fail_next_dial: int | None = None
        self.revision = 10
        self.advertised = False
        self.config = SimpleNamespace(max_append_rate=0, min_append_rate=0)  # no flow control
        self.verifier: Verifier = NO_AUTH  # tokens are not checked (group commit verifies one per group)
        self.store_health = self

    def healthy_for_append(self, spec: pb.JournalSpec) -> bool:
        return True  # the store is healthy

    async def await_append_status(self, spec: pb.JournalSpec) -> tuple[int, str]:
        return pb.OK, ""  # the store is healthy

    def peer_spools(self) -> list[Spool]:
        return [self.peer_brokers[1].replica.spool, self.peer_brokers[2].replica.spool]

    def cached(self, journal: str, **_: Any) -> Resolution | None:
        return None  # nothing cached: every append resolves

    async def resolve(self, journal: str, **_: Any) -> Resolution:
        hdr = header(self.revision)
        r = route()
        assignments = []
        for slot, (zone, suffix) in enumerate(MEMBERS):
            value = r if self.advertised else None
            key = keys.assignment_key("/root", journal, zone, suffix, 0 if slot == 0 else slot)
            assignments.append(KeyValue(key, value, b"", 1, self.revision, 1, 0))
        return Resolution(status=pb.OK, header=hdr, local_id=hdr.process_id, spec=self.spec,
                          replica=self.replica, assignments=assignments,
                          signal=self.replica.route_signal)

    def dial_replicate(self, r: pb.Route, i: int) -> PeerStream:
        peer = FakePeer(self.peer_brokers[i])
        if self.fail_next_dial == i:
            peer.fail_writes = ConnectionResetError("peer went away")
            self.fail_next_dial = None
        self.streams.append(peer)
        return peer

    async def update_assignments(self, replica: Replica, res: Resolution) -> int:
        self.advertised = True
        self.revision += 1
        return self.revision

    async def update_suspend(self, res: Resolution, level: int, offset: int) -> int:
        raise AssertionError("not expected")


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[FSMBroker]:
    async with asyncio.TaskGroup() as tg:
        b = FSMBroker(tmp_path, tg)
        try:
            yield b
        finally:
            b.replica.cancel()
            assert b.replica.retired is not None
            await asyncio.wait_for(b.replica.retired, 5)


def chunks(*parts: bytes, commit: bool = True) -> AsyncIterator[pb.AppendRequest]:
    async def gen() -> AsyncIterator[pb.AppendRequest]:
        for p in parts:
            yield pb.AppendRequest(content=p)
        if commit:
            yield pb.AppendRequest()
    return gen()


async def do_append(b: FSMBroker, *parts: bytes, offset: int = 0) -> pb.AppendResponse:
    return await append_mod.append(b, pb.AppendRequest(journal=JOURNAL, offset=offset), chunks(*parts))  # type: ignore[arg-type]


def fragments(b: FSMBroker) -> set[tuple[int, int, bytes]]:
    return {(s.fragment.begin, s.fragment.end, s.fragment.sum) for s in [b.replica.spool, *b.peer_spools()]}


async def test_first_append_synchronises_and_advertises(broker: FSMBroker) -> None:
    resp = await do_append(broker, b"hello\n")
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 6)
    assert broker.advertised
    assert fragments(broker) == {(0, 6, hashlib.sha1(b"hello\n").digest())}
    assert len(broker.streams) == 2  # one pipeline, reused below
    await do_append(broker, b"again\n")
    assert len(broker.streams) == 2


async def test_concurrent_appends_are_pipelined_and_answered_in_order(broker: FSMBroker) -> None:
    await do_append(broker, b"start\n")
    held = broker.streams[1]  # peer 2's stream
    held.hold()
    first = asyncio.ensure_future(do_append(broker, b"first\n"))
    # The first append commits and waits for peer 2's acknowledgement; meanwhile the send
    # side is free, and the next appends stream and commit behind it.
    rest = [asyncio.ensure_future(do_append(broker, f"next {i}\n".encode())) for i in range(5)]

    def peer1_end() -> int:
        return broker.peer_spools()[0].fragment.end

    for _ in range(200):
        if peer1_end() == 6 + 6 + 5 * 7:
            break
        await asyncio.sleep(0)
    assert peer1_end() == 6 + 6 + 5 * 7  # every commit reached peer 1 while acks were held
    assert not first.done() and not any(t.done() for t in rest)
    held.release()
    resps = [await first] + [await t for t in rest]
    assert all(r.status == pb.OK for r in resps)
    begins = [r.commit.begin for r in resps]
    assert begins == sorted(begins) and begins[0] == 6
    ends = {r.commit.end for r in resps}
    assert max(ends) == 6 + 6 + 5 * 7
    assert len(fragments(broker)) == 1
    assert all(not lock.locked() for lock in [broker.replica.send_lock])


async def test_a_failed_peer_fails_the_append_and_the_next_rebuilds(broker: FSMBroker) -> None:
    await do_append(broker, b"before\n")
    broker.streams[0].fail_writes = ConnectionResetError("peer went away")
    with pytest.raises(ReplicationError, match="peer went away"):
        await do_append(broker, b"lost?\n")
    # The next append tears the broken pipeline down and builds a new one.
    resp = await do_append(broker, b"after\n")
    assert resp.status == pb.OK
    assert len(broker.streams) == 4
    frags = fragments(broker)
    assert len(frags) == 1
    (frag,) = frags
    assert frag[1] == resp.commit.end
    # Nothing is left pending anywhere, and no peer still holds a spool for the old stream.
    assert all(s.delta == 0 for s in [broker.replica.spool, *broker.peer_spools()])


async def test_a_peer_ahead_moves_the_head_forward(broker: FSMBroker) -> None:
    ahead = broker.peer_spools()[1]
    ahead.apply(pb.ReplicateRequest(content=b"committed elsewhere\n"))
    assert ahead.apply(pb.ReplicateRequest(proposal=ahead.next(), acknowledge=True)).status == pb.OK
    resp = await do_append(broker, b"mine\n")
    assert resp.status == pb.OK
    assert resp.commit.begin == 20  # after the peer's content: an offset is never reused
    assert {f[:2] for f in fragments(broker)} == {(20, 25)}


async def test_stores_beyond_the_head_need_an_explicit_offset(broker: FSMBroker) -> None:
    await do_append(broker, b"head\n")
    await broker.replica.wait_first_refresh()
    far = Fragment(JOURNAL, 100, 110, backing_store="file:///", mod_time=1)
    broker.replica.index.replace_remote(CoverSet([far]))
    resp = await do_append(broker, b"refused\n")
    assert resp.status == pb.INDEX_HAS_GREATER_OFFSET
    resp = await do_append(broker, b"wrong\n", offset=50)
    assert resp.status == pb.WRONG_APPEND_OFFSET
    resp = await do_append(broker, b"confirmed\n", offset=110)
    assert resp.status == pb.OK and resp.commit.begin == 110
    assert {f[:2] for f in fragments(broker)} == {(110, 120)}


async def test_a_cancelled_client_leaves_nothing_behind(broker: FSMBroker) -> None:
    await do_append(broker, b"kept\n")
    gate = asyncio.Event()

    # A chunk of READ_AHEAD bytes: the append queues and streams it (a smaller one would be
    # read ahead, and the stalled client would never reach the pipeline).
    pending = b"n" * READ_AHEAD

    async def stalled() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(content=pending)
        await gate.wait()
        yield pb.AppendRequest()

    task = asyncio.ensure_future(append_mod.append(broker, pb.AppendRequest(journal=JOURNAL), stalled()))  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not all(s.delta == len(pending) for s in [broker.replica.spool, *broker.peer_spools()]):
        assert loop.time() < deadline  # the chunk is scattered by worker threads
        await asyncio.sleep(0.005)
    assert all(s.delta == len(pending) for s in [broker.replica.spool, *broker.peer_spools()])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    resp = await do_append(broker, b"next\n")
    assert resp.status == pb.OK and resp.commit.begin == 5
    assert {f[:2] for f in fragments(broker)} == {(0, 10)}


async def test_a_peer_lost_before_its_ack_fails_the_append_but_keeps_the_offset(broker: FSMBroker) -> None:
    await do_append(broker, b"before\n")
    lost = broker.streams[1]
    lost.hold()
    task = asyncio.ensure_future(do_append(broker, b"unacknowledged\n"))
    for _ in range(200):
        if broker.peer_spools()[1].fragment.end == 22:
            break
        await asyncio.sleep(0)
    assert broker.peer_spools()[1].fragment.end == 22  # committed there, not yet acknowledged
    while not lost.responses.empty():  # the peer goes away before its answer is sent
        lost.responses.get_nowait()
    lost.task.cancel()
    lost.release()
    with pytest.raises(ReplicationError):
        await task
    # Every replica applied that commit, so the next synchronisation keeps it (Gazette's
    # at-least-once edge): the next append lands after it, never over it.
    resp = await do_append(broker, b"after\n")
    assert resp.status == pb.OK and resp.commit.begin == 22
    assert {f[:2] for f in fragments(broker)} == {(0, 28)}


async def replica_with_ticker(
    broker: FSMBroker,
) -> tuple[Replica, list[int], Callable[..., bool], HealthTicker]:
    """The fixture's replica replaced by one ticked by an injected-clock HealthTicker (a tick
    every 1.0) whose pulses are recorded: ``(replica, pulses, tick, ticker)``. ``pulses``
    holds the replica's stable-tick count at each pulse; ``tick()`` moves one health interval
    on (``tick(seconds, due)``: that long, expecting ``due`` replicas ticked) and says whether
    the tick asked for a pulse."""
    pulses: list[int] = []

    async def pulse(replica: Replica, suspend: bool) -> None:
        pulses.append(replica._stable_ticks)
        await append_mod.pulse(broker, replica, suspend)  # type: ignore[arg-type]

    old = broker.replica
    old.cancel()
    assert old.retired is not None
    await asyncio.wait_for(old.retired, 5)
    now = [0.0]
    ticker = HealthTicker(1.0, clock=lambda: now[0], rand=lambda: 0.5)
    r = broker.replica = Replica(JOURNAL, broker.spec, str(broker.tmp), broker.stores, broker.persister,
                                 broker.tg, pulse, ticker=ticker)

    def tick(seconds: float = 1.0, due: int = 1) -> bool:
        now[0] += seconds
        assert ticker.tick() == due
        return r._pulse_now.is_set()

    return r, pulses, tick, ticker


async def test_health_ticks_pulse_only_a_pipeline_that_is_not_whole(broker: FSMBroker) -> None:
    """A primary's health tick pulses (a zero-byte append through every peer) only when its
    pipeline is missing or a peer's stream ended, and every FULL_PULSE_TICKS ticks regardless:
    an idle journal with a whole pipeline costs a counter, not a round trip to its peers."""
    from gazette.broker import replica as replica_mod
    from gazette.testing.eventually import eventually

    r, pulses, tick, ticker = await replica_with_ticker(broker)

    # Becoming primary pulses at once: a pipeline is built, synchronised, and released
    # (no append used it); an append builds the next.
    r.set_primary(True)
    await eventually(lambda: pulses == [0] and r.pln is None and not r.send_lock.locked(),
                     "the first pulse's pipeline, released")
    assert (await do_append(broker, b"hello\n")).status == pb.OK
    assert len(broker.streams) == 4 and r.pln is not None
    # Whole: nothing to verify (and not yet idle long enough to be released).
    assert [tick() for _ in range(replica_mod.RELEASE_TICKS)] == [False] * replica_mod.RELEASE_TICKS
    assert len(broker.streams) == 4 and r.pln is not None

    # Peer 1's stream ends while the journal is idle: the next tick pulses, which fails on
    # it, and the pulse that follows builds a new pipeline.
    broker.streams[2].fail_writes = ConnectionResetError("peer went away")
    assert tick()
    await eventually(lambda: len(broker.streams) == 6 and not r._pulse_now.is_set()
                     and not r.send_lock.locked(), "a new pipeline dialled by a pulse")
    rebuilt = len(pulses)
    assert rebuilt >= 2 and pulses[1] == replica_mod.RELEASE_TICKS + 1

    due = [tick() for _ in range(r._stable_ticks, replica_mod.FULL_PULSE_TICKS)]
    assert due == [False] * (len(due) - 1) + [True]  # re-verified end to end at the 15th
    await eventually(lambda: len(pulses) == rebuilt + 1, "the 15th tick's pulse")
    r.set_primary(False)
    assert not tick(10.0, due=0) and len(ticker) == 0  # a demoted replica is not ticked


async def test_an_idle_pipeline_is_released_and_rebuilt_by_the_next_append(broker: FSMBroker) -> None:
    """A pipeline only a pulse used is released when the pulse ends; one that carried an
    append is released after RELEASE_TICKS health ticks without one: its peers' Replicate
    streams end, later ticks do not rebuild it (that would undo the saving), the next append
    builds a new one and lands after everything before, and a full tick's pulse builds (and
    releases) one too."""
    from gazette.broker import replica as replica_mod
    from gazette.testing.eventually import eventually

    r, pulses, tick, _ = await replica_with_ticker(broker)

    r.set_primary(True)  # the first pulse's pipeline is released: no append used it
    await eventually(lambda: pulses == [0] and r.pln is None and not r.send_lock.locked(),
                     "the first pulse's pipeline, released")
    assert all(s.task.done() for s in broker.streams) and len(broker.streams) == 2
    assert (await do_append(broker, b"hello\n")).status == pb.OK
    assert r.pln is not None and len(broker.streams) == 4
    # Held here and counted, not weakly referenced: the compiled build's Pipeline is a native
    # class, which takes no weak references. Freed means nothing else refers to it.
    first = r.pln

    assert not tick()  # the spool grew since the last tick: not idle
    gc.disable()  # a released pipeline is freed by reference counting, not left to a collection
    try:
        assert [tick() for _ in range(replica_mod.RELEASE_TICKS)] == [False] * replica_mod.RELEASE_TICKS
        await eventually(lambda: r.pln is None and not r.send_lock.locked(), "the idle pipeline released")
        await eventually(lambda: sys.getrefcount(first) == 2, "the released pipeline freed")  # ours, the argument's
    finally:
        gc.enable()
    await eventually(lambda: all(s.task.done() for s in broker.streams), "the peers' streams ended")
    assert not r.spool_lock.locked()
    assert [tick() for _ in range(3)] == [False] * 3  # released: ticks leave it so
    assert r.pln is None and len(broker.streams) == 4 and pulses == [0]

    resp = await do_append(broker, b"again\n")  # the next append builds a new pipeline
    assert resp.status == pb.OK and resp.commit.begin == 6 and resp.commit.end == 12
    assert r.pln is not None and len(broker.streams) == 6
    assert all(s.fragment.end == 12 for s in [r.spool, *broker.peer_spools()])

    # Released again once idle; the full tick's pulse builds one regardless, and releases it.
    while r._stable_ticks % replica_mod.FULL_PULSE_TICKS != replica_mod.FULL_PULSE_TICKS - 1:
        assert not tick()
    await eventually(lambda: r.pln is None and not r.send_lock.locked(), "released again")
    assert tick()
    await eventually(lambda: len(pulses) == 2 and len(broker.streams) == 8 and r.pln is None
                     and not r.send_lock.locked(), "the full tick's pulse, released")
    assert all(s.task.done() for s in broker.streams)


async def test_idle_replicas_run_no_task(broker: FSMBroker) -> None:
    """An idle replica is data and one timer: its first refresh and its pulses run in tasks
    that end with them, and a refresh asked for later runs (and ends) again."""
    from gazette.testing.eventually import eventually

    pulses: list[str] = []

    async def pulse(replica: Replica, suspend: bool) -> None:
        pulses.append(replica.journal)
        await append_mod.pulse(broker, replica, suspend)  # type: ignore[arg-type]

    old = broker.replica
    old.cancel()
    assert old.retired is not None
    await asyncio.wait_for(old.retired, 5)
    await eventually(lambda: not old.background, "the old replica retired")
    before = len(asyncio.all_tasks())
    r = broker.replica = Replica(JOURNAL, broker.spec, str(broker.tmp), broker.stores, broker.persister,
                                 broker.tg, pulse)
    r.set_primary(True)
    await eventually(lambda: r.index.first_refresh.is_set() and pulses == [JOURNAL] and r.pln is None
                     and r._pulse_task is None and r._refreshing is None, "refreshed and pulsed")
    await eventually(lambda: len(asyncio.all_tasks()) <= before, "no task left running")
    assert r._maint_timer is not None  # the next refresh is due at the refresh interval
    refreshed = r._primary_refreshed
    refreshed.clear()
    r._request_refresh()
    await eventually(lambda: refreshed.is_set() and r._refreshing is None, "a refresh asked for")
    await eventually(lambda: len(asyncio.all_tasks()) <= before, "no task left running")


async def test_committed_responses_carry_the_registers_each_append_committed_with(broker: FSMBroker) -> None:
    # The wire path (serve_append's): a committed response's registers are those the local
    # spool took with its commit, also when later appends change them before it is answered.
    def labels(*pairs: tuple[str, str]) -> pb.LabelSet:
        return pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in pairs])

    async def wire_append(body: bytes, union: pb.LabelSet | None = None,
                          subtract: pb.LabelSet | None = None) -> pb.AppendResponse:
        first = pb.AppendRequest(journal=JOURNAL)
        if union is not None:
            first.union_registers.CopyFrom(union)
        if subtract is not None:
            first.subtract_registers.CopyFrom(subtract)
        out = await append_mod.run_append(broker, first, chunks(body), None, True)  # type: ignore[arg-type]
        assert isinstance(out, bytes)
        return pb.AppendResponse.FromString(out)

    assert (await wire_append(b"plain\n")).registers == labels()
    a = await wire_append(b"a\n", union=labels(("ka", "1")))
    assert a.registers == labels(("ka", "1"))
    assert (await wire_append(b"kept\n")).registers == labels(("ka", "1"))  # unchanged: kept
    # Held acknowledgements: the first append is answered after the second changed them.
    held = broker.streams[1]
    held.hold()
    first = asyncio.ensure_future(wire_append(b"first\n"))
    second = asyncio.ensure_future(wire_append(b"second\n", union=labels(("kb", "2"))))
    for _ in range(200):
        if broker.replica.spool.registers == labels(("ka", "1"), ("kb", "2")):
            break
        await asyncio.sleep(0)
    assert not first.done()
    held.release()
    assert (await first).registers == labels(("ka", "1"))
    assert (await second).registers == labels(("ka", "1"), ("kb", "2"))
    gone = await wire_append(b"minus\n", subtract=labels(("ka", "1")))
    assert gone.registers == labels(("kb", "2"))
    spool = broker.replica.spool
    assert spool.registers_wire() == spool.registers.SerializeToString() == gone.registers.SerializeToString()

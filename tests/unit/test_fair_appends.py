"""Fair appends: stalled clients queued on a journal do not hold a healthy append behind them.

Runs the real append state machine, replica and pipeline (``FSMBroker`` of
``test_pipeline_fsm``: three members, in-process peers) with the minimum append rate on and
the loop's ``StallWatch`` on a clock the test moves. With that clock frozen no stalled client is
ever aborted, so a healthy append that completes while 50 of them are open shows they do not
queue ahead of it (before ``ReadAhead``, the first stalled one held the pipeline, and each of the
others in turn after it: the healthy append waited for all of them). Moving the clock past one
second's silence then aborts every stalled one with ``FlowControlUnderflow``, and nothing they
sent reached any spool.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_pipeline import JOURNAL
from test_pipeline_fsm import FSMBroker, do_append

from gazette.broker import append as append_mod
from gazette.broker.flow import READ_AHEAD, FlowControlUnderflow, StallWatch
from gazette.broker.readahead import ReadAhead
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.eventually import eventually

DEADLINE = 30.0
STALLED = 50


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def policed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FSMBroker, _Clock]]:
    clock = _Clock()
    watch = StallWatch(asyncio.get_running_loop(), clock)
    monkeypatch.setattr(StallWatch, "of", staticmethod(lambda loop: watch))
    async with asyncio.TaskGroup() as tg:
        b = FSMBroker(tmp_path, tg)
        b.config = SimpleNamespace(max_append_rate=0, min_append_rate=1 << 16)
        try:
            yield b, clock
        finally:
            b.replica.cancel()
            assert b.replica.retired is not None
            await asyncio.wait_for(b.replica.retired, 5)


async def test_stalled_appends_do_not_queue_ahead_of_a_healthy_one(policed: tuple[FSMBroker, _Clock]) -> None:
    broker, clock = policed
    first = await do_append(broker, b"start\n")
    assert first.status == pb.OK
    stalls = 0
    never = asyncio.Event()

    def stalled(sent: bytes) -> AsyncIterator[pb.AppendRequest]:
        async def gen() -> AsyncIterator[pb.AppendRequest]:
            nonlocal stalls
            if sent:
                yield pb.AppendRequest(content=sent)
            stalls += 1  # asked for what it will never send
            await never.wait()
            yield pb.AppendRequest()
        return gen()

    # Half send nothing after the request naming the journal, half a few bytes; then stall.
    tasks = [asyncio.ensure_future(append_mod.append(
        broker, pb.AppendRequest(journal=JOURNAL), stalled(b"x" * (i % 2) * 10)))  # type: ignore[arg-type]
        for i in range(STALLED)]
    await eventually(lambda: stalls == STALLED, "every append stalled")

    # The healthy append completes while every stalled one is still open (the clock is
    # frozen: none of them is ever aborted by itself).
    async with asyncio.timeout(DEADLINE):
        resp = await do_append(broker, b"healthy\n")
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (6, 14)
    assert not any(t.done() for t in tasks)
    assert not broker.replica.send_lock.locked()

    # One second of silence (their whole budget) later, each is aborted where it stands.
    clock.now += 1.2
    await eventually(lambda: all(t.done() for t in tasks), "every append ended")
    for t in tasks:
        with pytest.raises(FlowControlUnderflow):
            t.result()
    spools = [broker.replica.spool, *broker.peer_spools()]
    assert all(s.delta == 0 for s in spools)
    assert {s.fragment.end for s in spools} == {14}
    assert {s.fragment.sum for s in spools} == {hashlib.sha1(b"start\nhealthy\n").digest()}


async def test_a_streaming_append_queues_once_it_sent_read_ahead_bytes(policed: tuple[FSMBroker, _Clock]) -> None:
    """An append larger than READ_AHEAD streams as the pipeline's holder (Gazette's policy);
    a stall then costs the queue at most its own budget, after which the next one goes."""
    broker, clock = policed
    await do_append(broker, b"start\n")
    asked = asyncio.Event()
    never = asyncio.Event()

    async def big_then_stall() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(content=b"b" * READ_AHEAD)
        asked.set()
        await never.wait()
        yield pb.AppendRequest()

    holder = asyncio.ensure_future(append_mod.append(
        broker, pb.AppendRequest(journal=JOURNAL), big_then_stall()))  # type: ignore[arg-type]
    await asyncio.wait_for(asked.wait(), DEADLINE)
    await eventually(lambda: broker.replica.spool.delta == READ_AHEAD, "the spool holds the read-ahead")
    healthy = asyncio.ensure_future(do_append(broker, b"healthy\n"))
    clock.now += 1.2  # the holder's budget is spent
    with pytest.raises(FlowControlUnderflow):
        await asyncio.wait_for(holder, DEADLINE)
    resp = await asyncio.wait_for(healthy, DEADLINE)
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (6, 14)


async def test_read_ahead_yields_everything_in_order_once() -> None:
    async def gen() -> AsyncIterator[bytes]:
        for part in (b"a" * 3, b"b" * 4, b"", b"c"):
            yield part

    ahead: ReadAhead[bytes] = ReadAhead(gen())
    await ahead.fill(len, 0, limit=5)
    assert ahead.buffered == 7 and ahead.ready()
    assert [x async for x in ahead] == [b"aaa", b"bbbb", b"", b"c"]

    ahead = ReadAhead(gen())
    await ahead.fill(len, 0)  # stops at the commit (the empty item)
    assert ahead.buffered == 7
    assert [x async for x in ahead] == [b"aaa", b"bbbb", b"", b"c"]


class _ReadyStream:
    """A stream whose items are all here already (as the transport's requests that arrived
    are): ``ready`` says so, as ``gazette.rpc.server``'s request iterator does."""

    def __init__(self, items: list[bytes]) -> None:
        self.items = list(items)
        self.reads = 0

    def ready(self) -> bool:
        return True

    def __aiter__(self) -> _ReadyStream:
        return self

    async def __anext__(self) -> bytes:
        self.reads += 1
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)


@pytest.mark.parametrize("items, taken, ended", [
    ([b"aaa", b""], [b"aaa", b""], True),  # the end arrived with the commit: taken with it
    ([b"aaa", b"", b"x"], [b"aaa", b"", b"x"], False),  # a chunk after the commit: kept for the append to refuse
    ([b"", b"x", b"y"], [b"", b"x"], False),  # one item past the commit at most
])
async def test_read_ahead_takes_what_arrived_with_the_commit(
        items: list[bytes], taken: list[bytes], ended: bool) -> None:
    stream = _ReadyStream(items)
    ahead: ReadAhead[bytes] = ReadAhead(stream)
    await ahead.fill(len, 0)
    assert ahead.take() == taken and ahead.ended is ended
    assert ahead.take() == []
    assert [x async for x in ahead] == items[len(taken):]


async def test_read_ahead_does_not_wait_for_the_end_after_the_commit() -> None:
    async def gen() -> AsyncIterator[bytes]:  # no ``ready``: the end is not known to be here
        for part in (b"aaa", b""):
            yield part

    ahead: ReadAhead[bytes] = ReadAhead(gen())
    await ahead.fill(len, 0)
    assert ahead.take() == [b"aaa", b""] and not ahead.ended
    assert [x async for x in ahead] == []


class _ReadyRequests(_ReadyStream):
    """Append chunks that all arrived with the request naming the journal."""

    def __init__(self, items: list[pb.AppendRequest]) -> None:  # type: ignore[override]
        self.requests = list(items)

    async def __anext__(self) -> pb.AppendRequest:  # type: ignore[override]
        if not self.requests:
            raise StopAsyncIteration
        return self.requests.pop(0)


@pytest.mark.parametrize("after", [
    pb.AppendRequest(content=b"late"),  # content after the commit
    pb.AppendRequest(journal=JOURNAL),  # a request naming a journal, after the commit
])
async def test_a_chunk_after_the_commit_fails_the_append_and_rolls_back(
        policed: tuple[FSMBroker, _Clock], after: pb.AppendRequest) -> None:
    broker, _ = policed
    assert (await do_append(broker, b"start\n")).status == pb.OK
    chunks = _ReadyRequests([pb.AppendRequest(content=b"ignored"), pb.AppendRequest(), after])
    with pytest.raises(append_mod.AppendStreamError):
        await append_mod.append(broker, pb.AppendRequest(journal=JOURNAL), chunks)  # type: ignore[arg-type]
    whole = await append_mod.append(broker, pb.AppendRequest(journal=JOURNAL), _ReadyRequests(  # type: ignore[arg-type]
        [pb.AppendRequest(content=b"next\n"), pb.AppendRequest()]))
    assert whole.status == pb.OK and (whole.commit.begin, whole.commit.end) == (6, 11)
    assert {s.fragment.sum for s in [broker.replica.spool, *broker.peer_spools()]} == {
        hashlib.sha1(b"start\nnext\n").digest()}

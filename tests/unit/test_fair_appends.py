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
from gazette.broker.flow import READ_AHEAD, FlowControlUnderflow, ReadAhead, StallWatch
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

"""AppendService: batching, ordering, spilling, rollback, retries, dependencies, back-pressure;
and the Publisher on top of it.

Most cases run against an in-memory Append RPC whose calls a test can hold in flight (so
which writes share a batch is decided by the test, not by timing) and script to fail before
or after committing. The last ones go through the real RPC path to the in-process fake broker.
Nothing sleeps: a test waits on events, or gives the event loop a bounded number of turns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.client import (
    AppendError,
    AppendService,
    AppendServiceClosed,
    ClientError,
    DependencyFailed,
    JournalClient,
    TransportError,
)
from gazette.client.appender import Content
from gazette.message import (
    CONTENT_TYPE_JSON_LINES,
    Clock,
    FramingError,
    JSONFraming,
    JSONMessage,
    Publisher,
    build_uuid,
    get_clock,
    get_producer_id,
    new_producer_id,
)
from gazette.message.mapping import MappingFunc
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.eventually import eventually
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

# What the next RPC does: commit, fail before committing, or commit and then fail (the
# response is lost: the retry duplicates the content). A pb.Status answers with that status.
OK, LOST_REQUEST, LOST_RESPONSE = "ok", "lost-request", "lost-response"


class MemoryJournals:
    """An in-memory Append RPC with a gate holding calls in flight and scripted outcomes."""

    def __init__(self) -> None:
        self.content: dict[str, bytearray] = {}
        self.calls: list[tuple[str, bytes]] = []
        self.script: list[str | int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = 0

    async def rpc(self, request: pb.AppendRequest, chunks: Iterable[Content]) -> pb.AppendResponse:
        data = b"".join(bytes(c) for c in chunks)
        self.calls.append((request.journal, data))
        self.in_flight += 1
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        action = self.script.pop(0) if self.script else OK
        if action == LOST_REQUEST:
            raise TransportError(grpc.StatusCode.UNAVAILABLE, "injected: request lost")
        if isinstance(action, int):
            raise AppendError(action, request.journal)
        buf = self.content.setdefault(request.journal, bytearray())
        begin = len(buf)
        buf += data
        if action == LOST_RESPONSE:
            raise TransportError(grpc.StatusCode.UNAVAILABLE, "injected: response lost")
        resp = pb.AppendResponse(status=pb.OK)
        resp.commit.journal = request.journal
        resp.commit.begin, resp.commit.end = begin, len(buf)
        return resp


async def no_sleep(_: float) -> None:
    pass


def service(mem: MemoryJournals, **kwargs: object) -> AppendService:
    return AppendService(None, rpc=mem.rpc, sleep=no_sleep, **kwargs)  # type: ignore[arg-type]


async def turns(n: int = 20) -> None:
    """Give the event loop ``n`` turns (not a timed wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def until(cond: Callable[[], object]) -> None:
    """The fakes need loop turns, not time: polls once per turn."""
    await eventually(cond, "condition", interval=0)


async def test_small_appends_coalesce_into_ordered_batches() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        mem.gate.clear()
        first = svc.append_nowait("a/journal", b"r0\n")
        await until(lambda: mem.in_flight == 1)  # The first record went alone.
        handles = [svc.append_nowait("a/journal", b"r%d\n" % i) for i in range(1, 1000)]
        assert len({id(h) for h in handles}) == 1  # All in the one next batch.
        assert not first.done()
        mem.gate.set()
        r0 = await first
        rest = await handles[-1]
    expected = b"".join(b"r%d\n" % i for i in range(1000))
    assert bytes(mem.content["a/journal"]) == expected
    assert len(mem.calls) == 2
    assert (r0.commit.begin, r0.commit.end) == (0, 3)
    assert (rest.commit.begin, rest.commit.end) == (3, len(expected))
    assert handles[0].response == rest


async def test_journals_are_independent_and_each_ordered() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        for i in range(300):
            await svc.append(f"j/{i % 3}", b"%d," % i)
    for j in range(3):
        assert bytes(mem.content[f"j/{j}"]) == b"".join(b"%d," % i for i in range(j, 300, 3))


async def test_a_held_batch_chains_later_writers_after_it() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        mem.gate.clear()
        svc.append_nowait("a/journal", b"0")
        await until(lambda: mem.in_flight == 1)
        a = svc.start_append("a/journal")
        a.write(b"A1")
        b = svc.append_nowait("a/journal", b"B")  # A holds its batch: B queues after it.
        assert b is not a
        a.write(b"A2")
        a.release()
        c = svc.append_nowait("a/journal", b"C")  # The tail (B's batch) is open again.
        assert c is b
        mem.gate.set()
        await c
    assert bytes(mem.content["a/journal"]) == b"0A1A2BC"
    assert [d for _, d in mem.calls] == [b"0", b"A1A2", b"BC"]


async def test_abort_rolls_back_only_the_writers_own_content() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        mem.gate.clear()
        svc.append_nowait("a/journal", b"first ")
        await until(lambda: mem.in_flight == 1)
        kept = svc.append_nowait("a/journal", b"kept ")
        with pytest.raises(RuntimeError), svc.start_append("a/journal") as aa:
            assert aa is kept  # It joins the open batch...
            aa.write(b"never ")
            raise RuntimeError("writer failed")
        with svc.start_append("a/journal") as aa:  # ...and its rollback spares the rest.
            aa.write(b"last")
        mem.gate.set()
        await aa
    assert bytes(mem.content["a/journal"]) == b"first kept last"


async def test_write_outside_start_and_release_is_refused() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        aa = svc.start_append("a/journal")
        aa.release()
        with pytest.raises(ClientError, match="write without start_append"):
            aa.write(b"late")
        with pytest.raises(ClientError, match="released twice"):
            aa.release()
    assert mem.content.get("a/journal", b"") == b""


async def test_large_batches_spill_to_a_temporary_file(tmp_path: Path) -> None:
    mem = MemoryJournals()
    records = [b"%05d:" % i + b"x" * (i % 50) + b"\n" for i in range(5000)]
    async with service(mem, spill_threshold=4096, batch_cutoff=64 << 20,
                       temp_dir=str(tmp_path)) as svc:
        mem.gate.clear()
        svc.append_nowait("a/journal", b"")
        await until(lambda: mem.in_flight == 1)
        handle = None
        for r in records:
            handle = svc.append_nowait("a/journal", r)
        assert handle is not None and handle._file is not None  # Spilled...
        assert len(handle._buf) < 300 * 1024  # ...keeping only a write buffer in memory.
        mem.gate.set()
        await handle
    assert bytes(mem.content["a/journal"]) == b"".join(records)


async def test_a_full_batch_takes_no_more_writers() -> None:
    mem = MemoryJournals()
    async with service(mem, batch_cutoff=100, spill_threshold=1 << 20) as svc:
        mem.gate.clear()
        svc.append_nowait("a/journal", b"-")
        await until(lambda: mem.in_flight == 1)
        handles = [svc.append_nowait("a/journal", b"0123456789") for _ in range(25)]
        mem.gate.set()
        await handles[-1]
    sizes = [len(d) for _, d in mem.calls]
    assert sizes == [1, 100, 100, 50]
    assert bytes(mem.content["a/journal"]) == b"-" + b"0123456789" * 25


# Buffer operations of one writer: write n bytes, or end its turn by releasing or aborting.
_ops = st.lists(st.one_of(st.integers(1, 700).map(lambda n: ("write", n)),
                          st.sampled_from([("release", 0), ("abort", 0)])), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, spill=st.integers(1, 1500), cutoff=st.integers(1, 5000))
def test_batch_content_is_exactly_what_was_released(ops: list[tuple[str, int]], spill: int,
                                                     cutoff: int) -> None:
    """Whatever the spill threshold and cutoff, a journal receives exactly the released
    writes, in order: spilling, chaining full batches and rolling back across the spill
    boundary lose and duplicate nothing."""

    async def scenario() -> tuple[bytes, bytes]:
        mem = MemoryJournals()
        expected = bytearray()
        pending = bytearray()
        counter = 0
        async with service(mem, spill_threshold=spill, batch_cutoff=cutoff) as svc:
            mem.gate.clear()
            aa = None
            for op, n in ops:
                if aa is None:
                    aa = svc.start_append("a/journal")
                if op == "write":
                    data = bytes((counter + k) % 251 for k in range(n))
                    counter += n
                    aa.write(data)
                    pending += data
                elif op == "release":
                    aa.release()
                    expected += pending
                    pending.clear()
                    aa = None
                else:
                    aa.abort()
                    pending.clear()
                    aa = None
            if aa is not None:
                aa.release()
                expected += pending
            mem.gate.set()
        return bytes(mem.content.get("a/journal", b"")), bytes(expected)

    got, expected = asyncio.run(scenario())
    assert got == expected


async def test_lost_response_is_retried_with_the_same_bytes() -> None:
    mem = MemoryJournals()
    mem.script = [LOST_RESPONSE, LOST_REQUEST]
    async with service(mem) as svc:
        handle = svc.append_nowait("a/journal", b"once\n")
        resp = await handle
    # The lost response committed it; the retry committed it again (at-least-once); the
    # lost request committed nothing.
    assert bytes(mem.content["a/journal"]) == b"once\nonce\n"
    assert [d for _, d in mem.calls] == [b"once\n"] * 3
    assert svc.retries == 2
    assert (resp.commit.begin, resp.commit.end) == (5, 10)


@pytest.mark.parametrize("status", [pb.NOT_JOURNAL_PRIMARY_BROKER, pb.NO_JOURNAL_PRIMARY_BROKER,
                                    pb.INSUFFICIENT_JOURNAL_BROKERS, pb.NOT_JOURNAL_BROKER])
async def test_routing_statuses_are_retried(status: int) -> None:
    mem = MemoryJournals()
    mem.script = [status, status]
    async with service(mem) as svc:
        await svc.append_nowait("a/journal", b"x")
    assert bytes(mem.content["a/journal"]) == b"x"
    assert svc.retries == 2


@pytest.mark.parametrize("status", [pb.JOURNAL_NOT_FOUND, pb.NOT_ALLOWED, pb.WRONG_APPEND_OFFSET,
                                    pb.REGISTER_MISMATCH, pb.INDEX_HAS_GREATER_OFFSET,
                                    pb.FRAGMENT_STORE_UNHEALTHY])
async def test_permanent_statuses_fail_the_journal(status: int) -> None:
    mem = MemoryJournals()
    mem.script = [status]
    svc = service(mem)
    bad = svc.append_nowait("bad/journal", b"lost")
    with pytest.raises(AppendError) as exc:
        await bad
    assert exc.value.status == status
    assert svc.retries == 0
    later = svc.append_nowait("bad/journal", b"behind a hole")
    with pytest.raises(AppendError):
        await later
    assert len(mem.calls) == 1  # The later append was never sent.
    await svc.append_nowait("good/journal", b"fine")  # Other journals are unaffected.
    with pytest.raises(AppendError):
        await svc.close()  # close() reports the failure too.
    assert "bad/journal" not in mem.content
    assert bytes(mem.content["good/journal"]) == b"fine"


async def test_non_transient_transport_errors_are_permanent() -> None:
    mem = MemoryJournals()

    async def refuse(request: pb.AppendRequest, chunks: Iterable[Content]) -> pb.AppendResponse:
        raise TransportError(grpc.StatusCode.PERMISSION_DENIED, "no")

    svc = AppendService(None, rpc=refuse, sleep=no_sleep)
    with pytest.raises(TransportError, match="PERMISSION_DENIED"):
        await svc.append_nowait("a/journal", b"x")
    await svc.abort()
    assert mem.calls == []


async def test_max_attempts_bounds_retries() -> None:
    mem = MemoryJournals()
    mem.script = [LOST_REQUEST] * 5
    svc = service(mem, max_attempts=3)
    with pytest.raises(TransportError, match="UNAVAILABLE"):
        await svc.append_nowait("a/journal", b"x")
    assert len(mem.calls) == 3
    await svc.abort()


async def test_dependencies_order_appends_across_journals() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        mem.gate.clear()
        data = svc.append_nowait("data", b"payload")
        await until(lambda: mem.in_flight == 1)
        barrier = svc.pending_except("checkpoint")
        assert barrier == [data]
        with svc.start_append("checkpoint", barrier) as ckpt:
            ckpt.write(b"through payload")
        await turns()
        assert [j for j, _ in mem.calls] == ["data"]  # The checkpoint waits for the data.
        mem.gate.set()
        await ckpt
    assert [j for j, _ in mem.calls] == ["data", "checkpoint"]


async def test_content_behind_a_batch_waiting_on_dependencies_shares_its_rpc() -> None:
    """A transaction's ACK waits for its commit; the next transaction's messages, written to
    the journal meanwhile, join that batch: one RPC, ACK first. Content with a dependency of
    its own does not."""
    mem = MemoryJournals()
    loop = asyncio.get_running_loop()
    commit: asyncio.Future[None] = loop.create_future()
    other: asyncio.Future[None] = loop.create_future()
    async with service(mem) as svc:
        with svc.start_append("out", [commit]) as ack:
            ack.write(b"ack;")
        await turns()
        data = svc.append_nowait("out", b"next-1;")
        with svc.start_append("out") as more:
            more.write(b"next-2;")
        with svc.start_append("out", [other]) as fenced:
            fenced.write(b"later;")
        await turns()
        assert mem.calls == [] and data is ack and more is ack and fenced is not ack
        commit.set_result(None)
        await ack
        assert mem.calls == [("out", b"ack;next-1;next-2;")]
        other.set_result(None)
        await fenced
    assert mem.calls[1:] == [("out", b"later;")]


async def test_a_failed_dependency_fails_the_dependent_journal() -> None:
    mem = MemoryJournals()
    svc = service(mem)
    loop = asyncio.get_running_loop()
    dep: asyncio.Future[None] = loop.create_future()
    with svc.start_append("out", [dep]) as aa:
        aa.write(b"x")
    dep.set_exception(RuntimeError("upstream transaction failed"))
    with pytest.raises(DependencyFailed, match="upstream transaction failed"):
        await aa
    with pytest.raises(DependencyFailed):
        await svc.append_nowait("out", b"y")
    failed = svc.pending_except("")
    assert len(failed) == 1 and isinstance(failed[0], asyncio.Future)
    assert mem.calls == []
    await svc.abort()


async def test_appends_with_differing_registers_do_not_share_a_batch() -> None:
    mem = MemoryJournals()
    owner = pb.LabelSet()
    owner.labels.add(name="owner", value="me")
    async with service(mem) as svc:
        mem.gate.clear()
        plain = svc.append_nowait("a/journal", b"plain ")
        await until(lambda: mem.in_flight == 1)
        with svc.start_append("a/journal", union_registers=owner) as fenced:
            fenced.write(b"fenced ")
        after = svc.append_nowait("a/journal", b"after")
        assert len({id(plain), id(fenced), id(after)}) == 3
        mem.gate.set()
        await after
    assert bytes(mem.content["a/journal"]) == b"plain fenced after"
    assert [d for _, d in mem.calls] == [b"plain ", b"fenced ", b"after"]


async def test_back_pressure_suspends_writers_until_commits() -> None:
    mem = MemoryJournals()
    svc = service(mem, max_buffered=1000, yield_bytes=100)
    mem.gate.clear()
    written = 0

    async def writer() -> None:
        nonlocal written
        for _ in range(100):
            await svc.append("a/journal", b"x" * 50)
            written += 50

    task = asyncio.create_task(writer())
    await turns(200)
    assert not task.done()
    assert 1000 <= svc.buffered <= 1050  # Bounded: the writer waits for commits.
    assert written < 5000
    mem.gate.set()
    await task
    await svc.close()
    assert len(mem.content["a/journal"]) == 5000


async def test_abort_fails_what_has_not_committed() -> None:
    mem = MemoryJournals()
    svc = service(mem)
    mem.gate.clear()
    first = svc.append_nowait("a/journal", b"in flight")
    await until(lambda: mem.in_flight == 1)
    queued = svc.append_nowait("a/journal", b"queued")
    await svc.abort()
    for handle in (first, queued):
        with pytest.raises(AppendServiceClosed):
            await handle
    with pytest.raises(AppendServiceClosed):
        svc.start_append("a/journal")


async def test_a_writer_holding_a_batch_through_abort_fails_cleanly() -> None:
    mem = MemoryJournals()
    svc = service(mem)
    aa = svc.start_append("a/journal")
    aa.write(b"half")
    await svc.abort()
    aa.release()  # The writer finishes after the service stopped: nothing is sent.
    with pytest.raises(AppendServiceClosed):
        await aa
    assert mem.calls == []


async def test_close_refuses_appends_made_while_it_drains() -> None:
    mem = MemoryJournals()
    svc = service(mem)
    mem.gate.clear()
    first = svc.append_nowait("a/journal", b"first")
    closing = asyncio.create_task(svc.close())
    await until(lambda: mem.in_flight == 1)
    with pytest.raises(AppendServiceClosed):
        svc.append_nowait("a/journal", b"late")
    mem.gate.set()
    await closing
    assert (await first).status == pb.OK
    assert bytes(mem.content["a/journal"]) == b"first"


async def test_cancelling_a_waiter_does_not_cancel_the_append() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        mem.gate.clear()
        handle = svc.append_nowait("a/journal", b"x")
        waiter = asyncio.create_task(asyncio.wait_for(handle, timeout=None))
        await turns()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        mem.gate.set()
        resp = await handle
    assert resp.status == pb.OK


# --- the real Append RPC, against the in-process fake broker -----------------------------


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create("a/journal")
    b = await start_broker(cluster)
    yield b
    await b.stop()


async def test_rpc_path_retries_routing_statuses_and_unavailable(broker: FakeBroker) -> None:
    broker.append_failures = [pb.NOT_JOURNAL_PRIMARY_BROKER, grpc.StatusCode.UNAVAILABLE]
    async with JournalClient(broker.endpoint) as client:
        async with AppendService(client, sleep=no_sleep) as svc:
            handles = [await svc.append("a/journal", b"%d\n" % i) for i in range(100)]
            resp = await handles[-1]
        assert svc.retries == 2
    content = b"".join(bytes(f.content) for f in broker.cluster.journals["a/journal"].fragments)
    assert content == b"".join(b"%d\n" % i for i in range(100))
    assert resp.commit.end == len(content)


async def test_rpc_path_unknown_journal_is_permanent(broker: FakeBroker) -> None:
    async with JournalClient(broker.endpoint) as client:
        svc = AppendService(client, sleep=no_sleep)
        with pytest.raises(AppendError, match="JOURNAL_NOT_FOUND"):
            await svc.append_nowait("no/such/journal", b"x")
        await svc.abort()


# --- the Publisher on an AppendService ------------------------------------------------------


def _to(journal: str) -> MappingFunc:
    return lambda msg: (journal, CONTENT_TYPE_JSON_LINES)


async def test_publisher_queues_without_awaiting_commits() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        mem.gate.clear()
        pub = Publisher(svc, clock=Clock())
        handles = [await pub.publish_committed(_to("a/journal"), JSONMessage(n=i))
                   for i in range(500)]
        assert not any(h.done() for h in handles)  # Nothing waited for a commit.
        mem.gate.set()
        await handles[-1]
    msgs = JSONMessage.from_json_many(JSONFraming().decode(bytes(mem.content["a/journal"])).values)
    assert [m["n"] for m in msgs] == list(range(500))
    assert [get_clock(m.get_uuid()) for m in msgs] == [160 * (i + 1) for i in range(500)]
    assert all(get_producer_id(m.get_uuid()) == pub.producer for m in msgs)
    assert len(mem.calls) <= 3  # Coalesced.


async def test_publish_many_matches_publishing_one_by_one() -> None:
    producer = new_producer_id()

    async def run(many: bool) -> dict[str, bytes]:
        mem = MemoryJournals()
        async with service(mem) as svc:
            pub = Publisher(svc, clock=Clock(1 << 60), producer=producer)
            msgs = [JSONMessage(n=i) for i in range(20)]

            def mapping(msg: JSONMessage) -> tuple[str, str]:
                return f"j/{msg['n'] % 3}", CONTENT_TYPE_JSON_LINES

            if many:
                await pub.publish_uncommitted_many(mapping, msgs)
            else:
                for msg in msgs:
                    await pub.publish_uncommitted(mapping, msg)
            for intent in pub.build_ack_intents():
                svc.append_nowait(intent.journal, intent.intent)
        return {j: bytes(c) for j, c in mem.content.items()}

    assert await run(True) == await run(False)


async def test_publish_many_failing_midway_appends_nothing() -> None:
    mem = MemoryJournals()
    async with service(mem) as svc:
        pub = Publisher(svc, clock=Clock())
        msgs = [JSONMessage(n=1), JSONMessage(n=object())]
        with pytest.raises(FramingError):
            await pub.publish_uncommitted_many(_to("a/journal"), msgs)
        assert pub.build_ack_intents() == []
    assert mem.calls == []


@given(clock=st.integers(0, (1 << 64) - 1), flags=st.sampled_from([0, 1, 2]),
       producer=st.binary(min_size=6, max_size=6))
def test_publisher_uuids_are_gazettes(clock: int, flags: int, producer: bytes) -> None:
    from gazette.message.publisher import _uuid_int

    assert _uuid_int(int.from_bytes(producer, "big"), clock, flags) == \
        build_uuid(producer, clock, flags).int

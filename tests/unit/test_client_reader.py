"""Reader and RetryReader against the fake Journal service."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gazette.client import (
    FragmentFetchError,
    JournalClient,
    OffsetNotYetAvailable,
    Reader,
    ReadError,
    RetryReader,
    TransportError,
)
from gazette.fragment import codecs
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create("a/journal")
    b = await start_broker(cluster)
    yield b
    await b.stop()


@pytest.fixture
async def client(broker: FakeBroker) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.endpoint) as c:
        yield c


def no_sleep(retries: list[float]):  # type: ignore[no-untyped-def]
    async def sleep(d: float) -> None:
        retries.append(d)
    return sleep


async def test_reader_yields_chunks_and_tracks_fragment(broker: FakeBroker, client: JournalClient) -> None:
    broker.cluster.write("a/journal", b"hello, world\n")
    broker.cluster.roll("a/journal")
    broker.cluster.write("a/journal", b"second\n")

    r = Reader(client, pb.ReadRequest(journal="a/journal", offset=0))
    chunks, ends = [], []
    with pytest.raises(OffsetNotYetAvailable) as exc:
        async for chunk in r:
            chunks.append(chunk)
            ends.append((r.offset, r.fragment.end if r.fragment else None))
    assert b"".join(chunks) == b"hello, world\nsecond\n"
    assert [len(c) for c in chunks] == [5, 5, 3, 5, 2]  # The fake's 5-byte chunks per fragment.
    assert ends[2] == (13, 13) and ends[-1] == (20, 20)
    assert r.write_head == 20
    assert exc.value.offset == 20 and r.offset == 20


async def test_reader_offset_within_fragment_and_end_offset(broker: FakeBroker, client: JournalClient) -> None:
    broker.cluster.write("a/journal", b"0123456789abcdef")
    r = Reader(client, pb.ReadRequest(journal="a/journal", offset=3, end_offset=12))
    assert b"".join([c async for c in r]) == b"3456789ab"
    assert r.offset == 12


async def test_reader_offset_jump_is_surfaced(broker: FakeBroker, client: JournalClient) -> None:
    broker.cluster.write("a/journal", b"old content")
    broker.cluster.roll("a/journal")
    broker.cluster.write("a/journal", b"new")
    broker.cluster.drop_before("a/journal", 11)
    jumps: list[tuple[int, int]] = []
    r = RetryReader(client, pb.ReadRequest(journal="a/journal", offset=2), on_jump=lambda a, b: jumps.append((a, b)))
    assert b"".join([c async for c in r]) == b"new"
    assert jumps == [(2, 11)] and r.jumps == 1 and r.last_jump == (2, 11)
    assert r.reached_head and r.offset == 14


async def test_tail_offset_is_not_a_jump(broker: FakeBroker, client: JournalClient) -> None:
    broker.cluster.write("a/journal", b"before")
    r = RetryReader(client, pb.ReadRequest(journal="a/journal", offset=-1))
    assert [c async for c in r] == []
    assert r.offset == 6 and r.jumps == 0


async def test_retry_reader_resumes_after_transient_failures(broker: FakeBroker, client: JournalClient) -> None:
    broker.cluster.write("a/journal", b"resumed content")
    broker.read_failures = [grpc.StatusCode.UNAVAILABLE, pb.NOT_JOURNAL_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS]
    waits: list[float] = []
    retried: list[str] = []
    r = RetryReader(client, pb.ReadRequest(journal="a/journal"), sleep=no_sleep(waits),
                    on_retry=lambda err, attempt: retried.append(type(err).__name__))
    assert b"".join([c async for c in r]) == b"resumed content"
    assert retried == ["TransportError", "ReadError", "ReadError"]
    assert waits == [0.05, 0.05, 0.1]
    assert [c for c in broker.calls if c[0] == "Read"] == [("Read", "a/journal")] * 4


async def test_retry_reader_raises_permanent_errors(broker: FakeBroker, client: JournalClient) -> None:
    broker.read_failures = [pb.SUSPENDED]
    r = RetryReader(client, pb.ReadRequest(journal="a/journal"))
    with pytest.raises(ReadError, match="SUSPENDED"):
        await r.__anext__()
    broker.read_failures = [grpc.StatusCode.PERMISSION_DENIED]
    r = RetryReader(client, pb.ReadRequest(journal="a/journal"))
    with pytest.raises(TransportError, match="PERMISSION_DENIED"):
        await r.__anext__()


async def test_retry_reader_gives_up_on_a_missing_journal(client: JournalClient) -> None:
    waits: list[float] = []
    r = RetryReader(client, pb.ReadRequest(journal="no/such"), sleep=no_sleep(waits))
    with pytest.raises(ReadError, match="JOURNAL_NOT_FOUND"):
        await r.__anext__()
    assert len(waits) == 4  # A few attempts, for etcd propagation delay.


async def test_blocking_read_streams_appends(broker: FakeBroker, client: JournalClient) -> None:
    r = RetryReader(client, pb.ReadRequest(journal="a/journal", offset=-1, block=True))
    import asyncio

    task = asyncio.ensure_future(r.__anext__())
    # The first chunk cannot arrive before content is committed.
    done, _ = await asyncio.wait([task], timeout=0.05)
    assert not done
    broker.cluster.write("a/journal", b"live")
    await broker.cluster.notify()
    assert await asyncio.wait_for(task, 10) == b"live"
    await r.aclose()


async def test_delegated_fragment_read(tmp_path, broker: FakeBroker, client: JournalClient) -> None:  # type: ignore[no-untyped-def]
    broker.cluster.write("a/journal", b"0123456789")
    broker.cluster.roll("a/journal")
    frag = broker.cluster.journals["a/journal"].fragments[0]
    (tmp_path / "frag.sz").write_bytes(codecs.compress(pb.SNAPPY, bytes(frag.content)))
    frag.url = "file:///frag.sz"
    broker.cluster.write("a/journal", b"tail")  # In a second (local) fragment.

    r = RetryReader(client, pb.ReadRequest(journal="a/journal", offset=4, do_not_proxy=True),
                    file_root=str(tmp_path))
    assert b"".join([c async for c in r]) == b"456789tail"

    (tmp_path / "frag.sz").write_bytes(codecs.compress(pb.SNAPPY, b"short"))
    r2 = Reader(client, pb.ReadRequest(journal="a/journal", offset=0, do_not_proxy=True),
                file_root=str(tmp_path))
    with pytest.raises(FragmentFetchError, match="expected 10"):
        _ = [c async for c in r2]

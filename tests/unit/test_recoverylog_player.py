"""The player against the fake broker: a range a broker cannot serve yet, below the write head
taken at the start of playback, is waited for rather than taken for the log's end."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gazette.client import JournalClient
from gazette.protocol import protocol_pb2 as pb
from gazette.recoverylog import FSMHints, Player, take_over
from gazette.recoverylog.player import _LogReader
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

LOG = "recovery/shard-1"


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create(LOG, codec=pb.NONE)
    b = await start_broker(cluster)
    b.chunk_size = 4096
    yield b
    await b.stop()


async def test_a_range_not_yet_available_below_the_head_is_waited_for(broker: FakeBroker, tmp_path: Path) -> None:
    # After a broker failover, the broker serving a read may not have a range yet (its index
    # not refreshed, a replica catching up) and answers a non-blocking read with
    # OFFSET_NOT_YET_AVAILABLE. Playback took that for the end of the log, below the write head
    # it had just read, and failed the shard "the log ends before its write head" (the
    # stream-sum crash test). Below the head it now reads blocking, as Gazette's player does.
    async with JournalClient(broker.endpoint) as client:
        rec = await take_over(Player(client, FSMHints(log=LOG), str(tmp_path / "one")))
        fnode = rec.create(os.path.join(rec.dir, "data"))
        for i in range(20):
            rec.write_at(fnode, bytes([i]) * 1000, i * 1000)
            await rec.flush()
        want = b"".join(bytes([i]) * 1000 for i in range(20))

        broker.read_failures = [pb.OFFSET_NOT_YET_AVAILABLE, pb.OFFSET_NOT_YET_AVAILABLE]
        player = Player(client, FSMHints(log=LOG), str(tmp_path / "two"))
        task = player.start()
        player.finish_at_write_head()
        fsm = await task
        assert sorted(fsm.links) == ["/data"]
        assert (tmp_path / "two" / "data").read_bytes() == want
        assert not broker.read_failures  # both refusals were met, and waited out


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=40),
       steps=st.lists(st.tuples(st.booleans(), st.integers(1, 100)), min_size=1, max_size=40))
@example(chunks=[bytes(range(10)), bytes(range(10, 100)), bytes(range(100, 200))],
         steps=[(False, 20), (False, 20)])  # a frame straddling two chunks
def test_log_reader_gives_the_bytes_in_order_however_they_were_chunked(
        chunks: list[bytes], steps: list[tuple[bool, int]]) -> None:
    # The reader keeps the chunks as they arrived: frames straddling chunks are joined, write
    # data passes as views. Whatever the chunking, need() and stream() give the log's bytes.
    data = b"".join(chunks)
    feed = iter(chunks)

    async def next_chunk(block: bool, interrupt: object) -> bytes:
        return next(feed)

    reader = _LogReader(None, next_chunk)  # type: ignore[arg-type]

    async def run() -> None:
        pos = 0
        for use_stream, n in steps:
            n = min(n, len(data) - pos)
            if n == 0:
                break
            if use_stream:
                got = bytearray()
                await reader.stream(n, lambda view, done, got=got: got.extend(view))
            else:
                view = await reader.need(n, True, None)
                got = bytearray(view)
                view.release()
                reader.consume(n)
            assert bytes(got) == data[pos:pos + n]
            pos += n
            assert reader.offset == pos
        rest = bytearray()  # and the rest, whatever the steps left
        await reader.stream(len(data) - pos, lambda view, done: rest.extend(view))
        assert bytes(rest) == data[pos:]
        assert reader.buffered == 0

    asyncio.run(run())

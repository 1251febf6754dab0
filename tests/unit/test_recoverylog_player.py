"""The player against the fake broker: a range a broker cannot serve yet, below the write head
taken at the start of playback, is waited for rather than taken for the log's end."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.client import JournalClient
from gazette.protocol import protocol_pb2 as pb
from gazette.recoverylog import FSMHints, Player, take_over
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

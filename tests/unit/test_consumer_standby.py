"""consumer/standby.py: a hot standby of a recording shard over the in-process fake broker, as a
case table: the statuses it writes (BACKFILL, then STANDBY once its player tails the log, or
FAILED with why), and who owns its player as it ends (the replica closes it, unless a promotion
released it to the new primary, still playing)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import gazette
from gazette.consumer.recovery import recovery_log
from gazette.consumer.standby import StandbyReplica
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import CONTENT_TYPE, FSMHints
from gazette.testing.eventually import eventually
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

BACKFILL, STANDBY, FAILED = pc.ReplicaStatus.BACKFILL, pc.ReplicaStatus.STANDBY, pc.ReplicaStatus.FAILED


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create("logs/shard-ok", {"content-type": CONTENT_TYPE})
    cluster.create("logs/shard-json", {"content-type": "application/x-ndjson"})
    b = await start_broker(cluster)
    yield b
    await b.stop()


class Hints:
    """The hints store's one call a standby makes: the hints to start playback from."""

    def __init__(self, log: str) -> None:
        self.log = log

    async def pick(self) -> FSMHints:
        return FSMHints(log=self.log)


@dataclass
class Case:
    name: str
    shard: str
    statuses: tuple[int, ...]
    error: str = ""  # in the FAILED status's text
    release: bool = False  # promoted: the player is released before the replica is cancelled


CASES = [
    Case("tails-then-leaves", "shard-ok", (BACKFILL, STANDBY)),
    Case("tails-then-promoted", "shard-ok", (BACKFILL, STANDBY), release=True),
    Case("missing-log", "shard-missing", (BACKFILL, FAILED),
         error="RecoveryError: shard shard-missing: recovery log logs/shard-missing: "),
    Case("mislabelled-log", "shard-json", (BACKFILL, FAILED),
         error=f"has content-type 'application/x-ndjson', expected {CONTENT_TYPE}"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_a_standby_writes_its_statuses_and_owns_its_player(broker: FakeBroker, tmp_path: Path,
                                                                 case: Case) -> None:
    spec = pc.ShardSpec(id=case.shard, recovery_log_prefix="logs")
    statuses: list[pc.ReplicaStatus] = []

    async def write_status(sid: str, status: pc.ReplicaStatus) -> None:
        assert sid == case.shard
        statuses.append(status)

    async with gazette.JournalClient(broker.endpoint) as client:
        replica = StandbyReplica(spec, client, Hints(recovery_log(spec)),  # type: ignore[arg-type]
                                 write_status, root=str(tmp_path))
        task = asyncio.create_task(replica.run())
        await eventually(lambda: len(statuses) == len(case.statuses), "the standby's statuses")
        assert [s.code for s in statuses] == list(case.statuses)
        if case.error:
            async with asyncio.timeout(30):
                await task  # a failure is written, not raised
            assert case.error in statuses[-1].errors[0]
            assert os.listdir(tmp_path) == []  # nothing left behind
            return
        player = replica.player
        assert player is not None and player.tailing.is_set()
        released = replica.release() if case.release else None
        assert replica.player is None if case.release else replica.player is player
        task.cancel()
        async with asyncio.timeout(30):
            await asyncio.wait([task])
        assert task.cancelled()
        assert len(statuses) == len(case.statuses)  # leaving writes nothing more
        if released is None:
            assert os.listdir(tmp_path) == []  # the replica closed its player
            return
        # Released to a new primary: still playing, its directory kept, for the primary to hand off.
        assert released is player and not player.start().done()
        assert os.listdir(tmp_path) == [os.path.basename(player.dir)]
        await player.aclose()
        assert os.listdir(tmp_path) == []

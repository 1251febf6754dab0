"""Per-shard state held by the framework (``new_shard_state``, ``shard.state``): shards run as
the process runs them (``ShardRuntime.run_primary``) over the in-process fake broker, with a
store that outlives a shard's runtime as a database would.

What must hold: the state is made once per start of a shard, after its store is ready (its
checkpoint restored) and before any other callback; it is the same object in every callback of
that start; shards have their own; it is dropped as the shard leaves or fails, and a new start
makes a new one from the store alone (nothing of a failed transaction survives)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import gazette
from gazette.consumer import Shard, ShardPublisher, ShardStateError, StatefulApplication
from gazette.consumer.shard import ShardRuntime
from gazette.message import Envelope, JSONMessage
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

NDJSON = {"content-type": "application/x-ndjson"}
JOURNALS = {"a": "in/part-0", "b": "in/part-1"}


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    for journal in JOURNALS.values():
        cluster.create(journal, NDJSON)
    b = await start_broker(cluster)
    yield b
    await b.stop()


class Disk:
    """What a shard's store keeps across its starts (a database's tables)."""

    def __init__(self) -> None:
        self.total = 0
        self.checkpoint = pc.Checkpoint()


class DiskStore:
    """A store over a ``Disk``: ``total`` and the checkpoint commit together."""

    def __init__(self, disk: Disk) -> None:
        self.disk = disk
        self.pending = 0

    def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        return self.disk.checkpoint

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self._commit(checkpoint, wait_for))

    async def _commit(self, checkpoint: pc.Checkpoint, wait_for: Sequence[Awaitable[Any]]) -> None:
        for f in wait_for:
            await f
        self.disk.total += self.pending
        self.disk.checkpoint = checkpoint
        self.pending = 0

    def destroy(self) -> None:
        pass


@dataclass(eq=False)
class Counts:
    """A shard's state: what it read from its store when made, and this transaction's sum."""

    shard_id: str
    loaded: int
    batch: int = 0
    seen: list[str] = field(default_factory=list)


class SumApp(StatefulApplication[DiskStore, JSONMessage, Counts]):
    """Sums ``n`` of its messages per shard; fails on ``{"fail": true}``."""

    receive_acks = False

    def __init__(self, disks: dict[str, Disk], *, async_state: bool = False) -> None:
        self.disks = disks
        self.async_state = async_state
        self.made: list[tuple[str, int]] = []  # (shard id, loaded) of each state made
        self.calls: list[tuple[str, str, int]] = []  # (callback, shard id, id(state))
        self.state_in_new_store: list[str] = []

    def new_store(self, shard: Shard[Counts], recorder: object) -> DiskStore:
        try:
            shard.state  # noqa: B018 - not made yet: raises
        except ShardStateError as err:
            self.state_in_new_store.append(str(err))
        return DiskStore(self.disks.setdefault(shard.spec.id, Disk()))

    def new_shard_state(self, shard: Shard[Counts], store: DiskStore) -> Any:
        assert store.disk.checkpoint is store.restore_checkpoint(shard)  # the store is ready
        state = Counts(shard.spec.id, store.disk.total)
        self.made.append((state.shard_id, state.loaded))
        if self.async_state:
            async def later() -> Counts:
                await asyncio.sleep(0)
                return state
            return later()
        return state

    def new_message(self, spec: pb.JournalSpec) -> type[JSONMessage]:
        return JSONMessage

    def _saw(self, callback: str, shard: Shard[Counts]) -> Counts:
        self.calls.append((callback, shard.spec.id, id(shard.state)))
        return shard.state

    def begin_txn(self, shard: Shard[Counts], store: DiskStore) -> None:
        self._saw("begin_txn", shard).batch = 0

    def finished_txn(self, shard: Shard[Counts], store: DiskStore, committed: asyncio.Future[Any]) -> None:
        self._saw("finished_txn", shard)

    def consume_message(self, shard: Shard[Counts], store: DiskStore, envelope: Envelope[JSONMessage],
                        publisher: ShardPublisher) -> None:
        state = self._saw("consume_message", shard)
        state.batch += envelope.message.doc["n"]
        if envelope.message.doc.get("fail"):
            raise ValueError("told to fail")
        state.seen.append(envelope.journal)

    async def finalize_txn(self, shard: Shard[Counts], store: DiskStore, publisher: ShardPublisher) -> None:
        state = self._saw("finalize_txn", shard)
        store.pending, state.batch = state.batch, 0


async def _publish(broker: FakeBroker, client: gazette.JournalClient, journal: str, *docs: dict[str, Any]) -> int:
    """Appends ``docs`` committed; the journal's head after them."""
    async with gazette.AppendService(client) as service:
        pub = gazette.Publisher(service)
        for doc in docs:
            await pub.publish_committed(lambda m: (journal, "application/x-ndjson"), JSONMessage(**doc))
        await service.flush()
    return broker.cluster.journals[journal].head


class Run:
    """One start of a shard, as the process makes it."""

    def __init__(self, app: SumApp, client: gazette.JournalClient, shard_id: str) -> None:
        spec = pc.ShardSpec(id=shard_id)
        spec.sources.add(journal=JOURNALS[shard_id])
        spec.max_txn_duration.seconds = 1
        self.statuses: list[pc.ReplicaStatus] = []

        async def write_status(sid: str, status: pc.ReplicaStatus) -> None:
            self.statuses.append(status)

        self.rt: ShardRuntime[Counts] = ShardRuntime(f"/t/items/{shard_id}", spec, app, client, write_status)
        self.task = asyncio.create_task(self.rt.run_primary())

    async def read_through(self, offset: int) -> None:
        journal = self.rt.spec.sources[0].journal
        async with asyncio.timeout(30):
            while self.rt.progress()[0].get(journal, 0) < offset:
                await self.rt.progressed.wait()

    async def leave(self) -> None:
        self.task.cancel()
        await asyncio.wait([self.task])


@pytest.mark.parametrize("async_state", [False, True], ids=["plain", "async"])
async def test_state_is_one_object_per_shard_start(broker: FakeBroker, async_state: bool) -> None:
    app = SumApp({}, async_state=async_state)
    async with gazette.JournalClient(broker.endpoint) as client:
        runs = {sid: Run(app, client, sid) for sid in JOURNALS}
        try:
            for round_ in range(3):  # several transactions per shard
                for sid, run in runs.items():
                    head = await _publish(broker, client, JOURNALS[sid], *({"n": i + 1} for i in range(round_ + 2)))
                    await run.read_through(head)
            assert sorted(app.made) == [("a", 0), ("b", 0)]  # once per shard start
            for sid, run in runs.items():
                state = run.rt.state
                assert state.shard_id == sid and state.loaded == 0
                assert run.rt.recovered_hints is None  # no recovery log (docs/consumers.md)
                ids = {i for cb, s, i in app.calls if s == sid}
                assert ids == {id(state)}  # the same object in every callback of the shard
                assert {cb for cb, s, _ in app.calls if s == sid} == {
                    "begin_txn", "consume_message", "finalize_txn", "finished_txn"}
                assert set(state.seen) == {JOURNALS[sid]}
                assert app.disks[sid].total == 3 + 6 + 10
            assert runs["a"].rt.state is not runs["b"].rt.state
            # Read in new_store, before it exists: an error naming the shard and why.
            assert app.state_in_new_store == [
                f"shard {s}: shard.state was read before new_shard_state made it" for s in "ab"]
        finally:
            for run in runs.values():
                await run.leave()


@pytest.mark.parametrize("ending", ["leaves", "fails"])
async def test_state_is_dropped_as_the_shard_ends_and_made_anew_on_restart(broker: FakeBroker,
                                                                          ending: str) -> None:
    app = SumApp({})
    async with gazette.JournalClient(broker.endpoint) as client:
        first = Run(app, client, "a")
        head = await _publish(broker, client, JOURNALS["a"], {"n": 5}, {"n": 7})
        await first.read_through(head)
        state = weakref.ref(first.rt.state)
        if ending == "leaves":
            await first.leave()
            assert first.statuses[-1].code == pc.ReplicaStatus.PRIMARY
        else:  # a failing transaction ends the shard: FAILED, its batch never committed
            await _publish(broker, client, JOURNALS["a"], {"n": 100, "fail": True})
            async with asyncio.timeout(30):
                await first.task
            assert first.statuses[-1].code == pc.ReplicaStatus.FAILED
            assert "told to fail" in first.statuses[-1].errors[0]
        with pytest.raises(ShardStateError, match="shard a: shard.state was read after the shard ended"):
            first.rt.state  # noqa: B018
        assert app.disks["a"].total == 12
        del first
        gc.collect()
        assert state() is None  # nothing of the framework holds the old state

        # The shard starts again (here, or in another process): a new state, from the store.
        second = Run(app, client, "a")
        try:
            head = await _publish(broker, client, JOURNALS["a"], {"n": 1})
            if ending == "fails":
                # The failing message is read again and fails again: the state is made anew
                # each start, from the store alone (loaded 12: the failed batch's 100 is gone).
                async with asyncio.timeout(30):
                    await second.task
                assert app.made == [("a", 0), ("a", 12)]
                assert second.statuses[-1].code == pc.ReplicaStatus.FAILED
                return
            await second.read_through(head)
            assert app.made == [("a", 0), ("a", 12)]
            assert second.rt.state.loaded == 12 and second.rt.state.batch == 0
            assert app.disks["a"].total == 13
        finally:
            await second.leave()


class Stateless:
    """An app without new_shard_state: ``shard.state`` is None."""

    def __init__(self) -> None:
        self.states: list[object] = []

    def new_store(self, shard: Shard, recorder: object) -> DiskStore:
        return DiskStore(Disk())

    def new_message(self, spec: pb.JournalSpec) -> type[JSONMessage]:
        return JSONMessage

    def consume_message(self, shard: Shard, store: DiskStore, envelope: Envelope, publisher: ShardPublisher) -> None:
        self.states.append(shard.state)

    def finalize_txn(self, shard: Shard, store: DiskStore, publisher: ShardPublisher) -> None:
        pass


async def test_an_app_without_new_shard_state_sees_none(broker: FakeBroker) -> None:
    app = Stateless()
    async with gazette.JournalClient(broker.endpoint) as client:
        spec = pc.ShardSpec(id="a")
        spec.sources.add(journal=JOURNALS["a"])

        async def write_status(sid: str, status: pc.ReplicaStatus) -> None:
            pass

        rt: ShardRuntime[None] = ShardRuntime("/t/items/a", spec, app, client, write_status)
        task = asyncio.create_task(rt.run_primary())
        try:
            head = await _publish(broker, client, JOURNALS["a"], {"n": 1}, {"n": 2})
            async with asyncio.timeout(30):
                while rt.progress()[0].get(JOURNALS["a"], 0) < head:
                    await rt.progressed.wait()
            assert rt.state is None
            assert app.states and all(s is None for s in app.states)
        finally:
            task.cancel()
            await asyncio.wait([task])

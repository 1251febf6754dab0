"""consumer/shard.py: a shard's life as primary (``ShardRuntime.run_primary``) over the in-process
fake broker, as a case table of endings (Gazette's ``shard_test.go``): which statuses it writes,
and that it closes what it owns (its store, the store's asynchronous close, its appends) before it
says it stopped, however it ends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import gazette
from gazette.client.append_service import AppendServiceClosed
from gazette.consumer import Shard, ShardPublisher
from gazette.consumer.shard import ShardRuntime
from gazette.message import Envelope, JSONMessage, TypedMessage
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.eventually import eventually
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

SOURCE = "in/part-0"
NDJSON = {"content-type": "application/x-ndjson"}
PRIMARY, FAILED = pc.ReplicaStatus.PRIMARY, pc.ReplicaStatus.FAILED


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create(SOURCE, NDJSON)
    b = await start_broker(cluster)
    yield b
    await b.stop()


@dataclass
class Store:
    """A memory store whose ``destroy`` returns an asynchronous close (as SQLStore's)."""

    fail_restore: bool = False
    checkpoint: pc.Checkpoint = field(default_factory=pc.Checkpoint)
    destroyed: bool = False
    closed: bool = False

    def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        if self.fail_restore:
            raise OSError("the database is gone")
        return self.checkpoint

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> asyncio.Future[Any]:
        async def commit() -> None:
            for f in wait_for:
                await f
            self.checkpoint = checkpoint
        return asyncio.ensure_future(commit())

    def destroy(self) -> Awaitable[None]:
        self.destroyed = True

        async def close() -> None:
            await asyncio.sleep(0)  # a real close awaits its connection
            self.closed = True
        return close()


class App:
    """Consumes ``{"n": ...}`` messages; ``{"fail": true}`` fails the transaction."""

    def __init__(self, fail_new_store: bool = False, fail_restore: bool = False) -> None:
        self.fail_new_store = fail_new_store
        self.store: Store | None = None
        self.fail_restore = fail_restore
        self.consumed: list[int] = []

    def new_store(self, shard: Shard, recorder: object) -> Store:
        assert recorder is None  # no recovery log
        if self.fail_new_store:
            raise ValueError("no store for you")
        self.store = Store(fail_restore=self.fail_restore)
        return self.store

    def new_message(self, spec: pb.JournalSpec) -> type[JSONMessage]:
        return JSONMessage

    def consume_message(self, shard: Shard, store: Store, envelope: Envelope[JSONMessage],
                        publisher: ShardPublisher) -> None:
        if envelope.message.doc.get("fail"):
            raise RuntimeError("told to fail")
        self.consumed.append(envelope.message.doc["n"])

    def finalize_txn(self, shard: Shard, store: Store, publisher: ShardPublisher) -> None:
        pass


class N(TypedMessage):
    """The same ``{"n": ...}`` messages, typed."""

    n: int


class TypedApp(App):
    """App, reading its input as ``N``: a line that does not fit fails the shard."""

    def new_message(self, spec: pb.JournalSpec) -> type[N]:  # type: ignore[override]
        return N

    def consume_message(self, shard: Shard, store: Store, envelope: Envelope[N],  # type: ignore[override]
                        publisher: ShardPublisher) -> None:
        self.consumed.append(envelope.message.n)


async def publish(client: gazette.JournalClient, *docs: dict[str, Any]) -> None:
    async with gazette.AppendService(client) as service:
        pub = gazette.Publisher(service)
        for doc in docs:
            await pub.publish_committed(lambda m: (SOURCE, "application/x-ndjson"), JSONMessage(**doc))


@dataclass
class Case:
    name: str
    app: App
    sources: tuple[str, ...] = (SOURCE,)
    docs: tuple[dict[str, Any], ...] = ()
    leave: bool = False  # cancelled once it consumed ``docs`` (the shard left this process)
    statuses: tuple[int, ...] = ()
    error: str = ""  # a pattern of the FAILED status's text
    store_built: bool = True


CASES = [
    Case("leaves", App(), docs=({"n": 1}, {"n": 2}), leave=True, statuses=(PRIMARY,)),
    Case("consume-fails", App(), docs=({"n": 1}, {"fail": True}), statuses=(PRIMARY, FAILED),
         error=r"TransactionError: consume_message \(message of in/part-0 at offset \d+\): told to fail"),
    # docs/consumers.md, Typed messages: the field, the journal and the offset are named.
    Case("typed-line-does-not-fit", TypedApp(), docs=({"n": 1}, {"n": "one"}), statuses=(PRIMARY, FAILED),
         error=r"MessageDecodeError: journal in/part-0 \[\d+, \d+\): invalid N message: "
               r"Expected `int`, got `str` - at `\$\.n`"),
    Case("missing-source", App(), sources=(SOURCE, "in/missing"), statuses=(FAILED,),
         error=r"LookupError: source journals \['in/missing'\] of shard shard-a do not exist"),
    Case("new-store-fails", App(fail_new_store=True), statuses=(FAILED,),
         error="ValueError: no store for you", store_built=False),
    Case("restore-fails", App(fail_restore=True), statuses=(FAILED,),
         error="OSError: the database is gone"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_a_shard_writes_its_statuses_and_closes_what_it_owns(broker: FakeBroker, case: Case) -> None:
    spec = pc.ShardSpec(id="shard-a")
    for s in case.sources:
        spec.sources.add(journal=s)
    spec.max_txn_duration.seconds = 1
    statuses: list[pc.ReplicaStatus] = []
    closed_when_stopped: list[bool] = []

    async def write_status(sid: str, status: pc.ReplicaStatus) -> None:
        assert sid == "shard-a"
        statuses.append(status)

    async with gazette.JournalClient(broker.endpoint) as client:
        await publish(client, *case.docs)
        rt: ShardRuntime[None] = ShardRuntime("/t/items/shard-a", spec, case.app, client, write_status)
        task = asyncio.create_task(rt.run_primary())

        async def on_stopping() -> None:
            await rt.stopping.wait()
            closed_when_stopped.append(case.app.store is not None and case.app.store.closed)
        watcher = asyncio.create_task(on_stopping())

        if case.leave:
            await eventually(lambda: len(case.app.consumed) == len(case.docs), "every message consumed")
            assert rt.ready.is_set()
            task.cancel()
        async with asyncio.timeout(30):
            await asyncio.wait([task])
            await watcher
        assert task.cancelled() == case.leave  # a failure is written, not raised
        assert [s.code for s in statuses] == list(case.statuses)
        if case.error:
            assert re.fullmatch(case.error, statuses[-1].errors[0]), statuses[-1].errors[0]
        assert rt.stopping.is_set()
        store = case.app.store
        if not case.store_built:
            assert store is None
            return
        assert store is not None and store.destroyed and store.closed
        assert closed_when_stopped == [True]  # the store's close settled before ``stopping``
        with pytest.raises(AppendServiceClosed):  # its appends were closed as it ended
            rt.service.start_append(SOURCE)


async def test_progress_follows_committed_transactions(broker: FakeBroker) -> None:
    app = App()
    spec = pc.ShardSpec(id="shard-a")
    spec.sources.add(journal=SOURCE)

    async def write_status(sid: str, status: pc.ReplicaStatus) -> None:
        pass

    async with gazette.JournalClient(broker.endpoint) as client:
        rt: ShardRuntime[None] = ShardRuntime("/t/items/shard-a", spec, app, client, write_status)
        task = asyncio.create_task(rt.run_primary())
        try:
            for round_ in range(3):
                await publish(client, {"n": round_})
                head = broker.cluster.journals[SOURCE].head
                async with asyncio.timeout(30):
                    while rt.progress()[0].get(SOURCE, 0) < head:
                        await rt.progressed.wait()
                assert rt.progress()[0] == {SOURCE: head}
                assert app.store is not None and app.store.checkpoint.sources[SOURCE].read_through == head
            assert app.consumed == [0, 1, 2]
        finally:
            task.cancel()
            await asyncio.wait([task])

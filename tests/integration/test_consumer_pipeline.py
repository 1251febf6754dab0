"""Real brokers → ShardSource → TransactionLoop → MemoryStore: each committed message is
consumed exactly once, uncommitted ones never, and a restart from the store's checkpoint
resumes after what was consumed."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from consumer_support import CountingApp, journals_yaml

from gazette.client import AppendService, JournalClient, list_journals
from gazette.consumer.source import ShardSource
from gazette.consumer.stores.memory import MemoryStore
from gazette.consumer.transaction import TransactionLoop, TxnConfig
from gazette.message import JSONMessage, Publisher, modulo_mapping
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster

SPECS = journals_yaml("part-000", "part-001")


async def _consume(client: JournalClient, service: AppendService, app: CountingApp, store: MemoryStore,
                   shard: pc.ShardSpec, journals: dict[str, Any]) -> None:
    source = ShardSource(client, shard, journals, app.new_message, store.checkpoint, block=False)
    publisher: Publisher[Any] = Publisher(service)

    def write_acks(intents: Any, after: Any) -> list[Any]:
        out = []
        for it in intents:
            h = service.start_append(it.journal, [after])
            h.write(it.intent)
            h.release()
            out.append(h)
        return out

    loop = TransactionLoop(object(), app, store, publisher, source,  # type: ignore[arg-type]
                           config=TxnConfig(max_duration=0.5), write_acks=write_acks,
                           pending_appends=service.pending_except)
    source.start()
    try:
        await asyncio.wait_for(loop.run(store.checkpoint), 60)
    finally:
        await source.aclose()


@pytest.mark.timeout(180)
async def test_exactly_once_into_transactions_and_resume(cluster: Cluster) -> None:
    cluster.add_broker("local", "quiet-heron")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=SPECS)
    assert rc == 0, err
    async with JournalClient(cluster.broker.address) as client, AppendService(client) as service:
        async with asyncio.timeout(30):
            while True:
                listing = await list_journals(client, "prefix=in/")
                if len(listing.journals) == 2 and all(j.route.primary >= 0 for j in listing.journals):
                    break
                await asyncio.sleep(0.05)  # polling the allocator's assignment, not synchronisation
        mapping = modulo_mapping(lambda m: m.doc["key"].encode(), lambda: listing)
        pub = Publisher(service)
        expect: Counter[str] = Counter()
        for i in range(300):
            await pub.publish_committed(mapping, JSONMessage(key=f"k{i % 7}"))
            expect[f"k{i % 7}"] += 1
        txn = Publisher(service)  # a producer's transaction: committed by its ACKs
        for i in range(20):
            await txn.publish_uncommitted(mapping, JSONMessage(key=f"t{i % 3}"))
            expect[f"t{i % 3}"] += 1
        for intent in txn.build_ack_intents():
            await service.append(intent.journal, intent.intent)
        never = Publisher(service)  # an open transaction, never acknowledged
        for _ in range(5):
            await never.publish_uncommitted(mapping, JSONMessage(key="never"))
        await service.flush()

        shard = pc.ShardSpec(id="count-000")
        shard.sources.add(journal="in/part-000")
        shard.sources.add(journal="in/part-001")
        journals = {j.spec.name: j.spec for j in listing.journals}
        app, store = CountingApp(), MemoryStore()
        await _consume(client, service, app, store, shard, journals)
        assert app.counts == expect
        assert store.commits >= 1
        heads = {j: store.checkpoint.sources[j].read_through for j in journals}
        assert all(heads.values())

        # Resume from the checkpoint: only what came after is consumed.
        for _ in range(30):
            await pub.publish_committed(mapping, JSONMessage(key="late"))
        await service.flush()
        app2 = CountingApp()
        await _consume(client, service, app2, store, shard, journals)
        assert app2.counts == Counter({"late": 30})

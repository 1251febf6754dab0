"""gazette.read_committed / read_uncommitted over the in-process fake broker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import gazette
from gazette.message import UnknownContentTypeError, is_ack
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    for i in range(3):
        cluster.create(f"greet/part-{i}", {**NDJSON, "topic": "greet"})
    cluster.create("raw/bytes", {"topic": "raw"})
    b = await start_broker(cluster)
    yield b
    await b.stop()


async def _publish(client: gazette.JournalClient, selector: str, n: int, *, committed: bool) -> None:
    listing = await gazette.list_journals(client, selector)
    mapping = gazette.modulo_mapping(lambda m: str(m.doc["i"]).encode(), lambda: listing)
    async with gazette.AppendService(client) as service:
        pub = gazette.Publisher(service)
        for i in range(n):
            msg = gazette.JSONMessage(i=i)
            if committed:
                await pub.publish_committed(mapping, msg)
            else:
                await pub.publish_uncommitted(mapping, msg)
        await service.flush()


async def test_read_committed_merges_journals_each_message_once(broker: FakeBroker) -> None:
    async with gazette.JournalClient(broker.endpoint) as client:
        await _publish(client, "topic=greet", 30, committed=True)
        got = [env async for env in gazette.read_committed(client, "topic=greet", block=False)]
        assert sorted(env.message.doc["i"] for env in got) == list(range(30))
        for journal in {env.journal for env in got}:  # each journal's messages in order
            offsets = [env.begin for env in got if env.journal == journal]
            assert offsets == sorted(offsets)
        one = [env async for env in gazette.read_committed(client, "greet/part-0", block=False)]
        assert [e.begin for e in one] == [e.begin for e in got if e.journal == "greet/part-0"]


async def test_uncommitted_messages_are_read_uncommitted_only(broker: FakeBroker) -> None:
    async with gazette.JournalClient(broker.endpoint) as client:
        await _publish(client, "topic=greet", 5, committed=False)  # never acknowledged
        assert [e async for e in gazette.read_committed(client, "topic=greet", block=False)] == []
        raw = [e async for e in gazette.read_uncommitted(client, "topic=greet", block=False)]
        assert sorted(e.message.doc["i"] for e in raw) == list(range(5))


async def test_unframed_journal_is_refused_naming_it(broker: FakeBroker) -> None:
    async with gazette.JournalClient(broker.endpoint) as client:
        with pytest.raises(UnknownContentTypeError, match="raw/bytes"):
            async for _ in gazette.read_committed(client, "raw/bytes", block=False):
                pass
        with pytest.raises(gazette.MessageError, match="no journal matches"):
            async for _ in gazette.read_committed(client, "topic=none", block=False):
                pass


async def test_acks_false_leaves_acknowledgements_out_and_batches_match(broker: FakeBroker) -> None:
    """Two transactions of 4 messages each, acknowledged: read with ACKs (one per journal
    written per transaction), without, and a batch at a time, the same messages in order."""
    async with gazette.JournalClient(broker.endpoint) as client:
        async with gazette.AppendService(client) as service:
            pub = gazette.Publisher(service)
            for txn in range(2):
                for i in range(4):
                    await pub.publish_uncommitted(lambda m: ("greet/part-1", "application/x-ndjson"),
                                                  gazette.JSONMessage(i=txn * 4 + i))
                for intent in pub.build_ack_intents():
                    await service.append(intent.journal, intent.intent)
            await service.flush()
        every = [e async for e in gazette.read_committed(client, "greet/part-1", block=False)]
        acks = [e for e in every if is_ack(e)]
        assert len(acks) == 2 and len(every) == 10
        apps = [e async for e in gazette.read_committed(client, "greet/part-1", block=False, acks=False)]
        assert [e.message.doc["i"] for e in apps] == list(range(8))
        assert [e.begin for e in apps] == [e.begin for e in every if not is_ack(e)]
        batches = [b async for b in gazette.read_committed_batches(client, "greet/part-1", block=False,
                                                                    acks=False)]
        assert all(batches) and [e.begin for b in batches for e in b] == [e.begin for e in apps]

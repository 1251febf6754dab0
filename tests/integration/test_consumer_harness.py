"""The consumer test harness as an app author uses it: the ``gazette_consumer`` fixture (from
the installed pytest plugin) runs etcd, a broker and consumers, applies the specs, and waits."""

from __future__ import annotations

from typing import Any

import pytest
from consumer_support import CountingApp, journals_yaml, shards_yaml

from gazette.protocol import consumer_pb2 as pc
from gazette.testing.consumer import ConsumerHarness
from gazette.testing.eventually import eventually

SHARDS = shards_yaml("part-000", "part-001")


@pytest.mark.timeout(120)
async def test_an_app_test_in_a_few_lines(gazette_consumer: Any) -> None:
    app = CountingApp()
    async with gazette_consumer(app, journals=journals_yaml("part-000", "part-001"), shards=SHARDS,
                                processes=2) as h:
        assert isinstance(h, ConsumerHarness)
        assert {p.local_id.suffix for p in h.processes} == {"harness-0", "harness-1"}
        await h.publish("in/part-000", {"key": "a"}, {"key": "b"}, {"key": "a"})
        await h.append_lines("in/part-001", [{"key": "a"}] * 4)
        await h.read_through()
        assert app.counts == {"a": 6, "b": 1}
        assert h.runtime("count-000") is not None and h.store("count-001") is not None
        # Shard.assignment follows the keyspace: made when the assignment was IDLE, it shows the
        # PRIMARY status the shard wrote since (the process refreshes it on each update).
        rt = h.runtime("count-000")

        async def primary() -> bool:
            return rt.assignment.status.code == pc.ReplicaStatus.PRIMARY

        await eventually(primary, "the runtime's assignment to show PRIMARY", 30)
        assert rt.assignment.slot == 0 and rt.assignment.key.split("/")[-1].startswith("count-000#")
        assert rt.assignment.mod_revision > rt.assignment.create_revision


class ProducingApp(CountingApp):
    """A MessageProducer: reads its source itself and tags every message it yields."""

    def __init__(self) -> None:
        super().__init__()
        self.replays: list[tuple[str, int, int]] = []
        self.asked: list[dict[str, int]] = []

    async def start_reading_messages(self, shard: Any, store: Any, checkpoint: Any) -> Any:
        from gazette.message.reading import read_uncommitted

        journal = shard.spec.sources[0].journal
        offset = checkpoint.sources[journal].read_through if journal in checkpoint.sources else 0
        async for env in read_uncommitted(shard.journal_client, journal, offset=offset):
            if "key" in env.message.doc:
                env.message.doc["key"] = "produced-" + env.message.doc["key"]
            yield [env]

    def replay_range(self, shard: Any, store: Any, journal: str, begin: int, end: int) -> list[Any]:
        self.replays.append((journal, begin, end))
        return []

    def read_through(self, shard: Any, store: Any, offsets: dict[str, int]) -> dict[str, int]:
        self.asked.append(dict(offsets))
        return {shard.spec.sources[0].journal: max(offsets.values(), default=0)}


@pytest.mark.timeout(120)
async def test_message_producer_hooks(gazette_consumer: Any) -> None:
    app = ProducingApp()
    async with gazette_consumer(app, journals=journals_yaml("part-000"), shards=shards_yaml("part-000")) as h:
        await h.publish("in/part-000", {"key": "a"}, {"key": "a"})
        await h.read_through(["count-000"])
        assert app.counts == {"produced-a": 2}
        assert app.asked and "in/part-000" in app.asked[-1]  # resolutions asked the app

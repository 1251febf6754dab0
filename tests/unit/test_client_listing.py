"""Listing helpers, PolledList and the synchronous facade against the fake service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gazette.client import (
    ApplyError,
    JournalClient,
    PolledList,
    SyncJournalClient,
    apply_journals,
    get_journal,
    list_journals,
)
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import SelectorError
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

pytestmark = pytest.mark.both_loops  # the transport on asyncio's loop and on uvloop (conftest)


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    for i in range(5):
        cluster.create(f"topic/part-{i}", {"topic": "t"})
    b = await start_broker(cluster)
    yield b
    await b.stop()


async def test_list_joins_streamed_pages(broker: FakeBroker) -> None:
    async with JournalClient(broker.endpoint) as client:
        resp = await list_journals(client, "topic=t")
        assert [j.spec.name for j in resp.journals] == [f"topic/part-{i}" for i in range(5)]
        assert client.routes.route("topic/part-3") is not None  # Listing primes the cache.
        with pytest.raises(SelectorError, match="position"):
            await list_journals(client, "topic in (t")
        j = await get_journal(client, "topic/part-1")
        assert j.mod_revision == broker.cluster.journals["topic/part-1"].mod_revision


async def test_a_listing_leaves_the_route_cache_with_its_last_routes(broker: FakeBroker) -> None:
    """The cache keeps the last ``size`` routes it is given: a listing gives it only those."""
    from gazette.client.route_cache import RouteCache

    async with JournalClient(broker.endpoint, route_cache=RouteCache(size=2)) as client:
        await list_journals(client, "topic=t")
        cached = [f"topic/part-{i}" for i in range(5) if client.routes.route(f"topic/part-{i}")]
        assert cached == ["topic/part-3", "topic/part-4"]


async def test_apply_checks_revisions(broker: FakeBroker) -> None:
    async with JournalClient(broker.endpoint) as client:
        spec = pb.JournalSpec(name="topic/part-9", replication=1)
        await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec)])
        with pytest.raises(ApplyError, match="ETCD_TRANSACTION_FAILED"):
            await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=1)])


async def test_polled_list_reports_changes(broker: FakeBroker) -> None:
    seen: list[int] = []
    async with JournalClient(broker.endpoint) as client:
        polled = PolledList(client, "topic=t", interval=0.01,
                            on_change=lambda resp: seen.append(len(resp.journals)))
        async with polled:
            assert seen == [5]
            broker.cluster.create("topic/part-7", {"topic": "t"})
            await asyncio.wait_for(polled.wait_changed(1), 10)
        assert seen == [5, 6]


async def test_sync_facade(broker: FakeBroker) -> None:
    def script() -> tuple[int, bytes, bytes]:
        with SyncJournalClient(broker.endpoint) as c:
            resp = c.append("topic/part-0", b"hello ")
            c.append("topic/part-0", [b"sync ", b"world"])
            return len(c.list("topic=t").journals), c.read_all("topic/part-0"), \
                c.read_all("topic/part-0", resp.commit.end)

    n, everything, tail = await asyncio.to_thread(script)
    assert n == 5 and everything == b"hello sync world" and tail == b"sync world"


async def test_journal_client_dials_through_its_channel_factory() -> None:
    from gazette.client import JournalClient
    from gazette.rpc.channel import insecure_channel

    dialed: list[str] = []

    def factory(target: str, options: Any) -> Any:
        dialed.append(target)
        return insecure_channel(target, options)

    async with JournalClient("http://127.0.0.1:1", channel_factory=factory) as client:
        client.stub()
        client.stub("http://127.0.0.2:2")
        client.stub()  # cached: one channel per endpoint
    assert dialed == ["127.0.0.1:1", "127.0.0.2:2"]

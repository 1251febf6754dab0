"""A consumer process in this test's event loop, against real etcd and a real broker: shards
assigned to it run as primaries (status PRIMARY), consume their sources exactly once, and a
shard whose application fails is FAILED with the error's text while the other carries on."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aetcd
import grpc
import pytest
from consumer_support import CountingApp, journals_yaml

from gazette.allocator.keys import assignments_prefix
from gazette.client import AppendService, JournalClient, list_journals
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.etcd import connect
from gazette.message import JSONMessage, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import consumer_pb2_grpc as pc_grpc
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix

SPECS = journals_yaml("part-000", "part-001")


def _poison(shard: Any, env: Any) -> None:
    if shard.spec.id == "bad-000":
        raise ValueError(f"cannot count {env.message.doc['key']}")


async def _statuses(client: aetcd.Client, prefix: str) -> dict[str, pc.ReplicaStatus]:
    out = {}
    for kv in await client.get_prefix(assignments_prefix(prefix).encode()):
        out[kv.key.decode().split("/")[-1].split("#")[0]] = pc.ReplicaStatus.FromString(kv.value)
    return out


@pytest.mark.timeout(120)
async def test_consumer_runs_primaries_and_fails_one_alone(cluster: Cluster) -> None:
    cluster.add_broker("local", "lively-lynx")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=SPECS)
    assert rc == 0, err
    prefix = unique_prefix("/gazette-test-consumers")
    etcd = await connect(cluster.etcd_url)
    try:
        app = CountingApp(_poison)
        proc = ConsumerProcess(ConsumerConfig(port=0, broker_address=cluster.broker.address,
                                              etcd_address=cluster.etcd_url, etcd_prefix=prefix,
                                              etcd_lease=5), app)
        task = asyncio.create_task(proc.run())
        try:
            async with asyncio.timeout(30):
                await proc.ready.wait()
            channel = insecure_channel(f"127.0.0.1:{proc.bound_port}")
            shards = pc_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
            # A source journal that does not exist is refused, naming the field.
            bad = pc.ApplyRequest()
            ch = bad.changes.add(upsert=pc.ShardSpec(id="nope-000"))
            ch.upsert.sources.add(journal="in/missing")
            ch.upsert.max_txn_duration.seconds = 1
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await shards.Apply(bad)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "changes[0].upsert.sources[0].journal" in (info.value.details() or "")
            req = pc.ApplyRequest()
            for shard_id, journal in (("ok-000", "in/part-000"), ("bad-000", "in/part-001")):
                change = req.changes.add(upsert=pc.ShardSpec(id=shard_id))
                change.upsert.sources.add(journal=journal)
                change.upsert.max_txn_duration.seconds = 1
            assert (await shards.Apply(req)).status == pc.Status.OK
            async with JournalClient(cluster.broker.address) as client, AppendService(client) as service:
                async with asyncio.timeout(30):
                    while True:
                        listing = await list_journals(client, "prefix=in/")
                        if len(listing.journals) == 2:
                            break
                        await asyncio.sleep(0.05)  # polling the listing, not synchronisation
                pub = Publisher(service)
                expect: Counter[str] = Counter()
                for i in range(200):
                    await pub.publish_committed(lambda m: ("in/part-000", "application/x-ndjson"),
                                                JSONMessage(key=f"k{i % 5}"))
                    expect[f"k{i % 5}"] += 1
                await pub.publish_committed(lambda m: ("in/part-001", "application/x-ndjson"),
                                            JSONMessage(key="poison"))
                await service.flush()

            async with asyncio.timeout(60):
                while True:
                    if app.counts == expect:
                        break
                    await asyncio.sleep(0.05)  # polling the app's counts, not synchronisation
                while True:
                    st = await _statuses(etcd, prefix)
                    if st.get("bad-000", pc.ReplicaStatus()).code == pc.ReplicaStatus.FAILED:
                        break
                    await asyncio.sleep(0.05)  # polling etcd, not synchronisation
            assert st["ok-000"].code == pc.ReplicaStatus.PRIMARY
            assert "cannot count poison" in st["bad-000"].errors[0]
            assert "in/part-001" in st["bad-000"].errors[0]  # names where it failed
            assert not task.done()  # the process carries on

            listed = await shards.List(pc.ListRequest())
            by_id = {sh.spec.id: sh for sh in listed.shards}
            assert by_id["ok-000"].status[0].code == pc.ReplicaStatus.PRIMARY
            assert by_id["ok-000"].route.endpoints[0] == proc.endpoint
            # Stat answers once a transaction read through what we appended.
            stat = await shards.Stat(pc.StatRequest(shard="ok-000", read_through={"in/part-000": 1}))
            assert stat.status == pc.Status.OK and stat.read_through["in/part-000"] > 0
            # Unassign --failed frees only the failed shard. It reads the process's own view of
            # etcd, which learns of the FAILED status (seen in etcd above) through its watch.
            async with asyncio.timeout(30):
                while True:
                    listed = await shards.List(pc.ListRequest())
                    if {sh.spec.id: sh for sh in listed.shards}["bad-000"].status[0].code == pc.ReplicaStatus.FAILED:
                        break
                    await asyncio.sleep(0.05)  # polling the process's listing, not synchronisation
            dry = await shards.Unassign(pc.UnassignRequest(shards=["ok-000", "bad-000"], only_failed=True, dry_run=True))
            assert list(dry.shards) == ["bad-000"]
            await channel.close()
        finally:
            proc.stop()
            async with asyncio.timeout(30):
                await task
        assert await _statuses(etcd, prefix) == {}  # drained and revoked: nothing assigned
    finally:
        await etcd.delete_prefix(prefix.encode())
        await etcd.close()

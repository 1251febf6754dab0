"""``gazctl shards`` against two consumer processes (in this test's loop), real etcd and a real
broker; and the resolver: Stat sent to either process answers for the primary, proxied once.

gazctl runs as a subprocess in a worker thread, so the consumers keep serving meanwhile."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import grpc
import pytest
from consumer_support import CountingApp, journals_yaml, shards_yaml

from gazette.client import AppendService, JournalClient
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.message import JSONMessage, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import consumer_pb2_grpc as pc_grpc
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix

SHARDS = shards_yaml("part-000", "part-001", common="  labels:\n  - name: app\n    value: counter\n")

UNFRAMED = """\
name: raw/blobs
replication: 1
fragment:
  length: 1048576
  compression_codec: NONE
  stores: [file:///]
  refresh_interval: 1s
"""


async def _gazctl(cluster: Cluster, *args: str, stdin: str | None = None,
                  env: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = await asyncio.to_thread(cluster.gazctl, *args, stdin=stdin, env=env)
    return r[0], r[1], r[2]


async def _listed(cluster: Cluster, addr: str) -> dict[str, Any]:
    rc, out, err = await _gazctl(cluster, "shards", "list", "-o", "json", "--consumer.address", addr)
    assert rc == 0, err
    return {s["spec"]["id"]: s for s in json.loads(out).get("shards", [])}


async def _all_primary(cluster: Cluster, addr: str, ids: set[str]) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            listed = await _listed(cluster, addr)
            if set(listed) == ids and all(
                    any(st.get("code") == "PRIMARY" for st in s.get("status", [])) for s in listed.values()):
                return listed
            await asyncio.sleep(0.1)  # polling the listing, not synchronisation


@pytest.mark.timeout(180)
async def test_gazctl_shards_and_proxied_stat(cluster: Cluster) -> None:
    cluster.add_broker("local", "lively-lynx")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=journals_yaml("part-000", "part-001"))
    assert rc == 0, err
    rc, _, err = cluster.gazctl("journals", "apply", stdin=UNFRAMED)
    assert rc == 0, err
    prefix = unique_prefix("/gazette-test-shards")
    apps = [CountingApp(), CountingApp()]
    procs = [ConsumerProcess(ConsumerConfig(port=0, suffix=f"cons-{i}", limit=1,
                                            broker_address=cluster.broker.address,
                                            etcd_address=cluster.etcd_url, etcd_prefix=prefix,
                                            etcd_lease=5), apps[i]) for i in range(2)]
    tasks = [asyncio.create_task(p.run()) for p in procs]
    try:
        async with asyncio.timeout(30):
            for p in procs:
                await p.ready.wait()
        addr = procs[0].endpoint

        # Bad input: a source journal without a framed content-type refuses the whole apply.
        bad = SHARDS + "- id: raw-000\n  sources:\n  - journal: raw/blobs\n"
        rc, _, err = await _gazctl(cluster, "shards", "apply", "--consumer.address", addr, stdin=bad)
        assert rc == 1
        assert "changes[2].upsert.sources[0].journal" in err and "raw-000" in err, err
        assert await _listed(cluster, addr) == {}

        # Apply (through the environment's CONSUMER_ADDRESS), and both shards become primary,
        # one on each process (each takes one shard).
        rc, _, err = await _gazctl(cluster, "shards", "apply", stdin=SHARDS,
                                   env={"CONSUMER_ADDRESS": addr})
        assert rc == 0, err
        listed = await _all_primary(cluster, addr, {"count-000", "count-001"})
        primaries = {sid: s["route"]["members"][s["route"]["primary"]]["suffix"] for sid, s in listed.items()}
        assert sorted(primaries.values()) == ["cons-0", "cons-1"]

        # Input; then --lag falls to zero for every source journal once it is consumed.
        async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
            pub = Publisher(svc)
            for i in range(300):
                part = f"in/part-00{i % 2}"
                await pub.publish_committed(lambda m, p=part: (p, "application/x-ndjson"),
                                            JSONMessage(key=f"k{i % 7}"))
            await svc.flush()
        async with asyncio.timeout(60):
            while True:
                rc, out, err = await _gazctl(cluster, "shards", "list", "--lag", "-p", "-L", "app",
                                             "--consumer.address", addr)
                assert rc == 0, err
                lags = re.findall(r"(in/part-00\d):(\d+)", out)
                if len(lags) == 2 and all(int(n) == 0 for _, n in lags):
                    break
                await asyncio.sleep(0.1)  # polling the listing, not synchronisation
        assert "counter" in out and "PRIMARY" in out
        assert sum(a.counts.total() for a in apps) == 300

        # Stat through the process that is NOT the primary of count-001: proxied once, and
        # answered by the primary (its process ID in the header) after reading through.
        other = procs[0] if primaries["count-001"] == "cons-1" else procs[1]
        channel = insecure_channel(f"127.0.0.1:{other.bound_port}")
        stub = pc_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
        try:
            stat = await stub.Stat(pc.StatRequest(shard="count-001",
                                                  read_through={"in/part-001": 1, "in/unread": 1 << 40}))
            assert stat.status == pc.Status.OK
            assert stat.header.process_id.suffix == primaries["count-001"]
            assert stat.read_through["in/part-001"] > 0
            # A proxied request that reached the wrong process is refused, not re-proxied:
            # UNAVAILABLE, the broker's MisroutedRequest (the sender retries on a fresh route).
            wrong = pc.StatRequest(shard="count-001")
            wrong.header.CopyFrom(stat.header)  # a valid header, naming another process
            wrong.header.process_id.suffix = "nobody"
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Stat(wrong)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "ProcessId doesn't match our own" in (info.value.details() or "")
            missing = await stub.Stat(pc.StatRequest(shard="no-such-shard"))
            assert missing.status == pc.Status.SHARD_NOT_FOUND
        finally:
            await channel.close()

        # YAML round trip: list -o yaml applies back as is (revisions match) ...
        rc, yaml_out, err = await _gazctl(cluster, "shards", "list", "-o", "yaml", "--consumer.address", addr)
        assert rc == 0, err
        assert "common:" in yaml_out and "revision:" in yaml_out
        rc, _, err = await _gazctl(cluster, "shards", "apply", "--consumer.address", addr, stdin=yaml_out)
        assert rc == 0, err
        # ... and a second time it is stale: nothing applies, with a message saying why.
        rc, _, err = await _gazctl(cluster, "shards", "apply", "--consumer.address", addr, stdin=yaml_out)
        assert rc == 1 and "stale revision" in err, err

        # edit: $EDITOR rewrites max_txn_duration of the selected shard.
        rc, _, err = await _gazctl(cluster, "shards", "edit", "-l", "id=count-000",
                                   "--consumer.address", addr,
                                   env={"EDITOR": "sed -i -e 's/max_txn_duration: 1s/max_txn_duration: 2s/'"})
        assert rc == 0, err
        listed = await _listed(cluster, addr)
        assert listed["count-000"]["spec"]["max_txn_duration"] == "2s"
        assert listed["count-001"]["spec"]["max_txn_duration"] == "1s"

        # unassign: --failed matches nothing healthy; a plain unassign moves the shard, which
        # comes back as primary.
        rc, _, err = await _gazctl(cluster, "shards", "unassign", "-l", "app=counter", "--failed",
                                   "--consumer.address", addr)
        assert rc == 0 and "unassigned" not in err, err
        def runtime() -> Any:
            return next((p.shards["count-000"][0] for p in procs if "count-000" in p.shards), None)

        before = runtime()
        assert before is not None
        rc, _, err = await _gazctl(cluster, "shards", "unassign", "-l", "id=count-000",
                                   "--consumer.address", addr)
        assert rc == 0 and "unassigned shard" in err, err
        async with asyncio.timeout(60):
            while True:
                rt = runtime()
                if rt is not None and rt is not before and rt.ready.is_set():
                    break
                await asyncio.sleep(0.05)  # polling the processes' shards, not synchronisation
        await _all_primary(cluster, addr, {"count-000", "count-001"})
    finally:
        for p in procs:
            p.stop()
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)

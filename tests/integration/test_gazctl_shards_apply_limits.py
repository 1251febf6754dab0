"""``gazctl shards apply`` of more shards than one etcd transaction may hold (etcd's
--max-txn-ops, 128 by default): by default it is split into transactions etcd admits and
succeeds; ``--max-txn-size 0`` (one atomic transaction) is refused with the hint, applying
nothing. One consumer process (in this test's loop) serves the Apply; gazctl runs as a
subprocess in a worker thread, so the consumer keeps serving meanwhile."""

from __future__ import annotations

import asyncio
import json

import pytest
from consumer_support import CountingApp, journals_yaml

from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix

COUNT = 300


def _shards(prefix: str, count: int) -> str:
    shards = "".join(f"- id: {prefix}-{i:04d}\n" for i in range(count))
    return ("common:\n  max_txn_duration: 1s\n  sources:\n  - journal: in/part-000\n"
            f"shards:\n{shards}")


async def _listed(cluster: Cluster, addr: str) -> set[str]:
    r = await asyncio.to_thread(cluster.gazctl, "shards", "list", "-o", "json", "--consumer.address", addr)
    assert r.rc == 0, r.stderr
    return {s["spec"]["id"] for s in json.loads(r.stdout).get("shards", [])}


@pytest.mark.timeout(180)
async def test_shards_apply_is_split_by_default_and_atomic_on_request(cluster: Cluster) -> None:
    cluster.add_broker("local", "quiet-heron")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=journals_yaml("part-000"))
    assert rc == 0, err
    # limit=1: the process serves Apply and List, holding one shard at most.
    proc = ConsumerProcess(ConsumerConfig(port=0, suffix="cons-0", limit=1,
                                          broker_address=cluster.broker.address,
                                          etcd_address=cluster.etcd_url,
                                          etcd_prefix=unique_prefix("/gazette-test-shards-apply"),
                                          etcd_lease=5), CountingApp())
    task = asyncio.create_task(proc.run())
    try:
        async with asyncio.timeout(30):
            await proc.ready.wait()
        addr = proc.endpoint

        r = await asyncio.to_thread(cluster.gazctl, "shards", "apply", "--max-txn-size", "0",
                                    "--consumer.address", addr, stdin=_shards("atomic", COUNT))
        assert r.rc == 1
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert "too many operations in txn request" in r.stderr and "--max-txn-size" in r.stderr, r.stderr
        assert await _listed(cluster, addr) == set()

        r = await asyncio.to_thread(cluster.gazctl, "shards", "apply", "--consumer.address", addr,
                                    stdin=_shards("split", COUNT))
        assert r.rc == 0, r.stderr
        assert "transactions=3" in r.stderr, r.stderr  # 300 changes in transactions of 128
        assert await _listed(cluster, addr) == {f"split-{i:04d}" for i in range(COUNT)}
    finally:
        proc.stop()
        async with asyncio.timeout(30):
            await task

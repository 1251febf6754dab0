"""Hot standbys of a recording shard, with consumer applications as real processes
(``gazette consume``) on a real broker and etcd.

A shard with ``hot_standbys: 1`` and a recovery log runs as PRIMARY in one process and as a
STANDBY, tailing the log, in the other. The app counts inputs by key in an embedded store and
publishes per input a derived message with the key's count after it, so exactly-once
processing shows as counts 1..N per key, each seen once, and any lost or doubled state update
shows as a gap or a repeat.

* kill -9 of the primary: the standby is promoted when the primary's lease lapses, hands the log
  off from where it was tailing (no replay from the start), and continues from the last
  committed checkpoint.
* A zombie: the primary stops itself (SIGSTOP) mid-transaction, its lease lapses, the standby
  is promoted and fences the log; resumed, the zombie's commit fails REGISTER_MISMATCH
  (``LogFencedError``) and nothing it did is seen.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from consumer_support import (
    EMBEDDED_COUNTING_APP,
    ConsumerProc,
    check_counted_once,
    consumer_env,
    derived_docs,
    journal_tree,
    shard_replicas,
)

from gazette.allocator.keys import items_key
from gazette.client import AppendService, JournalClient
from gazette.etcd import connect
from gazette.message import JSONMessage, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.eventually import eventually

LEASE = 2.0  # seconds: the consumers' etcd lease TTL

@pytest.mark.timeout(300)
async def test_hot_standby_takes_over_a_killed_primary_and_fences_a_zombie(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_broker("local", "sturdy-ox")
    for doc in (journal_tree("in/", "application/x-ndjson", "part-000"),
                journal_tree("out/", "application/x-ndjson", "part-000", "part-001"),
                journal_tree("recovery/", "application/x-gazette-recoverylog", "count-000")):
        rc, _, err = cluster.gazctl("journals", "apply", stdin=doc)
        assert rc == 0, err
    prefix = unique_prefix("/gazette-test-standby")
    etcd = await connect(cluster.etcd_url)
    spec = pc.ShardSpec(id="count-000", recovery_log_prefix="recovery", hint_prefix=f"{prefix}-hints",
                        hint_backups=2, hot_standbys=1)
    spec.sources.add(journal="in/part-000")
    spec.max_txn_duration.seconds = 1
    await etcd.put(items_key(prefix, spec.id).encode(), spec.SerializeToString())
    (tmp_path / "embeddedapp.py").write_text(EMBEDDED_COUNTING_APP)
    env = consumer_env(cluster.env(), PYTHONPATH=str(tmp_path), ETCD_ADDRESS=cluster.etcd_url,
                       ETCD_PREFIX=prefix, ETCD_LEASE=f"{LEASE:.0f}s", LOG_FORMAT="text",
                       STORE_KIND="rocksdb", FREEZE_KEY="zombie", FREEZE_FLAG=str(tmp_path / "froze"))
    a = ConsumerProc("cons-a", env, tmp_path, app="embeddedapp:App")
    b = ConsumerProc("cons-b", env, tmp_path, app="embeddedapp:App")
    sent: Counter[str] = Counter()
    n_sent = 0

    async def replicas_are(want: dict[int, tuple[str, int]]) -> bool:
        return await shard_replicas(etcd, prefix, "count-000") == want

    async def publish(pub: Publisher, keys: list[str]) -> None:
        nonlocal n_sent
        for k in keys:
            await pub.publish_committed(lambda m: ("in/part-000", "application/x-ndjson"),
                                        JSONMessage(key=k, seq=n_sent))
            sent[k] += 1
            n_sent += 1

    async def all_derived(client: JournalClient) -> list[dict[str, Any]] | None:
        docs = await derived_docs(client)
        return docs if len(docs) >= n_sent else None

    PRIMARY, STANDBY = pc.ReplicaStatus.PRIMARY, pc.ReplicaStatus.STANDBY
    a.start()
    try:
        await eventually(lambda: replicas_are({0: ("cons-a", PRIMARY)}), "cons-a primary", 60)
        b.start()
        await eventually(lambda: replicas_are({0: ("cons-a", PRIMARY), 1: ("cons-b", STANDBY)}), "cons-b to tail the log as STANDBY", 60)
        async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
            pub = Publisher(svc)
            await publish(pub, [f"k{i % 5}" for i in range(100)])
            await svc.flush()
            await eventually(lambda: all_derived(client), "the first 100 inputs processed", 60)

            # kill -9 of the primary: the standby takes over from where it tails.
            await asyncio.to_thread(a.kill)
            killed = time.monotonic()
            await eventually(lambda: replicas_are({0: ("cons-b", PRIMARY)}), "cons-b promoted", 60, interval=0.05)
            failover = time.monotonic() - killed
            promoted = [ln for ln in b.log_text().splitlines() if "shard assigned as primary" in ln]
            assert promoted and re.search(r"from_standby=True", promoted[-1]), promoted
            await publish(pub, [f"k{i % 5}" for i in range(100)])
            await svc.flush()
            check_counted_once(await eventually(lambda: all_derived(client), "200 inputs processed", 60),
                                sent, n_sent)

            # A zombie: cons-b stops itself mid-transaction; cons-a (a standby again) takes over.
            a.start()
            await eventually(lambda: replicas_are({0: ("cons-b", PRIMARY), 1: ("cons-a", STANDBY)}), "cons-a to tail the log as STANDBY", 60)
            await publish(pub, ["k0", "k1", "zombie", "k2"])
            await svc.flush()
            await eventually(lambda: _true(b.stopped()), "cons-b to freeze mid-transaction", 60)
            await eventually(lambda: replicas_are({0: ("cons-a", PRIMARY)}), "cons-a promoted", 60)
            b.signal(signal.SIGCONT)
            await eventually(lambda: _true("is fenced by another author" in b.log_text()), "the zombie's commit to fail on the log's fence", 60)
            await publish(pub, ["k3", "zombie"])
            await svc.flush()
            check_counted_once(await eventually(lambda: all_derived(client), "every input processed", 60),
                                sent, n_sent)
        print(f"\nhot standby: promoted {failover:.2f}s after kill -9 (lease TTL {LEASE:.0f}s); "
              f"{n_sent} inputs, each counted once")
    finally:
        await asyncio.to_thread(a.terminate)
        await asyncio.to_thread(b.terminate)
        await etcd.delete_prefix(prefix.encode())
        await etcd.close()


async def _true(v: bool) -> bool:
    return v

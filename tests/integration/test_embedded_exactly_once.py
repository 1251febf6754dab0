"""Exactly-once on embedded stores under faults (``soak``): the counting app of the consumer
soak, on RocksDBStore and on SQLiteStore recorded to recovery logs, with a hot standby per
shard, as real processes (``gazette consume``) on a real broker and etcd.

Under a steady input, consumer processes are killed (SIGKILL) and drained (SIGTERM) and
restarted, repeatedly; shards move to their standbys or recover from their logs. Afterwards
every input's derived message is seen exactly once by a read-committed reader, and each key's
counts (the store's state after each input, carried in the derived messages) are exactly
1..N: no state update lost, none applied twice. Finally ``gazctl shards recover`` plays each
shard's log into a directory whose counts are the input's. ``SOAK_SECONDS`` sets the duration
of each store's run (default 90); ``SOAK_SEED`` the fault schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
import rocksdict
from consumer_support import (
    EMBEDDED_COUNTING_APP,
    ConsumerProc,
    check_counted_once,
    consumer_endpoints,
    consumer_env,
    derived_docs,
    inflict_faults,
    journal_tree,
    unassign_failed,
)

from gazette.allocator.keys import items_key
from gazette.client import AppendService, JournalClient
from gazette.etcd import connect
from gazette.message import JSONMessage, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.eventually import eventually

PARTS = 2


def _partition(msg: JSONMessage) -> tuple[str, str]:
    """Inputs are partitioned by key: each key is counted by one shard."""
    return f"in/part-00{int(msg.doc['key'][1:]) % PARTS}", "application/x-ndjson"


def _store_counts(kind: str, path: Path) -> dict[str, int]:
    if kind == "sqlite":
        conn = sqlite3.connect(path / "db.sqlite")  # the recovered copy: its WAL is applied on open
        try:
            return dict(conn.execute("SELECT k, n FROM counts").fetchall())
        finally:
            conn.close()
    db = rocksdict.Rdict(str(path), access_type=rocksdict.AccessType.read_only())
    try:
        return {bytes(k).decode(): int(bytes(v)) for k, v in db.items() if not bytes(k).startswith(b"\x00")}
    finally:
        db.close()


@pytest.mark.soak
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kind", ["rocksdb", "sqlite"])
async def test_embedded_exactly_once_under_kills_and_restarts(cluster: Cluster, tmp_path: Path, kind: str) -> None:
    duration = float(os.environ.get("SOAK_SECONDS", "90"))
    rng = random.Random(int(os.environ.get("SOAK_SEED", "7")))
    cluster.add_broker("local", "sturdy-ox")
    for doc in (journal_tree("in/", "application/x-ndjson", *(f"part-00{i}" for i in range(PARTS))),
                journal_tree("out/", "application/x-ndjson", "part-000", "part-001"),
                journal_tree("recovery/", "application/x-gazette-recoverylog",
                             *(f"count-00{i}" for i in range(PARTS)))):
        rc, _, err = cluster.gazctl("journals", "apply", stdin=doc)
        assert rc == 0, err
    prefix = unique_prefix("/gazette-test-embedded")
    etcd = await connect(cluster.etcd_url)
    for i in range(PARTS):
        spec = pc.ShardSpec(id=f"count-00{i}", recovery_log_prefix="recovery", hint_prefix=f"{prefix}-hints",
                            hint_backups=2, hot_standbys=1)
        spec.sources.add(journal=f"in/part-00{i}")
        spec.max_txn_duration.seconds = 1
        await etcd.put(items_key(prefix, spec.id).encode(), spec.SerializeToString())
    (tmp_path / "embeddedapp.py").write_text(EMBEDDED_COUNTING_APP)
    env = consumer_env(cluster.env(), PYTHONPATH=str(tmp_path), ETCD_ADDRESS=cluster.etcd_url,
                       ETCD_PREFIX=prefix, ETCD_LEASE="2s", LOG_FORMAT="text", STORE_KIND=kind)
    procs = [ConsumerProc(f"cons-{i}", env, tmp_path, app="embeddedapp:App") for i in range(3)]
    for p in procs:
        p.start()
    sent: Counter[str] = Counter()
    n_sent = 0
    stats = Counter[str]()
    stop = asyncio.Event()

    async def produce() -> None:
        nonlocal n_sent
        async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
            pub = Publisher(svc)
            while not stop.is_set():
                batch = []
                for _ in range(20):
                    key = f"k{rng.randrange(100)}"
                    batch.append(JSONMessage(key=key, seq=n_sent))
                    sent[key] += 1
                    n_sent += 1
                await pub.publish_committed_many(_partition, batch)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)  # a steady input
            await svc.flush()

    async def restart_failed() -> None:
        await unassign_failed(etcd, prefix, [f"count-00{i}" for i in range(PARTS)], stats)

    producer = asyncio.create_task(produce())
    try:
        await inflict_faults(procs, rng, duration, (4, 9), stats, restart_failed)
        stop.set()
        await producer

        async def all_derived() -> list[dict[str, object]] | None:
            await restart_failed()
            async with JournalClient(cluster.broker.address) as client:
                docs = await derived_docs(client)
            return docs if len(docs) >= n_sent else None

        docs = await eventually(all_derived, "every input's derived message", 300, interval=1.0)
        check_counted_once(docs, sent, n_sent)  # type: ignore[arg-type]

        # Each shard's log alone replays to its exact counts.
        recovered: Counter[str] = Counter()
        for i in range(PARTS):
            out = tmp_path / f"recovered-{i}"
            for endpoint in await consumer_endpoints(etcd, prefix):  # a killed one may linger
                rc, _, err = await asyncio.to_thread(cluster.gazctl, "shards", "recover", "--id", f"count-00{i}",
                                                     "--dir", str(out), env={"CONSUMER_ADDRESS": endpoint})
                if "UNAVAILABLE" not in err:
                    break
            assert rc == 0, err
            recovered.update(_store_counts(kind, out))
        assert recovered == sent, "the recovery logs replay to the input's counts"
        print(f"\nsoak ({kind}): {n_sent} inputs over {duration:.0f}s, faults {dict(stats)}; "
              f"each derived once, counts 1..N per key, logs replay to the exact counts")
    finally:
        stop.set()
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(BaseException):
                await producer
        for p in procs:
            await asyncio.to_thread(p.terminate)
        await etcd.delete_prefix(prefix.encode())
        await etcd.close()

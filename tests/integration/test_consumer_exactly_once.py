"""Exactly-once through the consumer framework, with real etcd, a real broker, PostgreSQL
(SQLStore) and consumer applications as real processes (``gazette consume``).

The app counts inputs by key into PostgreSQL and publishes one derived message per input
(``SQL_COUNTING_APP``). Two tests:

* Zombie fencing: a primary freezes (SIGSTOP, by itself, mid-transaction: state written to its
  SQL transaction, derived messages not yet published) until its etcd lease expires and the
  shard moves to the other process, which restores (bumping the fence) and processes the same
  input. Resumed, the zombie's commit fails on the fence: the key counts once, and a
  read-committed reader sees its derived message once.
* Soak (``soak``): under a steady input, consumer processes are killed (SIGKILL) and drained
  (SIGTERM) and restarted, repeatedly, for minutes. Afterwards the per-key counts equal the
  input exactly and a read-committed reader of the outputs sees every derived message exactly
  once. ``SOAK_SECONDS`` sets the duration (default 180). It runs twice: with the untyped app
  above, and with ``examples.typed_counter`` (typed messages, per-shard state, written from
  ``gazette.consumer`` and ``gazette.message`` alone) on the same journals, tables and checks,
  for a third of the duration by default (the same framework under it: the typed run proves
  the app's side, and keeps CI within its budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aetcd
import pytest
from consumer_support import (
    COUNTS_DDL,
    SQL_COUNTING_APP,
    ConsumerProc,
    consumer_endpoints,
    consumer_env,
    inflict_faults,
    unassign_failed,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from examples.typed_counter import Input
from gazette.allocator.keys import assignments_prefix, items_key
from gazette.client import AppendService, JournalClient
from gazette.consumer.stores.sql import SQLStore
from gazette.etcd import connect
from gazette.message import JSONMessage, Publisher
from gazette.message.reading import read_committed
from gazette.message.uuid import ACK_TXN, get_flags
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.eventually import eventually

PARTS = 4
ROOT = Path(__file__).resolve().parents[2]
APPS = {"untyped": "soakapp:App", "typed": "examples.typed_counter:TypedCounter"}


def _journals() -> str:
    def tree(prefix: str, n: int) -> str:
        children = "".join(f"- name: {prefix}part-00{i}\n" for i in range(n))
        return (f"name: {prefix}\nreplication: 1\nlabels:\n- name: content-type\n"
                "  value: application/x-ndjson\nfragment:\n  length: 4194304\n"
                "  compression_codec: NONE\n  stores: [file:///]\n  refresh_interval: 1s\n"
                "children:\n" + children)
    return tree("in/", PARTS) + "---\n" + tree("out/", 2)


@contextlib.asynccontextmanager
async def _setup(cluster: Cluster, dsn: str, tmp_path: Path, shards: int) -> AsyncIterator[tuple[aetcd.Client, str, AsyncEngine, dict[str, str]]]:
    cluster.add_broker("local", "sturdy-ox")
    for doc in _journals().split("---\n"):
        rc, _, err = cluster.gazctl("journals", "apply", stdin=doc)
        assert rc == 0, err
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    await SQLStore.create_tables(engine)
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS counts"))
        await conn.execute(text(COUNTS_DDL))
        await conn.execute(text("DELETE FROM gazette_checkpoints"))
    prefix = unique_prefix("/gazette-test-eo")
    etcd = await connect(cluster.etcd_url)
    for i in range(shards):
        spec = pc.ShardSpec(id=f"count-00{i}")
        spec.sources.add(journal=f"in/part-00{i}")
        spec.max_txn_duration.seconds = 1
        await etcd.put(items_key(prefix, spec.id).encode(), spec.SerializeToString())
    (tmp_path / "soakapp.py").write_text(SQL_COUNTING_APP)
    env = consumer_env(cluster.env(), PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", ETCD_ADDRESS=cluster.etcd_url,
                       ETCD_PREFIX=prefix, ETCD_LEASE="2s", LOG_FORMAT="text",
                       STORE_DSN=dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        yield etcd, prefix, engine, env
    finally:
        await etcd.delete_prefix(prefix.encode())
        await etcd.close()
        await engine.dispose()


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {k: int(n) for k, n in (await conn.execute(text("SELECT k, n FROM counts"))).all()}


async def _assignments(etcd: aetcd.Client, prefix: str) -> dict[str, tuple[str, pc.ReplicaStatus]]:
    """shard -> (member suffix, status) of primary assignments."""
    out = {}
    for kv in await etcd.get_prefix(assignments_prefix(prefix).encode()):
        parts = kv.key.decode()[len(assignments_prefix(prefix)):].split("#")
        if len(parts) >= 4 and parts[3] == "0":
            out[parts[0]] = (parts[2], pc.ReplicaStatus.FromString(kv.value))
    return out


async def _derived(client: JournalClient) -> Counter[int]:
    seen: Counter[int] = Counter()
    async for env in read_committed(client, "prefix=out/", block=False):
        if get_flags(env.message.get_uuid()) != ACK_TXN:
            seen[int(env.message.doc["seq"])] += 1
    return seen


@pytest.mark.timeout(240)
async def test_zombie_primary_is_fenced(cluster: Cluster, postgres_db: str, tmp_path: Path) -> None:
    async with _setup(cluster, postgres_db, tmp_path, shards=1) as (etcd, prefix, engine, env):
        flag = tmp_path / "froze"
        env = {**env, "FREEZE_KEY": "zombie", "FREEZE_FLAG": str(flag)}
        a = ConsumerProc("cons-a", env, tmp_path)
        b = ConsumerProc("cons-b", env, tmp_path)
        a.start()
        try:
            await eventually(lambda: _first_primary(etcd, prefix, "cons-a"), "cons-a primary of count-000", 60)
            b.start()
            await eventually(lambda: _endpoints_n(etcd, prefix, 2), "cons-b announced", 60)
            async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
                pub = Publisher(svc)
                docs = [{"key": "k", "seq": i} for i in range(20)] + [{"key": "zombie", "seq": 20}]
                for d in docs:
                    await pub.publish_committed(lambda m: ("in/part-000", "application/x-ndjson"), JSONMessage(**d))
                await svc.flush()
                # cons-a froze itself mid-transaction; its lease lapses and cons-b takes over.
                await eventually(lambda: _true(a.stopped()), "cons-a to freeze", 60)
                await eventually(lambda: _first_primary(etcd, prefix, "cons-b"), "cons-b primary after the lease", 60)
                # The zombie's open SQL transaction holds row locks on the counts it wrote, so
                # cons-b's writes of the same keys wait on it (PostgreSQL semantics; see
                # docs/consumers.md on idle_in_transaction_session_timeout).
                a.signal(signal.SIGCONT)  # the zombie resumes and tries to commit
                # CheckpointFencedError's own words: its class name shows only when a traceback is
                # logged, which depends on which of the zombie's paths meets the fence first.
                # Resumed, the zombie may instead read first (its etcd watch's buffered events)
                # that its member key is gone: it then stops, abandoning its open commit (its SQL
                # connection closed, its transaction rolled back) before the commit reaches the
                # fence. Either way nothing it wrote commits; the counts below say so.
                await eventually(lambda: _true(_zombie_stopped(a.log_text())), "the zombie's commit to fail on the fence", 60)
                await eventually(lambda: _counts_are(engine, {"k": 20, "zombie": 1}), "cons-b to count", 60)
                assert await _counts(engine) == {"k": 20, "zombie": 1}
                derived = await eventually(lambda: _derived_complete(client, 21), "derived messages", 60)
                assert derived == Counter(range(21)), "each derived message exactly once"
        finally:
            a.terminate()
            b.terminate()


async def _true(v: bool) -> bool:
    return v


def _zombie_stopped(log: str) -> bool:
    """The zombie's commit failed on the fence, or it learned it is no member first and stopped
    with its commit outstanding (failed, never committed)."""
    return "was updated (by a new primary)" in log or (
        "a commit outstanding as its transactions ended failed" in log and "consumer stopped" in log)


async def _first_primary(etcd: aetcd.Client, prefix: str, suffix: str) -> bool:
    got = (await _assignments(etcd, prefix)).get("count-000")
    return got is not None and got[0] == suffix and got[1].code == pc.ReplicaStatus.PRIMARY


async def _endpoints_n(etcd: aetcd.Client, prefix: str, n: int) -> bool:
    return len(await consumer_endpoints(etcd, prefix)) >= n


async def _counts_are(engine: AsyncEngine, want: dict[str, int]) -> bool:
    return await _counts(engine) == want


async def _derived_complete(client: JournalClient, n: int) -> Counter[int] | None:
    seen = await _derived(client)
    return seen if len(seen) >= n else None


@pytest.mark.timeout(240)
async def test_typed_app_counts_exactly_once(cluster: Cluster, postgres_db: str, tmp_path: Path) -> None:
    """``examples.typed_counter`` as a process, fed typed inputs: counts and outputs exact (the
    soak's checks, without its faults)."""
    async with _setup(cluster, postgres_db, tmp_path, shards=2) as (etcd, prefix, engine, env):
        proc = ConsumerProc("cons-typed", env, tmp_path, app=APPS["typed"])
        proc.start()
        try:
            expect: Counter[str] = Counter()
            async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
                pub = Publisher(svc)
                inputs = [Input(key=f"k{i % 7}", seq=i) for i in range(120)]
                for i in range(0, len(inputs), 40):
                    part = f"in/part-00{(i // 40) % 2}"
                    await pub.publish_committed_many(lambda m, p=part: (p, "application/x-ndjson"), inputs[i:i + 40])
                    expect.update(m.key for m in inputs[i:i + 40])
                await svc.flush()
                await eventually(lambda: _counts_are(engine, dict(expect)), "typed counts", 120)
                derived = await eventually(lambda: _derived_complete(client, len(inputs)), "derived messages", 60)
                assert derived == Counter(range(len(inputs))), "each derived message exactly once"
        finally:
            proc.terminate()


@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("app", sorted(APPS))
async def test_exactly_once_under_kills_and_restarts(cluster: Cluster, postgres_db: str, tmp_path: Path,
                                                     app: str) -> None:
    duration = float(os.environ.get("SOAK_SECONDS", "180" if app == "untyped" else "60"))
    rng = random.Random(int(os.environ.get("SOAK_SEED", "7")))
    async with _setup(cluster, postgres_db, tmp_path, shards=PARTS) as (etcd, prefix, engine, env):
        procs = [ConsumerProc(f"cons-{i}", env, tmp_path, app=APPS[app]) for i in range(3)]
        for p in procs:
            p.start()
        expect: Counter[str] = Counter()
        sent = 0
        stats = Counter[str]()
        stop = asyncio.Event()

        async def produce() -> None:
            nonlocal sent
            async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
                pub = Publisher(svc)
                while not stop.is_set():
                    batch = []
                    for _ in range(40):
                        key = f"k{rng.randrange(200)}"
                        batch.append(JSONMessage(key=key, seq=sent))
                        expect[key] += 1
                        sent += 1
                    part = f"in/part-00{(sent // 40) % PARTS}"
                    await pub.publish_committed_many(lambda m, p=part: (p, "application/x-ndjson"), batch)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.05)  # a steady rate (~800/s)
                await svc.flush()

        async def restart_failed() -> None:
            await unassign_failed(etcd, prefix, [f"count-00{i}" for i in range(PARTS)], stats)

        producer = asyncio.create_task(produce())
        try:
            await inflict_faults(procs, rng, duration, (3, 8), stats, restart_failed)
            stop.set()
            await producer
            for p in procs:
                if not p.running():
                    p.start()

            async def converged() -> bool:
                await restart_failed()
                return await _counts(engine) == dict(expect)

            await eventually(converged, "per-key counts to equal the input", 300, interval=1.0)
            async with JournalClient(cluster.broker.address) as client:
                derived = await eventually(lambda: _derived_complete(client, sent), "derived messages", 300, interval=1.0)
            dupes = {s: n for s, n in derived.items() if n != 1}
            assert not dupes, f"derived messages seen more than once: {list(dupes.items())[:10]}"
            assert set(derived) == set(range(sent))
            print(f"\nsoak ({app} app): {sent} inputs over {duration:.0f}s, faults {dict(stats)}; counts exact, "
                  f"{len(derived)} derived messages each seen once")
        finally:
            stop.set()
            if not producer.done():
                producer.cancel()
                with contextlib.suppress(BaseException):
                    await producer
            for p in procs:
                await asyncio.to_thread(p.terminate)

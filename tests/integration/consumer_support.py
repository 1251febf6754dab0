"""Shared pieces of the consumer integration tests: source journal specs and a counting app."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd

from gazette.allocator.keys import assignments_prefix
from gazette.client import JournalClient, write_head
from gazette.consumer.client import ShardClient, ShardStatusError
from gazette.consumer.stores.memory import MemoryStore
from gazette.etcd import connect
from gazette.message import Envelope, JSONMessage
from gazette.message.reading import read_committed
from gazette.message.uuid import ACK_TXN, get_flags
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster
from gazette.testing.consumer_proc import ConsumerProc, consumer_endpoints, consumer_env
from gazette.testing.etcd import unique_prefix
from gazette.testing.eventually import eventually

__all__ = [
    "COUNTS_DDL", "EMBEDDED_COUNTING_APP", "JOURNALS", "SQL_COUNTING_APP", "ConsumerProc", "CountingApp",
    "ExampleRun", "check_counted_once", "consumer_endpoints", "consumer_env", "derived_docs", "example_run", "inflict_faults",
    "journal_tree", "journals_yaml", "read_through_sources", "shard_replicas", "shards_yaml", "unassign_failed", "wait_for_consumers",
]


def journals_yaml(*parts: str) -> str:
    """A journal spec tree of framed (ndjson) journals ``in/<part>`` for ``gazctl journals apply``."""
    children = "".join(f"- name: in/{p}\n" for p in parts)
    return ("name: in/\nreplication: 1\nlabels:\n- name: content-type\n  value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [file:///]\n"
            "  refresh_interval: 1s\nchildren:\n" + children)


def shards_yaml(*parts: str, common: str = "") -> str:
    """A shard space of shards ``count-NNN`` reading ``in/part-NNN`` (1 s transactions), with
    ``common`` lines added under ``common:``."""
    shards = "".join(f"- id: count-{p.rsplit('-', 1)[-1]}\n  sources:\n  - journal: in/{p}\n" for p in parts)
    return "common:\n  max_txn_duration: 1s\n" + common + "shards:\n" + shards


class CountingApp:
    """Counts messages by their ``key`` field (ACKs skipped); ``fail(shard, env)`` may raise."""

    def __init__(self, fail: Callable[[Any, Envelope], None] | None = None) -> None:
        self.counts: Counter[str] = Counter()
        self.fail = fail

    def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore()

    def new_message(self, spec: Any) -> type[JSONMessage]:
        return JSONMessage

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Any) -> None:
        if get_flags(env.message.get_uuid()) == ACK_TXN:
            return  # transaction acknowledgements are delivered too, as in Gazette
        if self.fail is not None:
            self.fail(shard, env)
        self.counts[env.message.doc["key"]] += 1

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


# -- consumer applications as real processes ------------------------------------------------


SQL_COUNTING_APP = textwrap.dedent('''
    """Counts inputs by key into PostgreSQL (SQLStore) and publishes one derived message per
    input into out/part-00{0,1}. With FREEZE_KEY set, the first process to finalize a
    transaction holding that key stops itself (SIGSTOP) before committing: a zombie-to-be."""
    import os, signal, zlib
    from collections import Counter
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine
    from gazette.consumer.stores.sql import SQLStore
    from gazette.message import JSONMessage
    from gazette.message.uuid import ACK_TXN, get_flags

    UPSERT = text("INSERT INTO counts (k, n) VALUES (:k, :n) "
                  "ON CONFLICT (k) DO UPDATE SET n = counts.n + EXCLUDED.n")

    def _out(msg):
        return f"out/part-00{zlib.crc32(msg.doc['key'].encode()) % 2}", "application/x-ndjson"

    class App:
        def __init__(self):
            self.engine = create_async_engine(os.environ["STORE_DSN"], pool_size=16)
            self.pending = {}

        def new_store(self, shard, recorder):
            return SQLStore(self.engine)

        def new_message(self, spec):
            return JSONMessage

        def begin_txn(self, shard, store):
            self.pending[shard.spec.id] = []

        def finished_txn(self, shard, store, future):
            pass

        def consume_message(self, shard, store, env, pub):
            if get_flags(env.message.get_uuid()) != ACK_TXN:
                self.pending[shard.spec.id].append(env.message.doc)

        async def finalize_txn(self, shard, store, pub):
            docs = self.pending.pop(shard.spec.id, [])
            if not docs:
                return
            conn = await store.transaction()
            # Sorted keys: shards sharing keys lock their rows in one order (no deadlocks).
            await conn.execute(UPSERT, [{"k": k, "n": n} for k, n in sorted(Counter(d["key"] for d in docs).items())])
            freeze, flag = os.environ.get("FREEZE_KEY"), os.environ.get("FREEZE_FLAG", "")
            if freeze and any(d["key"] == freeze for d in docs) and not os.path.exists(flag):
                open(flag, "w").close()
                os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the test, as a zombie
            await pub.publish_uncommitted_many(
                _out, [JSONMessage(key=d["key"], seq=d["seq"]) for d in docs])
''')

EMBEDDED_COUNTING_APP = textwrap.dedent('''
    """Counts inputs by key into an embedded store recorded to the shard's recovery log
    (STORE_KIND: rocksdb or sqlite), publishing per input a derived message carrying the key's
    count after it: exactly-once processing makes those counts 1..N per key, each once. With
    FREEZE_KEY set, the first process to finalize a transaction holding that key stops itself
    (SIGSTOP) before committing: a zombie-to-be."""
    import os, signal, zlib
    from gazette.consumer.stores.rocksdb import RocksDBStore
    from gazette.consumer.stores.sqlite import SQLiteStore
    from gazette.message import JSONMessage
    from gazette.message.uuid import ACK_TXN, get_flags

    def _out(msg):
        return f"out/part-00{zlib.crc32(msg.doc['key'].encode()) % 2}", "application/x-ndjson"

    class App:
        def __init__(self):
            self.kind = os.environ.get("STORE_KIND", "rocksdb")
            self.pending = {}

        def new_store(self, shard, recorder):
            if self.kind == "sqlite":
                store = SQLiteStore(recorder)
                store.conn.execute("CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL)")
                return store
            return RocksDBStore(recorder)

        def new_message(self, spec):
            return JSONMessage

        def consume_message(self, shard, store, env, pub):
            if get_flags(env.message.get_uuid()) != ACK_TXN:
                self.pending.setdefault(shard.spec.id, []).append(env.message.doc)

        async def finalize_txn(self, shard, store, pub):
            docs = self.pending.pop(shard.spec.id, [])
            out = []
            for d in docs:
                if isinstance(store, SQLiteStore):
                    n = store.conn.execute("INSERT INTO counts VALUES (?, 1) ON CONFLICT (k) "
                                           "DO UPDATE SET n = n + 1 RETURNING n", (d["key"],)).fetchone()[0]
                else:
                    n = int(store.get(d["key"].encode(), b"0")) + 1
                    store.put(d["key"].encode(), b"%d" % n)
                out.append(JSONMessage(key=d["key"], seq=d["seq"], n=n))
            freeze, flag = os.environ.get("FREEZE_KEY"), os.environ.get("FREEZE_FLAG", "")
            if freeze and any(d["key"] == freeze for d in docs) and not os.path.exists(flag):
                open(flag, "w").close()
                os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the test, as a zombie
            if out:
                await pub.publish_uncommitted_many(_out, out)
''')

COUNTS_DDL = "CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n BIGINT NOT NULL)"


async def wait_for_consumers(etcd: aetcd.Client, prefix: str, n: int, limit: float = 60) -> list[str]:
    """The endpoints of the consumer processes under ``prefix``, once there are ``n``."""
    async def announced() -> list[str] | None:
        eps = await consumer_endpoints(etcd, prefix)
        return eps if len(eps) >= n else None

    got: list[str] = await eventually(announced, f"{n} consumers announced", limit)
    return got


@dataclass
class ExampleRun:
    """An example's consumer processes, started by ``example_run``."""

    prefix: str  # their etcd prefix
    procs: list[ConsumerProc]
    endpoints: list[str]


@contextlib.asynccontextmanager
async def example_run(cluster: Cluster, log_dir: Path, example: Path, app: str,
                      processes: int = 2, **env: str) -> AsyncIterator[ExampleRun]:
    """Applies ``example``'s journals.yaml, starts ``processes`` ``gazette consume --app app``
    children (the repository root on PYTHONPATH, a 2 s lease, ``env`` added), applies its
    shards.yaml with a hint prefix of this run's own, and yields once all have announced.
    On exit the children are killed, not drained: with a hot standby per shard and two
    processes, neither could hand its shards off (the allocator keeps replication)."""
    rc, _, err = await asyncio.to_thread(cluster.gazctl, "journals", "apply", "--specs", str(example / "journals.yaml"))
    assert rc == 0, err
    prefix = unique_prefix(f"/gazette-test-{example.name}")
    full_env = consumer_env(cluster.env(), PYTHONPATH=str(example.parents[1]), ETCD_ADDRESS=cluster.etcd_url,
                            ETCD_PREFIX=prefix, ETCD_LEASE="2s", LOG_FORMAT="text", **env)
    procs = [ConsumerProc(f"{example.name}-{i}", full_env, log_dir, app=app) for i in range(processes)]
    for p in procs:
        p.start()
    etcd = await connect(cluster.etcd_url)
    try:
        endpoints = await wait_for_consumers(etcd, prefix, processes)
        shards = re.sub(r"hint_prefix: \S+", f"hint_prefix: {prefix}-hints", (example / "shards.yaml").read_text())
        rc, _, err = await asyncio.to_thread(cluster.gazctl, "shards", "apply", "--consumer.address", endpoints[0],
                                             stdin=shards)
        assert rc == 0, err
        yield ExampleRun(prefix, procs, endpoints)
    finally:
        for p in procs:
            await asyncio.to_thread(p.kill)
        await etcd.delete_prefix(prefix.encode())
        await etcd.close()


async def read_through_sources(client: JournalClient, endpoint: str, sources: dict[str, str]) -> dict[str, int]:
    """Returns once each shard (``sources``: shard -> its source journal) has processed its
    source through the write head as of the call; the heads, by journal."""
    heads = {j: await write_head(client, j) for j in sources.values()}
    async with ShardClient(endpoint) as sc:
        for shard, journal in sources.items():
            async def stat(shard: str = shard, journal: str = journal) -> bool:
                # A shard applied a moment ago has no primary until it is assigned one.
                try:
                    await asyncio.wait_for(sc.stat(shard, read_through={journal: heads[journal]}), 120)
                except ShardStatusError as err:
                    if err.status != pc.Status.NO_SHARD_PRIMARY:
                        raise
                    return False
                return True

            await eventually(stat, f"shard {shard} read through {journal}", 120)
    return heads


async def shard_replicas(etcd: aetcd.Client, prefix: str, shard: str) -> dict[int, tuple[str, int]]:
    """slot -> (member suffix, ReplicaStatus code) of ``shard``'s assignments."""
    out = {}
    for kv in await etcd.get_prefix(f"{assignments_prefix(prefix)}{shard}#".encode()):
        _, _, suffix, slot = kv.key.decode()[len(assignments_prefix(prefix)):].split("#")
        out[int(slot)] = (suffix, pc.ReplicaStatus.FromString(kv.value).code)
    return out


JOURNALS = """name: {name}
replication: 1
labels:
- name: content-type
  value: {content_type}
fragment:
  length: 1048576
  compression_codec: NONE
  stores: [file:///]
  refresh_interval: 1s
children:
{children}"""


def journal_tree(name: str, content_type: str, *children: str) -> str:
    return JOURNALS.format(name=name, content_type=content_type,
                           children="".join(f"- name: {name}{c}\n" for c in children))


async def derived_docs(client: JournalClient) -> list[dict[str, Any]]:
    out = []
    async for env in read_committed(client, "prefix=out/", block=False):
        if get_flags(env.message.get_uuid()) != ACK_TXN:
            out.append(env.message.doc)
    return out


def check_counted_once(docs: list[dict[str, Any]], sent: Counter[str], n_sent: int) -> None:
    """Every input's derived message once, and each key's counts exactly 1..N."""
    seqs = Counter(d["seq"] for d in docs)
    assert seqs == Counter(range(n_sent)), \
        f"derived messages not each seen once: {sorted(s for s, n in seqs.items() if n != 1)[:10]}"
    counts: dict[str, list[int]] = defaultdict(list)
    for d in docs:
        counts[d["key"]].append(d["n"])
    assert {k: sorted(v) for k, v in counts.items()} == {k: list(range(1, n + 1)) for k, n in sent.items()}


async def unassign_failed(etcd: aetcd.Client, prefix: str, shards: list[str], stats: Counter[str]) -> None:
    """Restarts FAILED shards through the first member that answers (a killed member's key
    lingers until its lease lapses, so some may not)."""
    for ep in await consumer_endpoints(etcd, prefix):
        with contextlib.suppress(Exception):
            async with ShardClient(ep) as sc:
                resp = await sc.unassign(shards, only_failed=True)
                stats["failed shards re-assigned"] += len(resp.shards)
            return


async def inflict_faults(procs: list[ConsumerProc], rng: random.Random, duration: float,
                         gap: tuple[float, float], stats: Counter[str], after: Any) -> None:
    """For ``duration`` seconds, every ``gap`` seconds (uniform), kills (SIGKILL, 70%) or
    drains (SIGTERM) a random process and restarts it, then awaits ``after()``."""
    started = time.monotonic()
    while time.monotonic() - started < duration:
        await asyncio.sleep(rng.uniform(*gap))  # the fault schedule, not synchronisation
        victim = rng.choice(procs)
        if rng.random() < 0.7:
            await asyncio.to_thread(victim.kill)
            stats["SIGKILL"] += 1
        else:
            await asyncio.to_thread(victim.terminate)
            stats["SIGTERM"] += 1
        victim.start()
        await after()

"""The examples' throughput: bike-share rides/s through four shards (SQLite and PostgreSQL), and
word-count documents/s and query latency, each beside a ceiling measured in the same run.

Starts an etcd and a broker (``gazette.testing``), and runs the consumers in this process
(``ConsumerHarness``: the real consumer process, allocator, transaction loop, recorder).

* **bike-share**: ``--bikes`` bikes' generated rides (``examples.bike_share.rides``) are
  appended, committed, to the four ride partitions first; then the four ``cycles-part`` shards
  (all ``store=sqlite``, then all ``store=postgres`` when PostgreSQL answers on 127.0.0.1) are
  created and rides/s is timed to their read-through. The ceiling is the same statements per
  ride (insert, window, cycle query), run directly on one connection with one commit per 500
  rides and no framework: SQLite on a WAL file, PostgreSQL over SQLAlchemy.
* **word-count**: ``--docs`` documents of 20-60 words are published through the ``NGram``
  service (16 in flight) and timed until the four RocksDB shards (one
  process: the harness's in-process consumers share one app instance, so no standbys) read
  through; the ceiling is tokenizing and counting them in a Python ``Counter``. Then
  ``--queries`` exact bi-gram queries, one at a time: p50/p99.

    python bench/examples_bench.py [--bikes 150] [--docs 2000] [--queries 1000]

Not a test: figures are noisy, compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the examples package

from examples.bike_share import sql as bsql
from examples.bike_share.app import BikeShare, parse_ride
from examples.bike_share.database import ensure
from examples.bike_share.messages import BIKE_COLUMN, MIN_CYCLE, WINDOW
from examples.bike_share.rides import generate
from examples.word_count import word_count_pb2 as wc
from examples.word_count import word_count_pb2_grpc as wc_grpc
from examples.word_count.counter import Counter as WordCounter
from examples.word_count.messages import ngrams
from gazette.client import AppendService, list_journals
from gazette.consumer.shardspace import apply_request
from gazette.message import CSVRecord, Publisher, modulo_mapping
from gazette.rpc.channel import insecure_channel
from gazette.testing.consumer import ConsumerHarness
from gazette.testing.etcd import start_test_etcd

ROOT = Path(__file__).resolve().parents[1]


def _rows(bikes: int) -> list[list[str]]:
    rides, _ = generate(random.Random(3), bikes=bikes, days=30, cycles=10)
    return [r.row() for r in rides]


# --- bike-share -------------------------------------------------------------------------------


async def bike_share(etcd_url: str, root: Path, rows: list[list[str]], kind: str, pg_url: str) -> float:
    journals = (ROOT / "examples/bike_share/journals.yaml").read_text()
    shards = (ROOT / "examples/bike_share/shards.yaml").read_text()
    shards = shards.replace("value: postgres", f"value: {kind}").replace("value: sqlite", f"value: {kind}")
    shards = shards.replace("/gazette/hints/bike-share", f"/bench-hints/{kind}")  # each run its own hints
    h = ConsumerHarness(BikeShare(), journals=journals, shards="shards: []\n", etcd_url=etcd_url,
                        root=root / kind, timeout=900, app_args=["--postgres", pg_url] if pg_url else [])
    async with h:
        assert h.client is not None and h.shards is not None
        parts = await list_journals(h.client, "app.gazette.dev/message-type=bike_share.Ride")
        mapping = modulo_mapping(lambda r: r[BIKE_COLUMN].encode(), lambda: parts)
        async with AppendService(h.client) as svc:
            pub = Publisher(svc)
            for i in range(0, len(rows), 2000):
                await pub.publish_committed_many(mapping, [CSVRecord(["", *r]) for r in rows[i:i + 2000]])
        print(f"  bike-share/{kind}: {len(rows)} rides appended; shards start", file=sys.stderr)
        t0 = time.perf_counter()
        req = apply_request(shards)
        h.shard_ids = [ch.upsert.id for ch in req.changes if ch.HasField("upsert")]
        await h.shards.apply(req)
        await h.wait_serving()
        await h.read_through()
        return len(rows) / (time.perf_counter() - t0)


def _params(rows: list[list[str]]) -> list[dict[str, Any]]:
    return [parse_ride([f"00000000-0000-1000-8000-{i:012x}", *r]) for i, r in enumerate(rows)]


def direct_sqlite(rows: list[list[str]], root: Path) -> float:
    params = _params(rows)
    conn = sqlite3.connect(root / "direct.db", isolation_level="DEFERRED")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(bsql.CREATE_SQLITE)
    t0 = time.perf_counter()
    for i, p in enumerate(params):
        conn.execute(bsql.INSERT_SQLITE, p)
        conn.execute(bsql.WINDOW, {"bike": p["bike"], "keep": WINDOW})
        conn.execute(bsql.CYCLE, {"bike": p["bike"], "min": MIN_CYCLE}).fetchall()
        if i % 500 == 499:
            conn.commit()
    conn.commit()
    return len(params) / (time.perf_counter() - t0)


async def direct_postgres(rows: list[list[str]], url: str) -> float:
    params = _params(rows)
    engine = create_async_engine(url)
    try:
        async with engine.begin() as c:
            await c.execute(text("DROP TABLE IF EXISTS rides"))
            await c.execute(text(bsql.CREATE_POSTGRES))
        insert, window, cycle = text(bsql.INSERT_POSTGRES), text(bsql.WINDOW), text(bsql.CYCLE)
        t0 = time.perf_counter()
        async with engine.connect() as c:
            for i, p in enumerate(params):
                await c.execute(insert, p)
                await c.execute(window, {"bike": p["bike"], "keep": WINDOW})
                (await c.execute(cycle, {"bike": p["bike"], "min": MIN_CYCLE})).fetchall()
                if i % 500 == 499:
                    await c.commit()
            await c.commit()
        return len(params) / (time.perf_counter() - t0)
    finally:
        await engine.dispose()


# --- word-count -------------------------------------------------------------------------------


def _docs(n: int) -> list[str]:
    rng = random.Random(5)
    # Words of letters only (the tokenizer drops digits): 0..1999 spelled with a..j.
    vocab = ["".join(chr(ord("a") + int(d)) for d in str(i)) for i in range(2000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]  # Zipf-like
    return [" ".join(rng.choices(vocab, weights, k=rng.randrange(20, 61))) for _ in range(n)]


async def word_count(etcd_url: str, root: Path, docs: list[str], queries: int) -> tuple[float, list[float]]:
    journals = (ROOT / "examples/word_count/journals.yaml").read_text()
    # One process (the harness's processes share one app instance), so no hot standbys.
    shards = (ROOT / "examples/word_count/shards.yaml").read_text().replace("hot_standbys: 1", "hot_standbys: 0")
    shards = shards.replace("/gazette/hints/word-count", "/bench-hints/word-count")
    h = ConsumerHarness(WordCounter(), journals=journals, shards=shards, etcd_url=etcd_url, root=root / "wc",
                        timeout=600)
    async with h:
        channel = insecure_channel(h.processes[0].endpoint.removeprefix("http://"))
        stub = wc_grpc.NGramStub(channel)  # type: ignore[no-untyped-call]
        try:
            sem = asyncio.Semaphore(16)

            async def publish(doc: str) -> None:
                async with sem:
                    await stub.Publish(wc.PublishRequest(text=doc))

            t0 = time.perf_counter()
            await asyncio.gather(*(publish(d) for d in docs))
            await h.read_through()
            rate = len(docs) / (time.perf_counter() - t0)
            grams = sorted({g for d in docs for g in ngrams(d, 2)})
            rng = random.Random(9)
            lat = []
            for gram in rng.choices(grams, k=queries):
                q0 = time.perf_counter()
                await stub.Query(wc.QueryRequest(prefix=gram))
                lat.append(time.perf_counter() - q0)
            return rate, sorted(lat)
        finally:
            await channel.close()


def count_ceiling(docs: list[str]) -> float:
    t0 = time.perf_counter()
    c: Counter[str] = Counter()
    for d in docs:
        c.update(ngrams(d, 2))
    return len(docs) / (time.perf_counter() - t0)


async def run(a: argparse.Namespace) -> None:
    etcd = await asyncio.to_thread(start_test_etcd)
    try:
        with tempfile.TemporaryDirectory(prefix="examples-bench-") as tmp:
            root = Path(tmp)
            rows = _rows(a.bikes)
            try:
                pg_url = ensure("127.0.0.1", 5432, "postgres", "bike_share_bench", fresh=True)
            except Exception as err:  # noqa: BLE001 - the PostgreSQL rows are skipped, said why
                print(f"  no PostgreSQL ({err}): its rows are skipped", file=sys.stderr)
                pg_url = ""
            print("bike-share: rides/s through four shards (one consumer process)")
            for kind in ("sqlite", "postgres"):
                if kind == "postgres" and not pg_url:
                    continue
                got = await bike_share(etcd.url, root, rows, kind, pg_url)
                ceil = direct_sqlite(rows, root) if kind == "sqlite" else await direct_postgres(rows, pg_url)
                print(f"  {kind:<9} {got:9.0f} rides/s   direct SQL, no framework {ceil:9.0f} rides/s   "
                      f"ratio {got / ceil:.2f}")
            docs = _docs(a.docs)
            got, lat = await word_count(etcd.url, root, docs, a.queries)
            ceil = count_ceiling(docs)
            print("word-count: documents published and counted (one process, four RocksDB shards)")
            print(f"  {got:9.0f} docs/s   tokenize+count in memory {ceil:9.0f} docs/s   ratio {got / ceil:.3f}")
            print(f"  query latency over {len(lat)} exact bi-gram queries: p50 {lat[len(lat) // 2] * 1e3:.2f} ms, "
                  f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms")
    finally:
        await asyncio.to_thread(etcd.close)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bikes", type=int, default=150)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=1000)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s %(err)s", defaults={"err": ""}))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    asyncio.run(run(ap.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

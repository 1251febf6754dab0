"""Recovery-log costs, measured against the same work unrecorded, in one run.

Commits are pipelined as the consumer's transaction loop does: transaction N+1's writes are
made while N's append is in flight, and N+1 commits once N's append resolved.

* RocksDB: transactions of 100 puts (random 8-byte keys over 100k, 100-byte values) committed
  through ``RocksDBStore`` without a recorder, then with one (capture by directory scan, one
  fenced append per transaction to a real broker). Targets: recorded >= 0.5x unrecorded and
  >= 1,000 txns/s.
* SQLite: the same transactions (100 puts of random 8-byte keys over 100k, 100-byte values)
  as upserts into a key-value table through ``SQLiteStore``, likewise. Each touches ~100
  random B-tree pages: ~400 KB of WAL frames per commit, checkpointed (and the pages recorded
  again) every 4 MB of WAL.
* SQLite with 1 KiB pages (``SQLiteStore(page_size=1024)``): the same transactions; the log
  records whole pages, so each random write costs a quarter of the bytes.
* Floor: the unrecorded commit plus one append of the mean recorded batch (measured in the
  same run). Commits are one at a time, as in Gazette, so no recorder can beat it: it says how
  much of the gap is the append path rather than capture.
* Playback: the RocksDB log replayed from the start into an empty directory by the ``Player``,
  in MB/s of log, against a plain file copy of the same number of bytes. Target >= 0.5x.

Run: ``.venv/bin/python bench/recoverylog_bench.py [--txns N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gazette.client import JournalClient  # noqa: E402
from gazette.client.appender import append  # noqa: E402
from gazette.consumer.stores.rocksdb import RocksDBStore  # noqa: E402
from gazette.consumer.stores.sqlite import SQLiteStore  # noqa: E402
from gazette.journalspace import apply_request  # noqa: E402
from gazette.protocol import consumer_pb2 as pc  # noqa: E402
from gazette.recoverylog import FSMHints, Player, Recorder, take_over  # noqa: E402
from gazette.testing.cluster import Cluster  # noqa: E402
from gazette.testing.etcd import start_test_etcd, unique_prefix  # noqa: E402

LOGS = ("name: bench/recovery/\nreplication: 1\nlabels:\n- name: content-type\n"
        "  value: application/x-gazette-recoverylog\nfragment:\n  length: 67108864\n"
        "  compression_codec: NONE\n  stores: [file:///]\n  refresh_interval: 1s\nchildren:\n"
        "- name: bench/recovery/floor\n  labels:\n  - name: content-type\n    value: application/octet-stream\n"
        "- name: bench/recovery/rocks\n- name: bench/recovery/sqlite\n- name: bench/recovery/sqlite1k\n")


async def owner(client: JournalClient, log: str, directory: Path) -> Recorder:
    return await take_over(Player(client, FSMHints(log=log), str(directory)))


def rocks_txn(store: Any, rnd: random.Random) -> None:
    for _ in range(100):
        store.put(rnd.randrange(100_000).to_bytes(8, "big"), rnd.randbytes(100))


def sqlite_txn(store: Any, rnd: random.Random) -> None:
    store.conn.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                           [(rnd.randrange(100_000).to_bytes(8, "big"), rnd.randbytes(100)) for _ in range(100)])


async def append_rtt(client: JournalClient, nbytes: int, n: int = 400) -> float:
    """Median seconds of one append of ``nbytes`` (the floor a recorded commit adds: the
    transaction loop commits one at a time, as Gazette's does)."""
    data, times = os.urandom(max(1, nbytes)), []
    for _ in range(n):
        began = time.perf_counter()
        await append(client, "bench/recovery/floor", [data])
        times.append(time.perf_counter() - began)
    return statistics.median(times)


async def run_txns(store: Any, txn: Any, n: int) -> float:
    rnd = random.Random(1)
    cp = pc.Checkpoint()
    began = time.perf_counter()
    prev: Any = None
    for i in range(n):
        txn(store, rnd)  # overlaps the previous commit's append, as the transaction loop does
        if prev is not None:
            await prev
        cp.sources["in"].read_through = i
        prev = store.start_commit(None, cp, [])
        await asyncio.sleep(0)  # let the append start
    await prev
    return n / (time.perf_counter() - began)


def new_sqlite(recorder: Recorder | None, directory: Path | None, page_size: int | None = None) -> SQLiteStore:
    store = SQLiteStore(recorder, directory=None if directory is None else str(directory), page_size=page_size)
    store.conn.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
    return store


async def bench(address: str, root: Path, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with JournalClient(address) as client:
        await client.apply(apply_request(LOGS))
        plain = RocksDBStore(None, directory=str(root / "rocks-plain"))
        out["rocks_plain"] = await run_txns(plain, rocks_txn, n)
        plain.db.close()
        rec = await owner(client, "bench/recovery/rocks", root / "rocks-rec")
        store = RocksDBStore(rec)
        out["rocks_rec"] = await run_txns(store, rocks_txn, n)
        out["rocks_log_kb"] = rec.write_head / n / 1e3
        out["rocks_log_mb"] = rec.write_head / 1e6
        out["rocks_rtt"] = await append_rtt(client, rec.write_head // n)
        store.destroy()

        splain = new_sqlite(None, root / "sqlite-plain")
        out["sqlite_plain"] = await run_txns(splain, sqlite_txn, n)
        splain.destroy()
        srec = await owner(client, "bench/recovery/sqlite", root / "sqlite-rec")
        sstore = new_sqlite(srec, None)
        out["sqlite_rec"] = await run_txns(sstore, sqlite_txn, n)
        out["sqlite_rtt"] = await append_rtt(client, srec.write_head // n)
        out["sqlite_log_kb"] = srec.write_head / n / 1e3
        sstore.destroy()

        # The same with 1 KiB pages: the log records whole pages, so a random write costs a
        # quarter of the bytes.
        splain = new_sqlite(None, root / "sqlite1k-plain", 1024)
        out["sqlite1k_plain"] = await run_txns(splain, sqlite_txn, n)
        splain.destroy()
        srec = await owner(client, "bench/recovery/sqlite1k", root / "sqlite1k-rec")
        sstore = new_sqlite(srec, None, 1024)
        out["sqlite1k_rec"] = await run_txns(sstore, sqlite_txn, n)
        out["sqlite1k_rtt"] = await append_rtt(client, srec.write_head // n)
        out["sqlite1k_log_kb"] = srec.write_head / n / 1e3
        sstore.destroy()

        player = Player(client, FSMHints(log="bench/recovery/rocks"), str(root / "replay"), progress_interval=1.0)
        began = time.perf_counter()
        task = asyncio.ensure_future(player.play())
        player.finish_at_write_head()
        await task
        elapsed = time.perf_counter() - began
        log_bytes = player.write_head
        out["playback_mbs"] = log_bytes / elapsed / 1e6
        shutil.rmtree(player.dir)
    out["copy_mbs"] = await asyncio.to_thread(copy_rate, root, log_bytes)
    return out


def copy_rate(root: Path, nbytes: int) -> float:
    """MB/s of copying a file of ``nbytes`` (fsynced), the ceiling playback is compared to."""
    blob = root / "blob"
    with open(blob, "wb") as f:
        for _ in range(0, nbytes, 1 << 20):
            f.write(os.urandom(1 << 20))
    os.sync()
    began = time.perf_counter()
    shutil.copyfile(blob, root / "blob-copy")
    with open(root / "blob-copy", "rb+") as f:
        os.fsync(f.fileno())
    return os.path.getsize(blob) / (time.perf_counter() - began) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--txns", type=int, default=3000)
    a = ap.parse_args()
    etcd = start_test_etcd()
    try:
        with tempfile.TemporaryDirectory(prefix="gazette-recoverylog-bench-") as tmp, \
                Cluster(etcd.url, unique_prefix("/bench/brokers"), Path(tmp) / "cluster") as cluster:
            cluster.add_broker("local")
            r = asyncio.run(bench(cluster.address, Path(tmp), a.txns))
    finally:
        etcd.close()
    print(f"\nrecoverylog_bench: {a.txns} transactions of 100 writes each, one broker, this machine "
          f"({os.cpu_count()} cores)")
    print(f"{'workload':<46} {'figure':>14} {'ratio':>8}")
    for kind in ("rocks", "sqlite", "sqlite1k"):
        name = {"rocks": "RocksDB", "sqlite": "SQLite", "sqlite1k": "SQLite, 1 KiB pages"}[kind]
        plain, rec = r[f"{kind}_plain"], r[f"{kind}_rec"]
        print(f"{name + ' commits, unrecorded':<46} {plain:>10,.0f} t/s {'1.00':>8}")
        print(f"{name + ' commits, recorded to the log':<46} {rec:>10,.0f} t/s {rec / plain:>8.2f}  "
              f"(target >= 0.5x: {'met' if rec / plain >= 0.5 else 'missed'}; >= 1,000 t/s: "
              f"{'met' if rec >= 1000 else 'missed'})")
        floor = 1 / (1 / plain + r[f"{kind}_rtt"])
        label = f"  floor: unrecorded + one {r[f'{kind}_log_kb']:,.0f} KB append"
        print(f"{label:<46} {floor:>10,.0f} t/s {floor / plain:>8.2f}  (append {r[f'{kind}_rtt'] * 1e3:.2f} ms; "
              f"recorded reaches {rec / floor:.0%} of it)")
    label = f"playback of the RocksDB log ({r['rocks_log_mb']:.0f} MB)"
    print(f"{label:<46} {r['playback_mbs']:>9,.0f} MB/s "
          f"{r['playback_mbs'] / r['copy_mbs']:>8.2f}  (vs file copy; target >= 0.5x: "
          f"{'met' if r['playback_mbs'] / r['copy_mbs'] >= 0.5 else 'missed'})")
    print(f"{'plain file copy of the same bytes (fsynced)':<46} {r['copy_mbs']:>9,.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recovery-log costs, measured against the same work unrecorded, in one run.

Commits are pipelined as the consumer's transaction loop does: transaction N+1's writes are
made while N's append is in flight, and, the embedded stores' commits being ordered, N+1's
commit (its write batch and capture) starts while N's append is in flight too; N+2's waits
for N's.

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
* Serial floor: the unrecorded commit plus one append of the mean recorded batch (measured in
  the same run): what commits one at a time (as Gazette's loop makes them) could reach at
  best. Overlapped commits can pass it; the ratio says by how much.
* Playback: the RocksDB log replayed from the start into an empty directory by the ``Player``,
  in MB/s of log, against a plain file copy of the same number of bytes. Target >= 0.5x.

Run: ``.venv/bin/python bench/recoverylog_bench.py [--txns N] [--runs N]``. With ``--runs N``
the RocksDB commits (unrecorded, then recorded, N times in turn, each recorded run on a log of
its own) are reported as the median of the N runs; SQLite and playback run once.

    .venv/bin/python bench/recoverylog_bench.py --runs 5 --builds interpreted,compiled,compiled+uvloop

With ``--builds`` the bench runs once per build (``_builds.py``): the stores, the recorder and
the player run in each build's python on its event loop, the broker under the same build.
There is no peer: the same work unrecorded (and a plain file copy, for playback) is measured
in each build's child, as its ceiling. The bench's process tunes CPython's collector
(``gazette.gctune.tune()``) as a consumer process does; ``GAZETTE_GC=default`` does not.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _builds  # noqa: E402

if not os.environ.get(_builds.BUILD_ENV) or importlib.util.find_spec("gazette") is None:
    # gazette from the checkout the bench is in, as ever; but never in a --builds child,
    # whose gazette must be its build's installed one (the compiled wheel's).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gazette import gctune  # noqa: E402
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


def rocks_log(run: int) -> str:
    """The recovery log of the ``run``-th RocksDB run (from 0): each its own, so no run
    replays another's."""
    return "bench/recovery/rocks" + (f"-{run + 1}" if run else "")


def logs(runs: int) -> str:
    """LOGS with the further runs' RocksDB logs (children are listed in name order)."""
    first = "- name: bench/recovery/rocks\n"
    more = "".join(f"- name: {name}\n" for name in sorted(rocks_log(i) for i in range(1, runs)))
    return LOGS.replace(first, first + more)


async def owner(client: JournalClient, log: str, directory: Path) -> Recorder:
    return await take_over(Player(client, FSMHints(log=log), str(directory)))


def rocks_txn(store: Any, rnd: random.Random) -> None:
    for _ in range(100):
        store.put(rnd.randrange(100_000).to_bytes(8, "big"), rnd.randbytes(100))


def sqlite_txn(store: Any, rnd: random.Random) -> None:
    store.conn.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                           [(rnd.randrange(100_000).to_bytes(8, "big"), rnd.randbytes(100)) for _ in range(100)])


async def append_rtt(client: JournalClient, nbytes: int, n: int = 400) -> float:
    """Median seconds of one append of ``nbytes`` (what a recorded commit adds when commits
    are made one at a time, as Gazette's loop makes them)."""
    data, times = os.urandom(max(1, nbytes)), []
    for _ in range(n):
        began = time.perf_counter()
        await append(client, "bench/recovery/floor", [data])
        times.append(time.perf_counter() - began)
    return statistics.median(times)


async def run_txns(store: Any, txn: Any, n: int) -> float:
    """Transactions/s of ``n`` transactions committed as the transaction loop commits them: a
    transaction's writes overlap the previous commit; its commit starts once fewer than
    ``depth`` commits are unresolved (two for a store whose commits are ordered, as the
    embedded stores' are: its write and capture then overlap the previous commit's append)."""
    rnd = random.Random(1)
    cp = pc.Checkpoint()
    depth = 2 if getattr(store, "ordered_commits", False) else 1
    pending: collections.deque[Any] = collections.deque()
    began = time.perf_counter()
    for i in range(n):
        txn(store, rnd)
        while len(pending) >= depth:  # an ordered store's commits resolve in order
            await pending.popleft()
        cp.sources["in"].read_through = i
        pending.append(store.start_commit(None, cp, []))
        await asyncio.sleep(0)  # let the append start
    for f in pending:
        await f
    return n / (time.perf_counter() - began)


def new_sqlite(recorder: Recorder | None, directory: Path | None, page_size: int | None = None) -> SQLiteStore:
    store = SQLiteStore(recorder, directory=None if directory is None else str(directory), page_size=page_size)
    store.conn.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
    return store


async def bench(address: str, root: Path, n: int, runs: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with JournalClient(address) as client:
        await client.apply(apply_request(logs(runs)))
        plains, recs = [], []
        for i in range(runs):  # in turn, so that each pair is measured moments apart
            suffix = f"-{i + 1}" if i else ""
            plain = RocksDBStore(None, directory=str(root / f"rocks-plain{suffix}"))
            plains.append(await run_txns(plain, rocks_txn, n))
            plain.db.close()
            rec = await owner(client, rocks_log(i), root / f"rocks-rec{suffix}")
            store = RocksDBStore(rec)
            recs.append(await run_txns(store, rocks_txn, n))
            if i == runs - 1:
                out["rocks_log_kb"] = rec.write_head / n / 1e3
                out["rocks_rtt"] = await append_rtt(client, rec.write_head // n)
            if i == 0:  # the log played back below
                out["rocks_log_mb"] = rec.write_head / 1e6
            store.destroy()
        out["rocks_plain"] = statistics.median(plains)
        out["rocks_rec"] = statistics.median(recs)
        out["rocks_plain_runs"], out["rocks_rec_runs"] = plains, recs

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


RECORDED_BAR = 0.5  # the bars (32, native speed): of unrecorded, RocksDB
RECORDED_RATE_BAR = 1500.0  # txns/s recorded, RocksDB
ROCKS_RECORDED = "RocksDB commits, recorded to the log"


def native_acceptance(c: _builds.Combined) -> list[str]:
    """Per build: recorded RocksDB commits (median of --runs) >= 0.5x unrecorded (the same
    build's) and >= 1,500 txns/s."""
    runs = next(iter(c.extra.values()))["runs"]
    lines = []
    for b in c.builds:
        v, f = c.value(ROCKS_RECORDED, b.name), c.of_ceiling(ROCKS_RECORDED, b.name)
        if v is None or f is None:
            continue
        lines.append(f"  {b.name:<19} RocksDB recorded, median of {runs}: {f:.2f}x unrecorded "
                     + ("ok" if f >= RECORDED_BAR else f"BELOW {RECORDED_BAR}x")
                     + f"; {v:,.0f} t/s " + ("ok" if v >= RECORDED_RATE_BAR
                                             else f"BELOW {RECORDED_RATE_BAR:,.0f}"))
    if runs < 5:
        lines.append(f"  (the bar is the median of 5 runs: this run had --runs {runs})")
    return lines


def figures(r: dict[str, Any]) -> list[_builds.Figure]:
    """The rows for a ``--builds`` parent: each recorded store against the same store
    unrecorded (its ceiling), playback against a file copy."""
    F = _builds.Figure
    out = []
    for kind, name in (("rocks", "RocksDB"), ("sqlite", "SQLite"), ("sqlite1k", "SQLite, 1 KiB pages")):
        out.append(F(f"{name} commits, unrecorded", "txns/s", r[f"{kind}_plain"]))
        out.append(F(f"{name} commits, recorded to the log", "txns/s", r[f"{kind}_rec"],
                     ceiling=r[f"{kind}_plain"]))
    out.append(F("playback of the RocksDB log", "MB/s", r["playback_mbs"], ceiling=r["copy_mbs"]))
    out.append(F("plain file copy of the same bytes", "MB/s", r["copy_mbs"], compare=False))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--txns", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=1,
                    help="RocksDB runs (unrecorded and recorded in turn); the median is reported")
    _builds.add_arguments(ap)
    a = ap.parse_args()
    if _builds.is_parent(a):
        return _builds.run_builds(
            a, sys.argv[1:], __file__, peer_name=None,
            ceiling_name="unrecorded / file copy", acceptance=native_acceptance,
            peer_note="this bench has none: the unrecorded store is each build's ceiling")
    gctune.tune()  # the stores and recorder run here as in a consumer process, which tunes it
    etcd = start_test_etcd()
    try:
        with tempfile.TemporaryDirectory(prefix="gazette-recoverylog-bench-") as tmp, \
                Cluster(etcd.url, unique_prefix("/bench/brokers"), Path(tmp) / "cluster") as cluster:
            cluster.add_broker("local")
            # On the build's loop in a --builds child (asyncio.run otherwise).
            r = _builds.run(bench(cluster.address, Path(tmp), a.txns, a.runs))
    finally:
        etcd.close()
    print(f"\nrecoverylog_bench: {a.txns} transactions of 100 writes each, one broker, this machine "
          f"({os.cpu_count()} cores)")
    if a.runs > 1:
        print(f"RocksDB: the median of {a.runs} runs; unrecorded "
              f"{', '.join(f'{x:,.0f}' for x in r['rocks_plain_runs'])} t/s, recorded "
              f"{', '.join(f'{x:,.0f}' for x in r['rocks_rec_runs'])} t/s")
    print(f"{'workload':<46} {'figure':>14} {'ratio':>8}")
    for kind in ("rocks", "sqlite", "sqlite1k"):
        name = {"rocks": "RocksDB", "sqlite": "SQLite", "sqlite1k": "SQLite, 1 KiB pages"}[kind]
        plain, rec = r[f"{kind}_plain"], r[f"{kind}_rec"]
        print(f"{name + ' commits, unrecorded':<46} {plain:>10,.0f} t/s {'1.00':>8}")
        print(f"{name + ' commits, recorded to the log':<46} {rec:>10,.0f} t/s {rec / plain:>8.2f}  "
              f"(target >= 0.5x: {'met' if rec / plain >= 0.5 else 'missed'}; >= 1,000 t/s: "
              f"{'met' if rec >= 1000 else 'missed'})")
        floor = 1 / (1 / plain + r[f"{kind}_rtt"])
        label = f"  serial: unrecorded + one {r[f'{kind}_log_kb']:,.0f} KB append"
        print(f"{label:<46} {floor:>10,.0f} t/s {floor / plain:>8.2f}  (append {r[f'{kind}_rtt'] * 1e3:.2f} ms; "
              f"recorded, overlapped, is {rec / floor:.0%} of it)")
    label = f"playback of the RocksDB log ({r['rocks_log_mb']:.0f} MB)"
    print(f"{label:<46} {r['playback_mbs']:>9,.0f} MB/s "
          f"{r['playback_mbs'] / r['copy_mbs']:>8.2f}  (vs file copy; target >= 0.5x: "
          f"{'met' if r['playback_mbs'] / r['copy_mbs'] >= 0.5 else 'missed'})")
    print(f"{'plain file copy of the same bytes (fsynced)':<46} {r['copy_mbs']:>9,.0f} MB/s")
    if a.json_out:
        _builds.write_result(a.json_out, figures(r), extra={"runs": a.runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())

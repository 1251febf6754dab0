"""The cost of capturing one RocksDB commit into a recorder, by each way ``DirCapture`` has.

Commits of 100 puts (random 8-byte keys over 100k, 100-byte values) are written to a
``RocksDBStore`` given a recorder (no broker: batches are taken and dropped), and each commit's
``capture()`` is timed: with the directory's inotify watch (the usual commit shows only the
WAL's growth, read without a scan) and without it (a scan of the directory with the
stable-MANIFEST rule every time). Prints medians and means in microseconds, and their ratio.

Run: ``.venv/bin/python bench/capture_bench.py [--commits N]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rocksdict  # noqa: E402

from gazette.consumer.stores.rocksdb import RocksDBStore  # noqa: E402
from gazette.recoverylog import FSM, Recorder  # noqa: E402
from gazette.recoverylog import capture as capture_module  # noqa: E402


def run(commits: int, watched: bool) -> list[float]:
    real_watch = capture_module._watch
    if not watched:
        capture_module._watch = lambda directory: None  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="gazette-capture-bench-") as tmp:
            rec = Recorder(None, "bench/log", FSM("bench/log"), 1, tmp)  # type: ignore[arg-type]
            store = RocksDBStore(rec)
            assert store.capture is not None
            rnd = random.Random(1)
            times = []
            for _ in range(commits):
                wb = rocksdict.WriteBatch(raw_mode=True)
                for _ in range(100):
                    wb.put(rnd.randrange(100_000).to_bytes(8, "big"), rnd.randbytes(100))
                store.db.write(wb, store._write_opts)
                began = time.perf_counter()
                store.capture.capture()
                times.append(time.perf_counter() - began)
                rec.take_batch()
            store.destroy()
            return times
    finally:
        capture_module._watch = real_watch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=4000)
    a = ap.parse_args()
    # Interleaved rounds: this machine's speed drifts; compare within a round.
    rows = []
    for _ in range(2):
        for watched in (False, True):
            t = run(a.commits, watched)
            rows.append((watched, statistics.median(t) * 1e6, statistics.mean(t) * 1e6))
    print(f"\ncapture_bench: {a.commits} commits of 100 puts, RocksDBStore with a recorder")
    print(f"{'capture':<40} {'median us':>10} {'mean us':>10}")
    for watched, med, mean in rows:
        print(f"{'inotify: appends read, no scan' if watched else 'scan every commit':<40} {med:>10.1f} {mean:>10.1f}")
    scan = statistics.median(m for w, m, _ in rows if not w)
    watch = statistics.median(m for w, m, _ in rows if w)
    print(f"median of medians: scan {scan:.1f} us, watched {watch:.1f} us ({watch / scan:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

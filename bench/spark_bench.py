"""format("gazette") beside Spark's own JSON reader, over the same NDJSON bytes.

Starts an etcd and a broker (``gazette.testing``) with a file store, appends ``--rows`` JSON
messages of about 100 bytes to two journals (one uncompressed, one gzip; 4 MiB fragments, so
several per journal), waits until their fragments are persisted, and then, in one local Spark
session (local[2]), alternates ``--rounds`` times:

* ``spark.read.json`` with an explicit schema over the persisted fragment files themselves
  (``.raw`` and ``.gz``: Spark decompresses gzip by extension), and
* ``spark.read.format("gazette")`` with the same schema (message fields only),
  bounded to the same persisted bytes (``end_offset``) and reading them from the file store,
  in ``uncommitted`` mode and in ``committed`` mode (messages are published in transactions of
  100 with an ACK each, so the Sequencer does real work),

each materialised by the ``noop`` sink: per codec, and committed mode over both journals.
Prints per variant the median seconds and rows/s, and the cost ratio gazette/json over the
same bytes (targets: <= 1.3 uncommitted, moonshot <= 1.0; <= 1.5 committed). Spark's JSON
reader also returns the ACK lines (as rows of nulls); gazette's decoded modes drop them.

    python bench/spark_bench.py [--rows 1200000] [--rounds 3]

Not a test: figures are noisy, compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gazette.client.sync import SyncJournalClient  # noqa: E402
from gazette.message.uuid import ACK_TXN, CONTINUE_TXN, build_uuid  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402
from gazette.testing.cluster import Cluster  # noqa: E402
from gazette.testing.etcd import start_test_etcd, unique_prefix  # noqa: E402
from gazette.testing.eventually import eventually_sync  # noqa: E402

SCHEMA = "id long, customer string, amount double, kind string"
JOURNALS = {"bench/spark/raw": pb.NONE, "bench/spark/gz": pb.GZIP}
FRAGMENT = 4 << 20
TXN = 100


def _lines(count: int, seed: int) -> list[bytes]:
    producer = bytes([seed]) * 6
    out = []
    clock = 1000
    for i in range(count):
        clock += 1
        if i % TXN == TXN - 1:
            out.append(json.dumps({"UUID": str(build_uuid(producer, clock, ACK_TXN))}).encode()
                       + b"\n")
            continue
        doc = {"UUID": str(build_uuid(producer, clock, CONTINUE_TXN)), "id": i,
               "customer": f"customer-{i % 5000:05d}", "amount": round(i * 0.37 % 1000, 2),
               "kind": ("order", "refund", "click")[i % 3]}
        out.append(json.dumps(doc).encode() + b"\n")
    return out


def _setup(client: SyncJournalClient, rows: int) -> None:
    for name, codec in JOURNALS.items():
        spec = pb.JournalSpec(name=name, replication=1)
        spec.labels.labels.add(name="content-type", value="application/x-ndjson")
        spec.fragment.length = FRAGMENT
        spec.fragment.compression_codec = codec  # type: ignore[assignment]
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.FromSeconds(1)
        req = pb.ApplyRequest()
        req.changes.add(upsert=spec)
        client.apply(req)
        lines = _lines(rows // len(JOURNALS), seed=len(name))
        for i in range(0, len(lines), 5000):
            client.append(name, b"".join(lines[i: i + 5000]))


def _persisted(client: SyncJournalClient, file_root: Path
               ) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Each journal's persisted end, and its fragment files up to it (all persisted but the
    spool still open, whose content the bench leaves out)."""
    ends: dict[str, int] = {}
    files: dict[str, list[str]] = {}
    for name in JOURNALS:
        frags = sorted(client.list_fragments(name).fragments, key=lambda f: f.spec.begin)
        done = [f for f in frags if f.spec.backing_store]
        ends[name] = done[-1].spec.end if done else 0
        files[name] = [str(p) for f in done
                       for p in (file_root / name).glob(f"{f.spec.begin:016x}-*")]
    return ends, files


def _timed(df: Any) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from gazette.spark import local_session

    etcd = start_test_etcd()
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                Cluster(etcd.url, unique_prefix("/bench/spark"), Path(tmp) / "cluster") as cluster:
            cluster.add_broker()
            with SyncJournalClient(cluster.address) as client:
                print(f"appending {args.rows:,} messages to {len(JOURNALS)} journals ...",
                      flush=True)
                _setup(client, args.rows)

                def ready() -> tuple[dict[str, int], dict[str, list[str]]] | None:
                    ends, files = _persisted(client, cluster.file_root)
                    return (ends, files) if all(len(f) >= 4 for f in files.values()) else None

                ends, files = eventually_sync(ready, "fragments persisted", 120.0)
            for name in JOURNALS:
                size = sum(Path(f).stat().st_size for f in files[name])
                print(f"{name}: {len(files[name])} persisted fragments, {size / 1e6:.1f} MB "
                      f"stored, {ends[name] / 1e6:.1f} MB of content", flush=True)

            spark = local_session("gazette-bench", cores=2, driver_memory="4g",
                                  scratch=str(Path(tmp) / "spark"))
            try:
                def gazette(mode: str, selector: str) -> Any:
                    return (spark.read.format("gazette").option("broker", cluster.address)
                            .option("selector", selector).option("mode", mode)
                            .option("file_root", str(cluster.file_root))
                            .option("end_offset", json.dumps(ends))
                            .schema(SCHEMA).load())

                every = [f for fs in files.values() for f in fs]
                variants = {
                    "json raw": lambda: spark.read.schema(SCHEMA).json(files["bench/spark/raw"]),
                    "gazette raw": lambda: gazette("uncommitted", "name=bench/spark/raw"),
                    "json gzip": lambda: spark.read.schema(SCHEMA).json(files["bench/spark/gz"]),
                    "gazette gzip": lambda: gazette("uncommitted", "name=bench/spark/gz"),
                    "json both": lambda: spark.read.schema(SCHEMA).json(every),
                    "gazette committed both": lambda: gazette("committed", "prefix=bench/spark/"),
                }
                rows = {name: make().count() for name, make in variants.items()}  # Warm-up.
                times: dict[str, list[float]] = {name: [] for name in variants}
                for r in range(args.rounds):
                    for name, make in variants.items():
                        times[name].append(_timed(make()))
                    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                        f"{n} {t[-1]:.2f}s" for n, t in times.items()), flush=True)
            finally:
                spark.stop()
    finally:
        etcd.close()

    print()
    print("| variant | rows | median s | rows/s | cost vs spark.read.json of the same bytes |")
    print("|---|---|---|---|---|")
    for name, t in times.items():
        med = statistics.median(t)
        base = statistics.median(times["json " + name.split()[-1]])
        print(f"| {name} | {rows[name]:,} | {med:.2f} | {rows[name] / med:,.0f} | "
              f"{med / base:.2f}x |")
    print()
    print("targets: uncommitted <= 1.3x (moonshot <= 1.0x), committed <= 1.5x "
          "(committed rows: the ACKs dropped)")


if __name__ == "__main__":
    main()

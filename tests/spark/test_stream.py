"""readStream.format("gazette"): availableNow micro-batches, restarts from a checkpoint, new
journals, and committed mode exactly once across batch boundaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gazette.client.sync import SyncJournalClient
from gazette.testing.cluster import Cluster
from gazette.testing.eventually import eventually_sync

from .support import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, append_lines, apply_journal, doc_lines

SCHEMA = "_journal string, _offset long, n long"


def _run_available_now(spark: Any, address: str, selector: str, out: Path, checkpoint: Path,
                       **options: str) -> None:
    reader = (spark.readStream.format("gazette").option("broker", address)
              .option("selector", selector))
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.schema(SCHEMA).load().writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None


def _ns(spark: Any, out: Path) -> list[tuple[str, int]]:
    return sorted((r._journal, r.n) for r in spark.read.parquet(str(out)).collect())


def test_available_now_and_restart_see_every_message_once(spark: Any, cluster: Cluster,
                                                          spark_dir: Path) -> None:
    cluster.add_broker()
    p = b"\x01" * 6
    out, ckpt = spark_dir / "out", spark_dir / "ckpt"
    with SyncJournalClient(cluster.address) as client:
        apply_journal(client, "spark/stream/a", length=1024)  # A fragment per append.
        append_lines(client, "spark/stream/a",
                     doc_lines((p, 10 + i, OUTSIDE_TXN, {"n": i}) for i in range(300)))
        # Several micro-batches: at most one fragment's worth of bytes each.
        _run_available_now(spark, cluster.address, "prefix=spark/stream/", out, ckpt,
                           max_bytes_per_trigger="4096")
        assert _ns(spark, out) == [("spark/stream/a", i) for i in range(300)]
        assert len(list((ckpt / "commits").iterdir())) >= 3  # Micro-batches, not one.

        append_lines(client, "spark/stream/a",
                     doc_lines((p, 1000 + i, OUTSIDE_TXN, {"n": 300 + i}) for i in range(50)))
        apply_journal(client, "spark/stream/b")  # A journal the selector picks up later.
        append_lines(client, "spark/stream/b",
                     doc_lines((p, 5000 + i, OUTSIDE_TXN, {"n": i}) for i in range(20)))
        _run_available_now(spark, cluster.address, "prefix=spark/stream/", out, ckpt)
    got = _ns(spark, out)
    assert got == sorted([("spark/stream/a", i) for i in range(350)]
                         + [("spark/stream/b", i) for i in range(20)])


def test_committed_stream_is_exactly_once_across_batches_and_restarts(
        spark: Any, cluster: Cluster, spark_dir: Path) -> None:
    cluster.add_broker()
    a, b = b"\xaa" * 6, b"\xbb" * 6
    out, ckpt = spark_dir / "out", spark_dir / "ckpt"
    journal = "spark/cstream/a"
    with SyncJournalClient(cluster.address) as client:
        apply_journal(client, journal)
        # a's transaction is open when the first query ends; b commits one of its own.
        append_lines(client, journal, doc_lines([
            (a, 10, CONTINUE_TXN, {"n": 1}), (b, 10, CONTINUE_TXN, {"n": 2}),
            (a, 11, CONTINUE_TXN, {"n": 3}), (b, 11, ACK_TXN, {}),
        ]), per_append=1)
        _run_available_now(spark, cluster.address, f"name={journal}", out, ckpt,
                           mode="committed")
        assert _ns(spark, out) == [(journal, 2)]
        # The restart resumes with a's open transaction; b's duplicate is dropped; a commits.
        append_lines(client, journal, doc_lines([
            (b, 10, CONTINUE_TXN, {"n": 2}), (a, 12, CONTINUE_TXN, {"n": 4}),
            (a, 13, ACK_TXN, {}), (b, 12, OUTSIDE_TXN, {"n": 5}),
        ]), per_append=1)
        _run_available_now(spark, cluster.address, f"name={journal}", out, ckpt,
                           mode="committed")
    assert _ns(spark, out) == [(journal, n) for n in (1, 2, 3, 4, 5)]


def test_processing_time_trigger_sees_appends_as_they_come(spark: Any, cluster: Cluster) -> None:
    cluster.add_broker()
    p = b"\x02" * 6
    with SyncJournalClient(cluster.address) as client:
        apply_journal(client, "spark/live/a")
        append_lines(client, "spark/live/a", doc_lines((p, 10 + i, OUTSIDE_TXN, {"n": i})
                                                       for i in range(10)))
        query = (spark.readStream.format("gazette").option("broker", cluster.address)
                 .option("selector", "prefix=spark/live/").schema(SCHEMA).load()
                 .writeStream.format("memory").queryName("live_a")
                 .trigger(processingTime="1 second").start())
        try:
            def count() -> int | None:
                n: int = spark.sql("select count(*) from live_a").first()[0]
                return n if n >= want else None

            want = 10
            eventually_sync(count, "the first 10 rows", 120.0)
            # Content appended while the query runs (not yet persisted: read from the broker).
            append_lines(client, "spark/live/a", doc_lines((p, 100 + i, OUTSIDE_TXN, {"n": 10 + i})
                                                           for i in range(5)))
            want = 15
            eventually_sync(count, "the appended rows", 120.0)
        finally:
            query.stop()
    rows = sorted(r.n for r in spark.sql("select n from live_a").collect())
    assert rows == list(range(15))

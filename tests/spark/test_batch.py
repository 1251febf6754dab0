"""format("gazette") batch reads against a real broker and a real local Spark."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gazette.client.journal_client import JournalClient
from gazette.client.sync import SyncJournalClient
from gazette.message import JSONFraming, TypedMessage
from gazette.message.reading import read_committed, read_uncommitted
from gazette.message.uuid import build_uuid, get_flags
from gazette.protocol import protocol_pb2 as pb
from gazette.spark import schema_of
from gazette.testing.cluster import Cluster

from .support import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    append_lines,
    apply_journal,
    cluster_root,
    doc_lines,
    wait_persisted,
)

CODECS = {"none": pb.NONE, "gzip": pb.GZIP, "snappy": pb.SNAPPY, "zstd": pb.ZSTANDARD}
SCHEMA = "_journal string, _offset long, _uuid string, _producer string, n long, name string"


def _docs(count: int, producer: bytes = b"\x01\x02\x03\x04\x05\x06") -> list[bytes]:
    return doc_lines((producer, 1000 + i, OUTSIDE_TXN, {"n": i, "name": f"doc-{i}" * (i % 7)})
                     for i in range(count))


async def _direct(address: str, selector: str, committed: bool = False) -> list[tuple[Any, ...]]:
    """What the client reads: (journal, offset, uuid, n, name) of every message (committed:
    every non-ACK message)."""
    client = JournalClient(address)
    out = []
    try:
        read = read_committed if committed else read_uncommitted
        async for env in read(client, selector, block=False):
            doc = env.message.doc
            if committed and get_flags(env.message.get_uuid()) == ACK_TXN:
                continue
            out.append((env.journal, env.begin, doc["UUID"], doc.get("n"), doc.get("name")))
    finally:
        await client.close()
    return sorted(out)


def _spark_rows(spark: Any, address: str, selector: str, **options: str) -> list[tuple[Any, ...]]:
    reader = spark.read.format("gazette").option("broker", address).option("selector", selector)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.schema(SCHEMA).load()
    return sorted((r._journal, r._offset, r._uuid, r.n, r.name) for r in df.collect())


def test_batch_read_equals_the_client_for_every_codec(spark: Any, cluster: Cluster) -> None:
    cluster.add_broker()
    with SyncJournalClient(cluster.address) as client:
        for name, codec in CODECS.items():
            journal = f"spark/codecs/{name}"
            apply_journal(client, journal, codec=codec)
            append_lines(client, journal, _docs(900))
        for name in CODECS:
            wait_persisted(client, f"spark/codecs/{name}", 3)
        # Content newer than any store: the spool still open at the broker.
        for name in CODECS:
            append_lines(client, f"spark/codecs/{name}", _docs(3, b"\x09" * 6))
    expect = asyncio.run(_direct(cluster.address, "prefix=spark/codecs/"))
    assert len(expect) == 903 * len(CODECS)
    # Stores read directly (file_root given) and through the brokers (not given).
    direct = _spark_rows(spark, cluster.address, "prefix=spark/codecs/",
                         file_root=cluster_root(cluster))
    assert direct == expect
    proxied = _spark_rows(spark, cluster.address, "prefix=spark/codecs/", partition_bytes="4096")
    assert proxied == expect


def test_batch_read_of_s3_fragments_by_signed_url(spark: Any, cluster: Cluster, s3_server: str,
                                                  s3_bucket: str) -> None:
    cluster.add_broker()
    store = (f"s3://{s3_bucket}/frags/?endpoint={quote(s3_server, safe='')}&region=us-east-1")
    with SyncJournalClient(cluster.address) as client:
        for name, codec in (("gzod", pb.GZIP_OFFLOAD_DECOMPRESSION), ("zstd", pb.ZSTANDARD)):
            apply_journal(client, f"spark/s3/{name}", codec=codec, store=store)
            append_lines(client, f"spark/s3/{name}", _docs(600))
        for name in ("gzod", "zstd"):
            wait_persisted(client, f"spark/s3/{name}", 2)
    expect = asyncio.run(_direct(cluster.address, "prefix=spark/s3/"))
    assert len(expect) == 1200
    assert _spark_rows(spark, cluster.address, "prefix=spark/s3/") == expect


def test_committed_mode_drops_what_read_committed_drops(spark: Any, cluster: Cluster) -> None:
    cluster.add_broker()
    a, b, c = b"\xaa" * 6, b"\xbb" * 6, b"\xcc" * 6
    msgs = [
        (a, 10, CONTINUE_TXN, {"n": 1}), (b, 10, CONTINUE_TXN, {"n": 2}),
        (a, 11, CONTINUE_TXN, {"n": 3}), (a, 12, ACK_TXN, {}),          # a commits 1, 3
        (b, 11, CONTINUE_TXN, {"n": 4}), (b, 10, ACK_TXN, {}),          # b commits 2, not 4
        (a, 11, CONTINUE_TXN, {"n": 5}),                                 # duplicate of a@11
        (c, 20, OUTSIDE_TXN, {"n": 6}), (c, 20, OUTSIDE_TXN, {"n": 7}),  # c: 7 is a duplicate
        (b, 12, CONTINUE_TXN, {"n": 8}), (b, 13, CONTINUE_TXN, {"n": 9}),
        (b, 12, ACK_TXN, {}),                                            # b commits 8, not 9
        (a, 13, CONTINUE_TXN, {"n": 10}),                                # never acknowledged
    ]
    lines = doc_lines(msgs)
    with SyncJournalClient(cluster.address) as client:
        apply_journal(client, "spark/committed/one", length=1024)
        append_lines(client, "spark/committed/one", lines, per_append=2)
        # A long transaction spanning many fragments and blocks, committed at the end.
        long = [(a, 100 + i, CONTINUE_TXN, {"n": 1000 + i}) for i in range(3000)]
        long.append((a, 100 + 3000, ACK_TXN, {}))
        apply_journal(client, "spark/committed/two", length=8 << 10)
        append_lines(client, "spark/committed/two", doc_lines(long), per_append=100)
    expect = asyncio.run(_direct(cluster.address, "prefix=spark/committed/", committed=True))
    got = _spark_rows(spark, cluster.address, "prefix=spark/committed/", mode="committed",
                      block_bytes="4096")
    assert [r[3] for r in got if r[0].endswith("one")] == [1, 2, 3, 6, 8]
    assert got == expect
    assert len(got) == 5 + 3000
    # Uncommitted mode: every message as read, ACKs (no fields) included.
    everything = _spark_rows(spark, cluster.address, "name=spark/committed/one")
    assert [r[3] for r in everything] == [1, 2, 3, None, 4, None, 5, 6, 7, 8, 9, None, 10]


def test_raw_mode_and_inferred_schema(spark: Any, cluster: Cluster) -> None:
    cluster.add_broker()
    lines = _docs(20)
    with SyncJournalClient(cluster.address) as client:
        apply_journal(client, "spark/raw/one")
        append_lines(client, "spark/raw/one", lines)
    df = (spark.read.format("gazette").option("broker", cluster.address)
          .option("selector", "name=spark/raw/one").option("mode", "raw").load())
    assert df.columns == ["_journal", "_offset", "_value"]
    rows = sorted(df.collect(), key=lambda r: r._offset)
    assert [bytes(r._value) + b"\n" for r in rows] == lines
    assert rows[1]._offset == len(lines[0])
    inferred = (spark.read.format("gazette").option("broker", cluster.address)
                .option("selector", "name=spark/raw/one").load())
    assert inferred.columns == ["_journal", "_offset", "_uuid", "_producer", "_publish_time",
                                "n", "name"]
    first = inferred.orderBy("_offset").first()
    assert first is not None and first.n == 0 and first._producer == "010203040506"
    assert json.loads(lines[0])["UUID"] == first._uuid


class _Ride(TypedMessage):
    n: int
    name: str
    tags: list[str] = []
    score: float | None = None


def test_a_typed_messages_schema_reads_its_journal(spark: Any, cluster: Cluster) -> None:
    """``schema_of(T)`` gives Spark the typed message's fields: rows equal the messages
    read-committed decodes as ``T`` (arrays, optional fields and the UUID included)."""
    cluster.add_broker()
    producer = b"\x07" * 6
    msgs = []
    for i in range(40):
        m = _Ride(n=i, name=f"ride-{i}", tags=["t"] * (i % 3), score=None if i % 4 else i / 2)
        m.set_uuid(build_uuid(producer, 5000 + i, OUTSIDE_TXN))  # type: ignore[arg-type]
        msgs.append(m)
    with SyncJournalClient(cluster.address) as client:
        apply_journal(client, "spark/typed/one")
        append_lines(client, "spark/typed/one", [JSONFraming().marshal(m) for m in msgs],
                     per_append=7)

    async def direct() -> list[_Ride]:
        client = JournalClient(cluster.address)
        try:
            return [e.message async for e in
                    read_committed(client, "spark/typed/one", _Ride, block=False)]
        finally:
            await client.close()

    assert asyncio.run(direct()) == msgs
    df = (spark.read.format("gazette").option("broker", cluster.address)
          .option("selector", "name=spark/typed/one").option("mode", "committed")
          .schema(schema_of(_Ride)).load())
    rows = sorted(df.collect(), key=lambda r: r._offset)
    assert [(r._uuid, r.n, r.name, list(r.tags), r.score) for r in rows] == \
        [(m.uuid, m.n, m.name, m.tags, m.score) for m in msgs]


def test_bad_options_and_an_unreachable_broker_say_what_is_wrong(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="option 'mode': must be raw, uncommitted or committed"):
        (spark.read.format("gazette").option("selector", "prefix=a/").option("mode", "bogus")
         .schema(SCHEMA).load().collect())
    with pytest.raises(Exception, match="cannot reach a Gazette broker at 'http://127.0.0.1:1'"):
        (spark.read.format("gazette").option("selector", "prefix=a/")
         .option("broker", "http://127.0.0.1:1").schema(SCHEMA).load().collect())
    with pytest.raises(Exception, match="option 'selector': 'prefix=a' is not a valid selector"):
        spark.read.format("gazette").option("selector", "prefix=a").schema(SCHEMA).load().collect()

"""word-count end to end: two counter processes (``examples.word_count.counter:Counter``), four
shards on RocksDB with hot standbys, documents published through ``wordcountctl publish`` to
either process, and the model queried through either: every bi-gram counted exactly, exact
queries proxied to the owning shard, and ``--shard`` scans that together hold the corpus. And
the one-command demo (``python -m examples.word_count.demo``) runs end to end."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import pytest
from consumer_support import example_run, read_through_sources

from examples.word_count import demo
from examples.word_count import word_count_pb2 as wc
from examples.word_count import word_count_pb2_grpc as wc_grpc
from examples.word_count.messages import ngrams
from gazette.client import JournalClient
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import Cluster, http_status

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "word_count"
SHARDS = [f"shard-00{i}" for i in range(4)]
DOCS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!",
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
]


async def _ctl(endpoint: str, *args: str, stdin: str | None = None) -> str:
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "examples.word_count.wordcountctl", "--consumer.address", endpoint,
                         *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _parse(out: str) -> dict[str, int]:
    return {gram: int(n) for gram, n in (line.rsplit("\t", 1) for line in out.splitlines())}


@pytest.mark.timeout(300)
async def test_word_count_counts_a_corpus_exactly(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_broker("zone-a")
    async with example_run(cluster, tmp_path, EXAMPLE, "examples.word_count.counter:Counter") as run:
        endpoints = run.endpoints
        expected: Counter[str] = Counter()
        for i, doc in enumerate(DOCS):
            await _ctl(endpoints[i % 2], "publish", stdin=doc)
            expected.update(ngrams(doc, 2))
        doc_file = tmp_path / "doc.txt"
        doc_file.write_text(DOCS[0])
        await _ctl(endpoints[1], "publish", "--file", str(doc_file))
        expected.update(ngrams(DOCS[0], 2))

        async with JournalClient(cluster.broker.address) as client:
            await read_through_sources(client, endpoints[0], {s: f"examples/word-count/deltas/part-00{i}"
                                                              for i, s in enumerate(SHARDS)})

        # Each shard's scan: together they hold the corpus exactly, each n-gram in one shard.
        scanned: dict[str, int] = {}
        for shard in SHARDS:
            got = _parse(await _ctl(endpoints[1], "query", "--shard", shard))
            assert not scanned.keys() & got.keys()
            scanned.update(got)
        assert scanned == dict(expected)

        # Exact n-grams through either process: the owning shard answers (proxied when remote).
        assert _parse(await _ctl(endpoints[0], "query", "--prefix", "the fox")).get("the fox") == expected["the fox"]
        for ep in endpoints:
            channel = insecure_channel(ep.removeprefix("http://"))
            try:
                stub = wc_grpc.NGramStub(channel)  # type: ignore[no-untyped-call]
                for gram in expected:
                    resp = await stub.Query(wc.QueryRequest(prefix=gram))
                    assert {g.n_gram: g.count for g in resp.grams}.get(gram) == expected[gram], (gram, ep)
                # The app's own errors end its RPCs with their status, as the framework's do.
                with pytest.raises(grpc.RpcError) as info:
                    await stub.Query(wc.QueryRequest())
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "names a prefix or a shard" in (info.value.details() or "")
            finally:
                await channel.close()


@pytest.mark.timeout(300)
def test_word_count_demo_runs_end_to_end_with_one_command(tmp_path: Path) -> None:
    """``python -m examples.word_count.demo``: etcd, a broker, two counters, the shards, a corpus
    published and every bi-gram counted exactly once; then everything it started is stopped."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("BROKER_ADDRESS", "ETCD_ADDRESS", "ETCD_PREFIX", "CONSUMER_ADDRESS", "LOG_LEVEL")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "examples.word_count.demo", "--dir", str(tmp_path / "demo")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted((tmp_path / "demo" / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    out = proc.stdout
    expected = Counter(ngrams(demo.CORPUS, 2))
    assert f"word-count: all {len(expected)} bi-grams counted exactly once" in out, out
    assert out.count("| PRIMARY") == 4, out
    assert "    10  it was" in out and "query 'was the' through " in out, out
    assert "stopped the counters, the broker and etcd" in out, out
    # Nothing it started answers any more.
    broker = out.split("broker at ", 1)[1].split()[0]
    etcd = out.split("etcd at ", 1)[1].split()[0]
    counters = out.split("two counter processes at ", 1)[1].splitlines()[0].split(", ")
    for url in (f"{broker}/debug/ready", f"{etcd}/health", *(f"{c}/debug/ready" for c in counters)):
        assert http_status(url, timeout=0.5) is None, url

"""word-count end to end with one command: ``python -m examples.word_count.demo``.

It starts what the README's five commands need, on loopback and in a temporary directory: a
real etcd, a broker, the delta journals, two counter processes (``gazette consume --app
examples.word_count.counter:Counter``) and the four shards. Then it publishes a corpus (a text
built in, or ``--file``) through one process, waits until every shard has read its deltas
(``Stat`` with the journals' heads), scans the four shards, checks that every n-gram was counted
exactly once against the corpus's own n-grams, prints the most frequent, queries one n-gram
through the other process (proxied to the shard that owns it), and stops everything.

Exit status 0 when every count matches; 1 (naming the first difference) otherwise. ``--keep``
leaves the directory (logs of etcd, the broker and the counters) in place.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from examples.word_count import word_count_pb2 as wc
from examples.word_count import word_count_pb2_grpc as wc_grpc
from examples.word_count.messages import ngrams
from gazette.client import JournalClient, write_head
from gazette.consumer import ShardClient
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import Cluster, console_script, free_port, http_status
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.eventually import eventually_sync

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = Path(__file__).resolve().parent
APP = "examples.word_count.counter:Counter"
SHARDS = {f"shard-00{i}": f"examples/word-count/deltas/part-00{i}" for i in range(4)}
CORPUS = """It was the best of times, it was the worst of times, it was the age of wisdom, it was
the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the
season of Light, it was the season of Darkness, it was the spring of hope, it was the winter of
despair, we had everything before us, we had nothing before us, we were all going direct to
Heaven, we were all going direct the other way."""


def _start_counter(port: int, env: dict[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    with open(log_dir / f"counter-{port}.log", "ab") as log:
        return subprocess.Popen(
            [console_script("gazette"), "consume", "--app", APP, "--consumer.port", str(port),
             "--consumer.id", f"counter-{port}", "--etcd.prefix", "/gazette/consumers/word-count"],
            env=env, stdout=log, stderr=subprocess.STDOUT)


def _ready_or_exited(endpoint: str, proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: proc.poll() is not None or http_status(f"{endpoint}/debug/ready") == 200


def _all_primary(cluster: Cluster, endpoint: str) -> Callable[[], str | None]:
    """``gazctl shards list`` once it lists every shard PRIMARY (None before)."""
    def listed() -> str | None:
        rc, out, _ = cluster.gazctl("shards", "list", env={"CONSUMER_ADDRESS": endpoint})
        return out if rc == 0 and out.count("| PRIMARY") == len(SHARDS) else None
    return listed


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM (a drain), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


async def _query(endpoint: str, prefix: str = "", shard: str = "") -> dict[str, int]:
    channel = insecure_channel(endpoint.removeprefix("http://"))
    try:
        stub = wc_grpc.NGramStub(channel)  # type: ignore[no-untyped-call]
        resp: wc.QueryResponse = await stub.Query(wc.QueryRequest(prefix=prefix, shard=shard))
        return {g.n_gram: g.count for g in resp.grams}
    finally:
        await channel.close()


async def _publish_and_check(broker: str, endpoints: list[str], text: str, top: int) -> int:
    channel = insecure_channel(endpoints[0].removeprefix("http://"))
    try:
        stub = wc_grpc.NGramStub(channel)  # type: ignore[no-untyped-call]
        for paragraph in (p for p in text.split("\n\n") if p.strip()):
            await stub.Publish(wc.PublishRequest(text=paragraph))
    finally:
        await channel.close()
    expected = Counter(g for p in text.split("\n\n") if p.strip() for g in ngrams(p, 2))
    print(f"published {len(text)} characters: {sum(expected.values())} bi-grams, {len(expected)} distinct")

    # Read-your-writes: each shard answers Stat once it has read its deltas through their head.
    async with JournalClient(broker) as client, ShardClient(endpoints[0]) as shards:
        heads = {j: await write_head(client, j) for j in SHARDS.values()}
        for shard, journal in SHARDS.items():
            async with asyncio.timeout(120):
                await shards.stat(shard, read_through={journal: heads[journal]})

    counted: dict[str, int] = {}
    for shard in SHARDS:
        got = await _query(endpoints[1], shard=shard)
        print(f"{shard}: {len(got)} bi-grams, {sum(got.values())} counted")
        counted.update(got)
    print(f"the {top} most frequent bi-grams:")
    for gram, n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
        print(f"  {n:4d}  {gram}")
    gram = max(expected, key=lambda g: (expected[g], g))
    print(f"query {gram!r} through {endpoints[1]}: {(await _query(endpoints[1], prefix=gram)).get(gram)}")
    if counted != dict(expected):
        diff = sorted(set(counted.items()) ^ set(expected.items()))
        print(f"word-count: counts differ from the corpus's, first: {diff[0]}", file=sys.stderr)
        return 1
    print(f"word-count: all {len(expected)} bi-grams counted exactly once")
    return 0


def _run(work: Path, text: str, top: int) -> int:
    log_dir = work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with EtcdProcess(work / "etcd") as etcd:
        print(f"etcd at {etcd.url}")
        with Cluster(etcd.url, "/gazette/cluster", work / "cluster") as cluster:
            broker = cluster.add_broker("local", "broker-a")
            print(f"broker at {broker.address}")
            rc, _, err = cluster.gazctl("journals", "apply", "--specs", str(EXAMPLE / "journals.yaml"))
            if rc != 0:
                print(err, file=sys.stderr)
                return 1
            env = {**cluster.env(), "ETCD_ADDRESS": etcd.url, "PYTHONPATH": str(ROOT), "ETCD_LEASE": "5s"}
            ports = [free_port(), free_port()]
            endpoints = [f"http://127.0.0.1:{p}" for p in ports]
            procs = [_start_counter(p, env, log_dir) for p in ports]
            try:
                for ep, proc in zip(endpoints, procs, strict=True):
                    eventually_sync(_ready_or_exited(ep, proc), f"counter {ep} ready", 60)
                    if proc.poll() is not None:
                        print(f"counter {ep} exited: see {log_dir}", file=sys.stderr)
                        return 1
                print(f"two counter processes at {', '.join(endpoints)}")
                rc, _, err = cluster.gazctl("shards", "apply", "--specs", str(EXAMPLE / "shards.yaml"),
                                            env={"CONSUMER_ADDRESS": endpoints[0]})
                if rc != 0:
                    print(err, file=sys.stderr)
                    return 1
                listing = eventually_sync(_all_primary(cluster, endpoints[0]), "every shard PRIMARY", 120)
                print(listing.rstrip())
                return asyncio.run(_publish_and_check(broker.address, endpoints, text, top))
            finally:
                for proc in reversed(procs):
                    _stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.word_count.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", help="a text to count (default: a built-in one)")
    parser.add_argument("--top", type=int, default=10, help="how many of the most frequent bi-grams to print")
    parser.add_argument("--dir", help="working directory (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (its logs)")
    a = parser.parse_args(argv)
    text = Path(a.file).read_text(encoding="utf-8") if a.file else CORPUS
    work = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="word-count-demo-"))
    try:
        return _run(work, text, a.top)
    finally:
        print("stopped the counters, the broker and etcd")  # the context managers above did
        if a.keep or a.dir:
            print(f"logs kept in {work / 'logs'}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.pop("LOG_LEVEL", None)
    raise SystemExit(main())

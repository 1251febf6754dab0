"""bike-share end to end: generated rides through the seed's stream-rides pipeline (attach-uuids,
awk, gazctl journals append --mapping modulo) into two consumer processes running
``examples.bike_share.app:BikeShare`` with two shards on PostgreSQL and two on SQLite.

Checks: exactly the planted cycles are published (none of the decoys that revisit their start
or ride through a relocation), each once, with the same steps whichever store found them;
malformed rows are logged with their offset and skipped; the history API answers the same
from both processes (one of them proxying); the checkpoint rows carry their fence."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from consumer_support import ExampleRun, example_run, read_through_sources

from examples.bike_share.database import ensure
from gazette.client import JournalClient
from gazette.message import JSONMessage, read_committed
from gazette.message.uuid import ACK_TXN, get_flags
from gazette.testing.cluster import Cluster, console_script

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bike_share"
SHARDS = [f"cycles-part-00{i}" for i in range(4)]


async def _run(*args: Any, **kw: Any) -> subprocess.CompletedProcess[Any]:
    return await asyncio.to_thread(subprocess.run, *args, **kw)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def _cycles(client: JournalClient) -> list[dict[str, Any]]:
    out = []
    async for env in read_committed(client, "app.gazette.dev/message-type=bike_share.Cycle", JSONMessage,
                                    block=False):
        if get_flags(env.message.get_uuid()) != ACK_TXN:
            doc = dict(env.message.doc)
            doc.pop("UUID", None)
            out.append(doc)
    return sorted(out, key=lambda c: (c["BikeID"], c["Steps"][0]["Time"]))


@pytest.mark.timeout(400)
async def test_bike_share_finds_exactly_the_planted_cycles(cluster: Cluster, tmp_path: Path,
                                                          postgres_dsn: str) -> None:
    cluster.add_broker("zone-a")
    rides, expect = tmp_path / "rides.csv", tmp_path / "expected.json"
    with rides.open("w") as out:
        await _run([sys.executable, "-m", "examples.bike_share.rides", "--bikes", "80", "--days", "20",
                        "--cycles", "10", "--malformed", "3", "--seed", "7", "--expect", str(expect)],
                       cwd=ROOT, stdout=out, check=True)
    expected = [json.loads(line) for line in expect.read_text().splitlines()]
    assert len(expected) == 10

    # A database of its own (the session's is shared by tests that expect it empty).
    dsn = urllib.parse.urlsplit(postgres_dsn)
    db = f"{dsn.path.lstrip('/')}_bike_share"
    url = await asyncio.to_thread(ensure, dsn.hostname or "127.0.0.1", dsn.port or 5432, dsn.username or "postgres",
                                  db, True)
    postgres_dsn = f"{dsn.scheme}://{dsn.netloc}/{db}"
    try:
        async with example_run(cluster, tmp_path, EXAMPLE, "examples.bike_share.app:BikeShare",
                               BIKE_SHARE_POSTGRES=url) as run:
            await _check(cluster, run, rides, expected, postgres_dsn)
    finally:
        await _run(["psql", "-X", "-q", f"{dsn.scheme}://{dsn.netloc}/postgres", "-c",
                    f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], capture_output=True, check=False)


async def _check(cluster: Cluster, run: ExampleRun, rides: Path, expected: list[dict[str, Any]],
                 postgres_dsn: str) -> None:
    endpoints, procs, prefix = run.endpoints, run.procs, run.prefix
    pipe = await _run(["bash", str(EXAMPLE / "stream_rides.sh"), str(rides)], cwd=ROOT,
                          env={**cluster.env(), "RATE": "0", "GAZCTL": console_script("gazctl"),
                               "PYTHON": sys.executable, "HOME": str(cluster.home)},
                          capture_output=True, text=True, timeout=180, check=False)
    assert pipe.returncode == 0, pipe.stderr

    async with JournalClient(cluster.broker.address) as client:
        heads = await read_through_sources(client, endpoints[0], {s: f"examples/bike-share/rides/part-00{i}"
                                                                  for i, s in enumerate(SHARDS)})
        text = await asyncio.to_thread(rides.read_text)
        assert sum(heads.values()) > len(text)  # every row (and its key line) landed
        found = await _cycles(client)
    assert found == expected

    logs = "".join(p.log_text() for p in procs)
    assert logs.count("skipping malformed ride at examples/bike-share/rides/part-") == 3, logs[-3000:]

    # The history API, from either process: the bike's last rides in the window, oldest first.
    rows = list(csv.reader(text.splitlines()))[1:]
    bike = str(expected[0]["BikeID"])
    mine = [r for r in rows if len(r) == 15 and r[11] == bike][-20:]
    answers = set()
    for ep in endpoints:
        status, body = await asyncio.to_thread(_get, f"{ep}/api/bikes?id={bike}")
        assert status == 200, body
        answers.add(body)
        got = [json.loads(line) for line in body.splitlines()]
        assert [(g["StartStation"], g["EndStation"]) for g in got] == [(r[4], r[8]) for r in mine]
    assert len(answers) == 1
    assert await asyncio.to_thread(_get, f"{endpoints[1]}/api/bikes?id=1") == (200, "")  # unknown bike
    status, body = await asyncio.to_thread(_get, f"{endpoints[0]}/api/bikes?id=x")
    assert status == 400 and "numeric bike id" in body

    # The seed's gazctl commands, as shown there.
    async def gazctl(*args: str) -> str:
        rc, out, err = await asyncio.to_thread(cluster.gazctl, *args, env={"CONSUMER_ADDRESS": endpoints[0]})
        assert rc == 0, err
        return out

    out = await gazctl("journals", "list", "-l", "example-name=bike-share", "-L", "app.gazette.dev/message-type",
                       "-L", "content-type")
    assert "| examples/bike-share/cycles/part-000 " in out and "bike_share.Ride" in out and "text/csv" in out
    out = await gazctl("shards", "list", "-p", "-L", "store")
    assert all(f"| {s} | PRIMARY" in out for s in SHARDS) and "postgres" in out and "sqlite" in out, out
    out = await gazctl("shards", "list", "-p", "-l", "store=postgres", "-o", "yaml")
    assert "cycles-part-000" in out and "cycles-part-002" not in out and "value: postgres" in out, out
    out = await gazctl("shards", "list", "--lag")
    assert "examples/bike-share/rides/part-000:0" in out, out
    out = await gazctl("journals", "read", "-l", "app.gazette.dev/message-type=bike_share.Cycle")
    assert out.count('"BikeID"') >= len(expected), out[-2000:]

    psql = await _run(["psql", "-X", "-tA", postgres_dsn, "-c",
                           f"SELECT shard_fqn, fence FROM gazette_checkpoints WHERE shard_fqn LIKE '{prefix}/%'"],
                          capture_output=True, text=True, check=True)
    fences = dict(line.rsplit("|", 1) for line in psql.stdout.split())
    assert sorted(k.rsplit("/", 1)[1] for k in fences) == SHARDS[:2]
    assert all(int(v) >= 1 for v in fences.values())

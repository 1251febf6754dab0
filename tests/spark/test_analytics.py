"""The bike-share analytics job over rides and cycles journals, checked against the generator's
own rides and planted cycles."""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from examples.bike_share.analytics import main, run
from examples.bike_share.rides import generate, write_csv
from gazette.client.sync import SyncJournalClient
from gazette.message.uuid import OUTSIDE_TXN, build_uuid
from gazette.testing.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]


def test_analytics_job(spark: Any, cluster: Cluster, spark_dir: Path,
                       capsys: Any) -> None:
    cluster.add_broker()
    rc = cluster.gazctl("journals", "apply", "--specs",
                        str(ROOT / "examples/bike_share/journals.yaml"))
    assert rc.rc == 0, rc.stderr
    rng = random.Random(7)
    rides, expected = generate(rng, bikes=40, days=10, cycles=6)
    text = io.StringIO()
    write_csv(text, rides, malformed=3, rng=rng)
    rows = list(csv.reader(io.StringIO(text.getvalue())))[1:]
    producer = b"\x05" * 6
    with SyncJournalClient(cluster.address) as client:
        out: dict[int, list[bytes]] = {}
        for i, row in enumerate(rows):
            line = io.StringIO()
            csv.writer(line, lineterminator="\n").writerow(
                [str(build_uuid(producer, 100 + i, OUTSIDE_TXN)), *row])
            out.setdefault(i % 4, []).append(line.getvalue().encode())
        for part, lines in out.items():
            client.append(f"examples/bike-share/rides/part-00{part}", b"".join(lines))
        cycles = [json.dumps({"UUID": str(build_uuid(producer, 10_000 + i, OUTSIDE_TXN)), **c})
                  .encode() + b"\n" for i, c in enumerate(expected)]
        client.append("examples/bike-share/cycles/part-000", b"".join(cycles[::2]))
        client.append("examples/bike-share/cycles/part-001", b"".join(cycles[1::2]))

    results = run(spark, cluster.address, str(spark_dir / "out"), top=3)
    assert results.rides == len(rides)  # The malformed rows skipped.
    assert results.cycles == len(expected)
    starts = Counter(c["Steps"][0]["Station"] for c in expected)
    assert sorted(results.per_station) == sorted(starts.items())
    most = max(len(c["Steps"]) - 1 for c in expected)
    assert results.longest[0][1] == most
    assert len(results.longest) == 3
    assert sum(n for _, n, *_ in results.by_hour) == len(rides)
    for _, _, p50, p90, p99 in results.by_hour:
        assert p50 <= p90 <= p99
    for table in ("cycles_per_station", "longest_cycles", "duration_by_hour"):
        assert list((spark_dir / "out" / table).glob("*.parquet"))
    assert spark.read.parquet(str(spark_dir / "out" / "cycles_per_station")).count() == len(starts)


def test_analytics_says_when_the_broker_is_unreachable(capsys: Any, spark: Any,
                                                       spark_dir: Path) -> None:
    rc = main(["--broker", "http://127.0.0.1:1", "--out", str(spark_dir / "x")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "cannot reach a Gazette broker at 'http://127.0.0.1:1'" in err

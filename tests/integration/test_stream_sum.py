"""stream-sum, briefly, in the default run: three brokers in two zones, two summer processes
(``gazette consume --app examples.stream_sum.summer:Summer``) with the example's own journal
and shard specs, and a chunker that verifies every stream's sum. The crash test of the same
pipeline under faults is ``examples.stream_sum.crashtest`` (run as a soak)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from consumer_support import example_run

from examples.stream_sum.chunker import run_chunker
from gazette.client import JournalClient
from gazette.testing.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "stream_sum"


@pytest.mark.timeout(300)
async def test_stream_sum_sums_every_stream_exactly(cluster: Cluster, tmp_path: Path) -> None:
    for zone in ("zone-a", "zone-a", "zone-b"):
        cluster.add_broker(zone)
    async with example_run(cluster, tmp_path, EXAMPLE, "examples.stream_sum.summer:Summer") as run:
        async with JournalClient(cluster.broker.address) as client:
            totals = await run_chunker(client, streams=8, chunks=25, workers=3, sla=60, seed=1)
        assert totals.streams == 24 and totals.chunks == 24 * 26
        _, out, _ = await asyncio.to_thread(cluster.gazctl, "shards", "list", "--consumer.address", run.endpoints[0])
        for i in range(4):
            assert f"summer-part-00{i}" in out


CRASH_MINUTES = float(os.environ.get("STREAM_SUM_CRASH_MINUTES", "10"))


@pytest.mark.soak
@pytest.mark.timeout(int(CRASH_MINUTES * 60) + 900)
def test_crash_test_under_random_faults(tmp_path: Path) -> None:
    """The crash test as users run it: every fault kind at random for ten minutes, then every
    stream's sum verified: none wrong, no chunk lost or repeated, none past the SLA."""
    proc = subprocess.run(
        [sys.executable, "-m", "examples.stream_sum.crashtest", "--minutes", f"{CRASH_MINUTES:g}",
         "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=CRASH_MINUTES * 60 + 840, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("crashtest:")]
    print("\n".join(lines))  # the fault log and the totals, in CI's output
    # On failure: the fault log's end, the processes' last warnings (``log:``), then stderr's.
    assert proc.returncode == 0, "\n".join(lines[-70:]) + proc.stderr[-1500:]
    summary = lines[-1]
    m = re.search(r"(\d+) faults injected .*?; (\d+) streams and (\d+) chunks verified", summary)
    assert m is not None, summary
    faults, streams, chunks = (int(g) for g in m.groups())
    assert faults >= CRASH_MINUTES * 60 / 12 * 0.8  # one fault every 4-12 s
    assert streams > 0 and chunks > streams
    for kind in ("broker-kill", "consumer-kill", "etcd-restart"):
        assert kind in summary, f"no {kind} in {summary}"

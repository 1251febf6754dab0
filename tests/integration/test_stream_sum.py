"""stream-sum, briefly, in the default run: three brokers in two zones, two summer processes
(``gazette consume --app examples.stream_sum.summer:Summer``) with the example's own journal
and shard specs, and a chunker that verifies every stream's sum. The crash test of the same
pipeline under faults is ``examples.stream_sum.crashtest`` (run as a soak)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from consumer_support import ConsumerProc, consumer_endpoints, consumer_env, wait_until

from examples.stream_sum.chunker import run_chunker
from gazette.client import JournalClient
from gazette.etcd import connect
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "stream_sum"


@pytest.mark.timeout(300)
async def test_stream_sum_sums_every_stream_exactly(cluster: Cluster, tmp_path: Path) -> None:
    for zone in ("zone-a", "zone-a", "zone-b"):
        cluster.add_broker(zone)
    rc, _, err = await asyncio.to_thread(cluster.gazctl, "journals", "apply", "--specs", str(EXAMPLE / "journals.yaml"))
    assert rc == 0, err
    prefix = unique_prefix("/gazette-test-stream-sum")
    env = consumer_env(cluster.env(), PYTHONPATH=str(ROOT), ETCD_ADDRESS=cluster.etcd_url, ETCD_PREFIX=prefix,
                       ETCD_LEASE="2s", LOG_FORMAT="text")
    procs = [ConsumerProc(f"summer-{i}", env, tmp_path, app="examples.stream_sum.summer:Summer") for i in range(2)]
    for p in procs:
        p.start()
    etcd = await connect(cluster.etcd_url)
    try:
        endpoints = await wait_until(lambda: consumer_endpoints(etcd, prefix), 60, "summers announced")
        shards = (EXAMPLE / "shards.yaml").read_text().replace("/gazette/hints", f"{prefix}-hints")
        rc, _, err = await asyncio.to_thread(cluster.gazctl, "shards", "apply", "--consumer.address", endpoints[0],
                                             stdin=shards)
        assert rc == 0, err
        async with JournalClient(cluster.broker.address) as client:
            totals = await run_chunker(client, streams=8, chunks=25, workers=3, sla=60, seed=1)
        assert totals.streams == 24 and totals.chunks == 24 * 26
        _, out, _ = await asyncio.to_thread(cluster.gazctl, "shards", "list", "--consumer.address", endpoints[0])
        for i in range(4):
            assert f"summer-part-00{i}" in out
    finally:
        for p in procs:
            await asyncio.to_thread(p.terminate)
        await etcd.delete_prefix(prefix.encode())
        await etcd.close()

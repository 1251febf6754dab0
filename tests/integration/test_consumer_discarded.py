"""Liveness past input the Sequencer discards, end to end: source journals ending in a duplicate
re-append of committed messages and in a rolled-back transaction. The shards' read-through
reaches the journals' heads, so ``gazctl shards list --lag`` falls to zero and a Stat at the head
answers; the discarded messages are not consumed. Real etcd, a real broker, a consumer process
in this test's loop; gazctl as a subprocess in a worker thread."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter

import pytest
from consumer_support import CountingApp, journals_yaml, shards_yaml

from gazette.client import AppendService, JournalClient, write_head
from gazette.consumer.client import ShardClient
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.message import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, ProducerID, build_uuid
from gazette.message.uuid import clock_from_time
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix

PRODUCER = ProducerID(b"\x01\x02\x03\x04\x05\x06")


def _lines(msgs: list[tuple[int, int, str]]) -> bytes:
    """ndjson messages of PRODUCER, as (clock, flags, key)."""
    return b"".join(json.dumps({"UUID": str(build_uuid(PRODUCER, c, f)), "key": k}).encode() + b"\n"
                    for c, f, k in msgs)


async def _lags(cluster: Cluster, addr: str) -> dict[str, int]:
    rc, out, err = await asyncio.to_thread(cluster.gazctl, "shards", "list", "--lag",
                                           "--consumer.address", addr)
    assert rc == 0, err
    return {j: int(n) for j, n in re.findall(r"(in/part-00\d):(\d+)", out)}


@pytest.mark.timeout(180)
async def test_read_through_passes_discarded_tails(cluster: Cluster) -> None:
    cluster.add_broker("local", "lively-lynx")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=journals_yaml("part-000", "part-001"))
    assert rc == 0, err
    app = CountingApp()
    proc = ConsumerProcess(ConsumerConfig(port=0, broker_address=cluster.broker.address,
                                          etcd_address=cluster.etcd_url,
                                          etcd_prefix=unique_prefix("/gazette-test-discarded"),
                                          etcd_lease=5), app)
    task = asyncio.create_task(proc.run())
    try:
        async with asyncio.timeout(30):
            await proc.ready.wait()
        addr = proc.endpoint
        rc, _, err = await asyncio.to_thread(cluster.gazctl, "shards", "apply", "--consumer.address", addr,
                                             stdin=shards_yaml("part-000", "part-001"))
        assert rc == 0, err

        c = clock_from_time(time.time_ns())
        committed = {
            # Outside-transaction messages, then a transaction of two and its ACK.
            "in/part-000": _lines([(c + 1, OUTSIDE_TXN, "a"), (c + 2, OUTSIDE_TXN, "b"),
                                   (c + 3, CONTINUE_TXN, "c"), (c + 4, CONTINUE_TXN, "d"),
                                   (c + 5, ACK_TXN, "ack")]),
            "in/part-001": _lines([(c + 1, OUTSIDE_TXN, "e"), (c + 2, OUTSIDE_TXN, "f")]),
        }
        discarded = {
            # The same bytes again: a producer's retried append that had landed.
            "in/part-000": committed["in/part-000"],
            # A transaction begun, then rolled back: its ACK carries the last committed clock.
            "in/part-001": _lines([(c + 3, CONTINUE_TXN, "x"), (c + 4, CONTINUE_TXN, "y"),
                                   (c + 2, ACK_TXN, "rollback")]),
        }
        async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc, \
                ShardClient(addr) as shards:
            for journal, data in committed.items():
                await (await svc.append(journal, data))
            heads = {j: await write_head(client, j) for j in committed}
            async with asyncio.timeout(60):  # both shards primary here
                while True:
                    listed = (await shards.list()).shards
                    if sum(any(st.code == pc.ReplicaStatus.PRIMARY for st in sh.status) for sh in listed) == 2:
                        break
                    await asyncio.sleep(0.05)  # polling the listing, not synchronisation
            async with asyncio.timeout(60):  # consumed and committed: the journals are idle
                for i, (journal, head) in enumerate(heads.items()):
                    await shards.stat(f"count-00{i}", read_through={journal: head})
            assert app.counts == Counter("abcdef")

            for journal, data in discarded.items():
                await (await svc.append(journal, data))
            heads = {j: await write_head(client, j) for j in discarded}
            # A Stat at the new heads answers: only discarded messages lie before them.
            async with asyncio.timeout(30):
                for i, (journal, head) in enumerate(heads.items()):
                    stat = await shards.stat(f"count-00{i}", read_through={journal: head})
                    assert stat.read_through[journal] == head
            # And --lag reaches zero for both.
            async with asyncio.timeout(30):
                while True:
                    if await _lags(cluster, addr) == {"in/part-000": 0, "in/part-001": 0}:
                        break
                    await asyncio.sleep(0.1)  # polling gazctl's listing, not synchronisation
            assert app.counts == Counter("abcdef")  # nothing discarded was consumed
            # -o json carries the lag too.
            rc, out, err = await asyncio.to_thread(cluster.gazctl, "shards", "list", "--lag", "-o", "json",
                                                   "--consumer.address", addr)
            assert rc == 0, err
            listed = {sh["spec"]["id"]: sh for sh in json.loads(out)["shards"]}
            assert {sid: sh["lag"] for sid, sh in listed.items()} == {
                "count-000": {"in/part-000": 0}, "count-001": {"in/part-001": 0}}
    finally:
        proc.stop()
        async with asyncio.timeout(30):
            await task

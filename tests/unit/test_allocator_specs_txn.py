"""Spec mapping and consistency rules, state extraction details, and transaction batching."""

from __future__ import annotations

from typing import Any

import pytest
from aetcd import rpc

from gazette.allocator import (
    BatchedTxn,
    Cmp,
    Delete,
    Put,
    TxnFailedError,
    desired_replication,
    journal_is_consistent,
    member_capacity,
    route_of,
    shard_is_consistent,
)
from gazette.allocator.model import Assignment, Entry, Item
from gazette.allocator.testing import build_state
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb


def test_desired_replication_and_capacity() -> None:
    assert desired_replication(pb.JournalSpec(replication=3)) == 3
    partial = pb.JournalSpec(replication=3)
    partial.suspend.level = pb.JournalSpec.Suspend.PARTIAL
    assert desired_replication(partial) == 1
    partial.suspend.level = pb.JournalSpec.Suspend.FULL
    assert desired_replication(partial) == 0
    assert desired_replication(pc.ShardSpec(hot_standbys=2)) == 3
    assert desired_replication(pc.ShardSpec(hot_standbys=2, disable=True)) == 0
    # --consumer.max-hot-standbys bounds the stated hot standbys (Gazette's MaxHotStandbys).
    assert desired_replication(pc.ShardSpec(hot_standbys=5), max_hot_standbys=1) == 2
    assert desired_replication(pc.ShardSpec(hot_standbys=1), max_hot_standbys=3) == 2
    assert desired_replication(pc.ShardSpec(hot_standbys=5), max_hot_standbys=0) == 1
    assert member_capacity(pb.BrokerSpec(journal_limit=7, exiting=True)) == (7, True)
    assert member_capacity(pc.ConsumerSpec(shard_limit=4)) == (4, False)
    with pytest.raises(TypeError, match="not an item spec"):
        desired_replication(pb.BrokerSpec())


def _asn(slot: int, suffix: str, value: object) -> Entry[Assignment]:
    return Entry(f"/r/assign/j#z#{suffix}#{slot}", Assignment("j", "z", suffix, slot, value))


ITEM = Entry("/r/items/j", Item("j", 2))


def test_journal_consistency_requires_every_replica_to_advertise_the_route() -> None:
    blank = [_asn(1, "a", None), _asn(0, "b", None)]
    route = route_of(blank)
    assert route.primary == 1 and [m.suffix for m in route.members] == ["a", "b"]
    assert not journal_is_consistent(ITEM, blank[0], blank)
    synced = [_asn(1, "a", route), _asn(0, "b", route)]
    assert journal_is_consistent(ITEM, synced[0], synced)
    # One replica still advertises an older route (without b): inconsistent.
    old = route_of([_asn(0, "a", None)])
    half = [_asn(1, "a", old), _asn(0, "b", route)]
    assert not journal_is_consistent(ITEM, half[1], half)
    # Endpoints are not part of the comparison.
    with_endpoints = pb.Route()
    with_endpoints.CopyFrom(route)
    with_endpoints.endpoints.extend(["http://a", "http://b"])
    mixed = [_asn(1, "a", with_endpoints), _asn(0, "b", route)]
    assert journal_is_consistent(ITEM, mixed[0], mixed)


def test_shard_consistency() -> None:
    code = pc.ReplicaStatus

    def status(c: int) -> pc.ReplicaStatus:
        return pc.ReplicaStatus(code=c)  # type: ignore[arg-type]

    standby = _asn(1, "a", status(code.STANDBY))
    backfill = _asn(2, "c", status(code.BACKFILL))
    failed = _asn(1, "a", status(code.FAILED))
    primary_ok = _asn(0, "b", status(code.PRIMARY))
    primary_failed = _asn(0, "b", status(code.FAILED))
    assert shard_is_consistent(ITEM, standby, [standby, primary_ok])
    assert not shard_is_consistent(ITEM, backfill, [primary_ok, backfill])
    assert not shard_is_consistent(ITEM, failed, [failed, primary_ok])
    assert shard_is_consistent(ITEM, failed, [failed, primary_failed])
    assert not shard_is_consistent(ITEM, _asn(1, "a", None), [primary_ok])


def test_state_leader_counts_and_shedding() -> None:
    state = build_state(
        [("x", 2), ("y", 1)],
        [("z1", "a", 5), ("z1", "b", 5, True), ("z2", "c", 5), ("z3", "d", 0)],
        [("x", "z1", "a", 0), ("x", "z1", "b", 1), ("y", "z1", "b", 0), ("gone", "z2", "c", 0)],
        local=1,
    )
    assert state.leader_key == state.members[0].key and not state.is_leader
    # Assignments of items which no longer exist count nowhere (they are only to be removed).
    assert state.member_total == [1, 2, 0, 0]
    assert state.member_primary == [1, 1, 0, 0]
    assert state.shed == [0, 5, 0, 0]  # b is exiting and the cluster has room: all shed.
    assert state.zones == ["z1", "z2"]  # b has no effective capacity; d has no limit.
    assert [li.item.decoded.name for li in state.local_items] == ["x", "y"]
    assert not state.should_exit  # Exiting, but still holding assignments.
    assert state.item_slots == 3 and state.member_slots == 10


class FakeKV:
    """Stands in for aetcd's KV stub: records requests, answers with a rising revision."""

    def __init__(self, fail_at: int = -1) -> None:
        self.requests: list[Any] = []
        self.fail_at = fail_at

    async def Txn(self, request: Any, metadata: Any = None) -> Any:  # noqa: N802
        self.requests.append(request)
        ok = len(self.requests) - 1 != self.fail_at
        return rpc.TxnResponse(
            succeeded=ok, header=rpc.ResponseHeader(revision=100 + len(self.requests))
        )


class FakeClient:
    def __init__(self, kv: FakeKV) -> None:
        self.kvstub = kv
        self.metadata = None

    async def connect(self) -> None:
        pass


async def test_batched_txn_packs_checkpoints_without_splitting_them() -> None:
    kv = FakeKV()
    txn = BatchedTxn(FakeClient(kv), [Cmp("/leader", "mod", 7)], max_ops=10)
    for n in range(7):  # Checkpoints of 1 cmp + 3 ops each.
        txn.when(Cmp(f"/k{n}", "mod", n))
        txn.then(Put(f"/k{n}/a", b"v", 5), Delete(f"/k{n}/b"), Put(f"/k{n}/c", b"", 0, True))
        await txn.checkpoint()
    await txn.flush()
    assert [len(r.success) for r in kv.requests] == [9, 9, 3]
    for r in kv.requests:
        assert r.compare[0].key == b"/leader" and r.compare[0].mod_revision == 7
        assert len(r.compare) == 1 + len(r.success) // 3
    put = kv.requests[0].success[2].request_put
    assert put.ignore_lease and put.key == b"/k0/c"
    assert kv.requests[0].success[0].request_put.lease == 5
    assert txn.revision == 103 and txn.transactions == 3


async def test_batched_txn_failure_keeps_revision_of_applied_batches() -> None:
    kv = FakeKV(fail_at=1)
    txn = BatchedTxn(FakeClient(kv), max_ops=2)
    txn.then(Delete("/a"), Delete("/b"))
    await txn.checkpoint()
    txn.when(Cmp("/c", "create", 0))
    txn.then(Delete("/c"))
    with pytest.raises(TxnFailedError, match="did not apply"):
        await txn.checkpoint()  # Flushes the first batch, then queues this one.
        await txn.flush()
    assert txn.revision == 101
    with pytest.raises(ValueError, match="more than 2"):
        txn.then(Delete("/x"), Delete("/y"), Delete("/z"))
        await txn.checkpoint()

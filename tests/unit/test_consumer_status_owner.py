"""A primary writes its status only on its own assignment: after its shard was demoted and
promoted again in the same process (a new assignment, a new create revision), the replaced
primary's FAILED (e.g. from the fence its successor wrote) is not written on the successor's."""

from __future__ import annotations

from typing import Any

from consumer_cluster import MemoryEtcd

from gazette.allocator.keys import assignment_key, items_key
from gazette.consumer.keys import consumer_decoder
from gazette.consumer.process import ConsumerConfig, ConsumerProcess, _assignment
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as pc

PREFIX = "/gazette/consumers/status-owner"


class App:
    def new_store(self, shard: Any, recorder: Any) -> Any:  # never called
        raise AssertionError


def _process() -> tuple[ConsumerProcess, MemoryEtcd, str]:
    proc = ConsumerProcess(ConsumerConfig(port=0, zone="z", suffix="me", etcd_prefix=PREFIX), App())  # type: ignore[arg-type]
    ks = KeySpace(PREFIX, consumer_decoder(PREFIX))
    etcd = MemoryEtcd(ks)
    proc.keyspace, proc._etcd = ks, etcd  # type: ignore[assignment]
    key = assignment_key(PREFIX, "s", "z", "me", 0)
    etcd.write([(items_key(PREFIX, "s"), pc.ShardSpec(id="s").SerializeToString()), (key, b"")])
    return proc, etcd, key


def _status(etcd: MemoryEtcd, key: str) -> int:
    return pc.ReplicaStatus.FromString(etcd.kv[key][0]).code


async def test_only_on_its_own_assignment() -> None:
    proc, etcd, key = _process()
    mine = _assignment(0, proc.keyspace.search(key))
    await proc.write_status("s", pc.ReplicaStatus(code=pc.ReplicaStatus.PRIMARY), mine)
    assert _status(etcd, key) == pc.ReplicaStatus.PRIMARY

    etcd.write([(key, None)])  # demoted ...
    etcd.write([(key, b"")])  # ... and promoted again: a new assignment
    await proc.write_status("s", pc.ReplicaStatus(code=pc.ReplicaStatus.FAILED), mine)
    assert etcd.kv[key][0] == b""  # the replaced primary wrote nothing

    successor = _assignment(0, proc.keyspace.search(key))
    await proc.write_status("s", pc.ReplicaStatus(code=pc.ReplicaStatus.PRIMARY), successor)
    assert _status(etcd, key) == pc.ReplicaStatus.PRIMARY


async def test_assignments_that_arrive_while_reconciling_are_reconciled() -> None:
    """A standby assigned while a reconcile awaits its status writes is reported STANDBY too,
    though nothing else changes afterwards (it used to stay IDLE until some other update)."""
    import asyncio

    from gazette.testing.eventually import eventually

    proc, etcd, primary = _process()
    etcd.write([(primary, None)])  # no primary here: nothing else writes to etcd
    standby = [assignment_key(PREFIX, s, "z", "me", 1) for s in ("a", "b")]
    etcd.write([(items_key(PREFIX, s), pc.ShardSpec(id=s).SerializeToString()) for s in ("a", "b")]
               + [(k, b"") for k in standby[:1]])
    txn, late = etcd.Txn, []

    async def txn_then_assign(request: Any, metadata: Any = None) -> Any:
        resp = await txn(request, metadata)
        if not late:  # the allocator assigns another standby meanwhile
            late.append(etcd.write([(standby[1], b"")]))
        return resp

    etcd.Txn = txn_then_assign  # type: ignore[method-assign]
    proc._reconciled = asyncio.Event()
    follow = asyncio.ensure_future(proc._follow())
    try:
        await eventually(lambda: all(k in etcd.kv and etcd.kv[k][0] and _status(etcd, k) ==
                                     pc.ReplicaStatus.STANDBY for k in standby),
                         "both standbys reported STANDBY", within=10)
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)

"""A consumer's cluster in memory, for case tables of its resolver and Shard service (Gazette's
``resolver_test.go`` style): an etcd model whose every write reaches a consumer ``KeySpace`` as a
watch response, and which answers the revision-checked transactions ``gazette.etcd.txn`` sends.

Nothing here sleeps or polls: a write is applied to the mirror before it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aetcd import rpc

from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.consumer.keys import consumer_decoder
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb

ROOT = "/consumers/test"
CLUSTER_ID = 7
MEMBER_ID = 11
LOCAL = pb.ProcessSpec.ID(zone="zone-a", suffix="local")
REMOTE = pb.ProcessSpec.ID(zone="zone-b", suffix="remote")
LOCAL_ENDPOINT = "http://local:8081"
REMOTE_ENDPOINT = "http://remote:8081"


class MemoryEtcd:
    """Keys to (value, create revision, mod revision, version), with etcd's revision rules for
    puts, deletes and transactions comparing mod or create revisions for equality."""

    def __init__(self, ks: KeySpace) -> None:
        self.ks = ks
        self.revision = 1
        self.kv: dict[str, tuple[bytes, int, int, int]] = {}
        self.kvstub = self  # gazette.etcd.txn.commit calls client.kvstub.Txn
        self.metadata = None
        self.txns = 0

    async def connect(self) -> None:
        pass

    def write(self, ops: Iterable[tuple[str, bytes | None]]) -> int:
        """Applies puts (bytes) and deletes (None) at one new revision; the keyspace mirrors them."""
        self.revision += 1
        response = rpc.WatchResponse()
        response.header.revision = self.revision
        response.header.cluster_id = CLUSTER_ID
        response.header.member_id = MEMBER_ID
        response.header.raft_term = 1
        for key, value in ops:
            event = response.events.add()
            event.kv.key = key.encode()
            event.kv.mod_revision = self.revision
            if value is None:
                event.type = rpc.Event.DELETE
                self.kv.pop(key, None)
                continue
            _, create, _, version = self.kv.get(key, (b"", self.revision, 0, 0))
            self.kv[key] = (value, create, self.revision, version + 1)
            event.kv.value = value
            event.kv.create_revision = create
            event.kv.version = version + 1
        self.ks.apply([response])
        return self.revision

    async def Txn(self, request: Any, metadata: Any = None) -> Any:  # noqa: N802 - the gRPC stub's name
        self.txns += 1
        ok = all(self._holds(c) for c in request.compare)
        resp = rpc.TxnResponse(succeeded=ok)
        ops: list[tuple[str, bytes | None]] = []
        for op in request.success if ok else ():
            if op.HasField("request_put"):
                ops.append((op.request_put.key.decode(), op.request_put.value))
            else:
                ops.append((op.request_delete_range.key.decode(), None))
        resp.header.revision = self.write(ops) if ops else self.revision
        resp.header.cluster_id = CLUSTER_ID
        return resp

    def _holds(self, c: Any) -> bool:
        rec = self.kv.get(c.key.decode())
        if c.target == rpc.Compare.MOD:
            return (rec[2] if rec else 0) == c.mod_revision
        return (rec[1] if rec else 0) == c.create_revision

    # -- the consumer's keys ------------------------------------------------------------------

    def shard(self, spec: pc.ShardSpec) -> int:
        return self.write([(items_key(ROOT, spec.id), spec.SerializeToString())])

    def member(self, pid: pb.ProcessSpec.ID, endpoint: str) -> int:
        spec = pc.ConsumerSpec(shard_limit=10)
        spec.process_spec.id.CopyFrom(pid)
        spec.process_spec.endpoint = endpoint
        return self.write([(members_key(ROOT, pid.zone, pid.suffix), spec.SerializeToString())])

    def assign(self, shard: str, pid: pb.ProcessSpec.ID, slot: int,
               code: int = pc.ReplicaStatus.IDLE) -> int:
        status = pc.ReplicaStatus(code=code)  # type: ignore[arg-type]
        return self.write([(assignment_key(ROOT, shard, pid.zone, pid.suffix, slot), status.SerializeToString())])


def new_cluster() -> MemoryEtcd:
    """An empty consumer keyspace under ``ROOT`` and the etcd model feeding it."""
    return MemoryEtcd(KeySpace(ROOT, consumer_decoder(ROOT)))


def shard_spec(shard_id: str, *sources: str, **labels: str) -> pc.ShardSpec:
    """A valid ShardSpec reading ``sources`` (sorted), labelled ``labels``."""
    spec = pc.ShardSpec(id=shard_id)
    spec.max_txn_duration.seconds = 1
    for journal in sources:
        spec.sources.add(journal=journal)
    for name, value in sorted(labels.items()):
        spec.labels.labels.add(name=name, value=value)
    return spec


@dataclass
class FakeRuntime:
    """What the resolver and the Shard service use of a local primary (``ShardRuntime``):
    readiness, the app, the spec, the store and the progress of completed transactions."""

    spec: pc.ShardSpec
    app: Any = None
    store: Any = "the store"
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    progressed: asyncio.Event = field(default_factory=asyncio.Event)
    read_through: dict[str, int] = field(default_factory=dict)
    publish_at: dict[str, int] = field(default_factory=dict)

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.read_through), dict(self.publish_at)

    def complete_txn(self, **through: int) -> None:
        """A transaction completed, reading through ``through`` (journal names with '/' as '_')."""
        self.read_through.update({j.replace("_", "/"): o for j, o in through.items()})
        signal, self.progressed = self.progressed, asyncio.Event()
        signal.set()


@dataclass
class FakeHost:
    """A consumer process as the resolver sees it (``ResolverHost``): its ID, keyspace, local
    shards, and the reconcile signal its shard loop sets after each keyspace update."""

    keyspace: KeySpace
    local_id: pb.ProcessSpec.ID = field(default_factory=lambda: LOCAL)
    shards: dict[str, tuple[Any, asyncio.Task[None]]] = field(default_factory=dict)
    _reconciled: asyncio.Event = field(default_factory=asyncio.Event)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_reconciled(self) -> None:
        self._arrived.set()
        await self._reconciled.wait()

    async def waiter(self, deadline: float = 10.0) -> None:
        """Returns once a resolution waits for a reconcile (since the last call)."""
        async with asyncio.timeout(deadline):
            await self._arrived.wait()
        self._arrived.clear()

    def reconciled(self) -> None:
        signal, self._reconciled = self._reconciled, asyncio.Event()
        signal.set()

    def start(self, rt: FakeRuntime) -> asyncio.Future[None]:
        """Runs ``rt`` as a local shard; the returned future stands for its task (resolve it
        to end the shard)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.shards[rt.spec.id] = (rt, done)  # type: ignore[assignment]
        return done

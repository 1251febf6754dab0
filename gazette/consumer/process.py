"""A consumer process: a member process whose items are shards (Gazette's ``consumer.Service``
with ``mainboilerplate/runconsumer``).

It announces a ConsumerSpec under its lease, runs the shared allocator over ShardSpecs with
``shard_is_consistent`` (a replica counts once its status is STANDBY or PRIMARY), and runs a
``ShardRuntime`` for every shard assigned to it as primary; statuses it writes are
``ReplicaStatus`` values of its assignment keys, revision-checked, as Gazette writes them.

Invariants:

* Local shards follow the keyspace: a reconcile runs after every applied keyspace update,
  and again at once if the keyspace moved while it ran (it awaits its status writes); a
  primary assignment starts its shard, a lost one cancels it (its store destroyed). A
  non-primary assignment of a shard with a recovery log runs a hot standby (``standby``),
  which a promotion hands to the new primary; without a log it is reported STANDBY at once.
* A shard's failure is written FAILED on its assignment and ends that shard alone; the process
  and its other shards carry on. ``gazctl shards unassign --failed`` frees it.
* Draining (SIGTERM): zero capacity is announced, the allocator moves the shards to other
  members, and each local shard is cancelled as its assignment goes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gazette.allocator import desired_replication, shard_is_consistent
from gazette.allocator.keys import (
    assignments_prefix,
    item_assignments_prefix,
    items_key,
    parse_assignment_key,
    split_assignment_key,
)
from gazette.auth import NO_AUTH, Authorizer, KeyedAuth, Verifier
from gazette.client import JournalClient
from gazette.consumer import metrics
from gazette.consumer.client import ShardClient
from gazette.consumer.initialize import InitArgs, Initializer
from gazette.consumer.interfaces import Application, Assignment, maybe_await
from gazette.consumer.keys import consumer_decoder
from gazette.consumer.recovery import HintsStore
from gazette.consumer.resolver import Resolver
from gazette.consumer.service import ShardService
from gazette.consumer.shard import ShardRuntime, StatusWriter
from gazette.consumer.standby import StandbyReplica
from gazette.etcd import txn
from gazette.etcd.keyspace import KeySpace, KeyValue
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import Player
from gazette.rpc.tls import ClientTLS, ServerTLS
from gazette.server.grpc import GrpcServer, add_service
from gazette.server.limits import ServerLimits
from gazette.server.process import MemberProcess, random_suffix
from gazette.tasks import Supervisor

__all__ = ["ConsumerConfig", "ConsumerProcess"]

log = logging.getLogger(__name__)

STATUS_WRITES = 64  # standbys without a recovery log reported STANDBY at a time


@dataclass
class ConsumerConfig:
    """A consumer process's settings: what ``gazette consume`` builds from its flags."""

    host: str = "127.0.0.1"
    port: int = 8081
    zone: str = "local"
    suffix: str = field(default_factory=random_suffix)
    limit: int = 32
    broker_address: str = "http://localhost:8080"
    etcd_address: str = "http://127.0.0.1:2379"
    etcd_prefix: str = "/gazette/consumers/app"
    etcd_lease: float = 20.0
    etcd_tls: ClientTLS | None = None  # how an https:// etcd_address is dialled
    advertise_host: str | None = None
    max_hot_standbys: int = 3  # bounds every shard's hot_standbys
    hint_interval: float = 60.0  # seconds between recorded-hints writes of a recording shard
    # Security: TLS of the consumer's port, of its dials to other consumers (peer) and to
    # brokers; --auth-keys verifying tokens (and signing peers'), and how brokers are authorized.
    tls: ServerTLS | None = None
    peer_tls: ClientTLS | None = None
    broker_tls: ClientTLS | None = None
    auth_keys: str = ""
    broker_auth: Authorizer | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)  # --server.*: memory and fd budget
    args: argparse.Namespace | None = None  # parsed flags, the app's own included


class ConsumerProcess(MemberProcess):
    kind = "consumer"

    def __init__(self, config: ConsumerConfig, app: Application[Any, Any, Any]) -> None:
        super().__init__(
            zone=config.zone, suffix=config.suffix, host=config.host, port=config.port,
            etcd_address=config.etcd_address, etcd_lease=config.etcd_lease, etcd_tls=config.etcd_tls,
            keyspace=KeySpace(config.etcd_prefix, consumer_decoder(config.etcd_prefix)),
            is_consistent=shard_is_consistent, advertise_host=config.advertise_host,
            replication=functools.partial(desired_replication, max_hot_standbys=config.max_hot_standbys),
            tls=config.tls, limits=config.limits)
        self.config = config
        self.app = app
        self.auth = KeyedAuth(config.auth_keys) if config.auth_keys else None
        self.verifier: Verifier = self.auth if self.auth is not None else NO_AUTH
        self.client = JournalClient(config.broker_address, tls=config.broker_tls, auth=config.broker_auth)
        self.shards: dict[str, tuple[ShardRuntime[Any], asyncio.Task[None]]] = {}
        self.standbys: dict[str, tuple[StandbyReplica, asyncio.Task[None]]] = {}
        self._shard_tasks = Supervisor("consumer shards", "log")
        self.resolver = Resolver(self)
        self.peers = ShardClient(tls=config.peer_tls, auth=self.auth)  # used only with explicit peer endpoints
        self._reconciled = asyncio.Event()
        self._local: dict[str, tuple[int, Any]] | None = None  # see _local_assignments
        self._local_at: tuple[KeySpace | None, int] = (None, 0)
        self._app_routes: list[web.RouteDef] = []

    # -- member process hooks ---------------------------------------------------------

    def member_spec(self, exiting: bool = False) -> bytes:
        spec = pc.ConsumerSpec(shard_limit=0 if exiting else self.config.limit)
        spec.process_spec.id.CopyFrom(self.local_id)
        spec.process_spec.endpoint = self.endpoint
        return spec.SerializeToString()

    def register_services(self, server: GrpcServer) -> None:
        add_service(server, pc.DESCRIPTOR.services_by_name["Shard"], ShardService(self))

    async def initialize(self, server: GrpcServer) -> None:
        if isinstance(self.app, Initializer):
            args = InitArgs(config=self.config.args, server=server, resolver=self.resolver,
                            journal_client=self.client, peers=self.peers)
            await maybe_await(self.app.init_application(args))
            self._app_routes = list(args.routes)

    def http_routes(self) -> Iterable[web.RouteDef]:
        return self._app_routes

    def not_serving(self) -> str:
        local = self._local_assignments()
        waiting = sorted(sid for sid, (slot, kv) in local.items() if slot == 0
                         and not (isinstance(kv.value, pc.ReplicaStatus)
                                  and kv.value.code == pc.ReplicaStatus.FAILED)
                         and (sid not in self.shards or not self.shards[sid][0].ready.is_set()))
        return f"shards not yet serving: {', '.join(waiting)}" if waiting else ""

    def has_capacity(self, spec: Any) -> bool:
        return isinstance(spec, pc.ConsumerSpec) and spec.shard_limit > 0

    def holds_items(self) -> bool:
        return bool(self._local_assignments())

    def start_tasks(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self._follow(), name="shards")

    async def drain(self) -> None:
        await self._shard_tasks.aclose()

    async def closed(self) -> None:
        await self._shard_tasks.aclose()
        await self.peers.close()
        await self.client.close()

    # -- shards -----------------------------------------------------------------------

    def _local_assignments(self) -> dict[str, tuple[int, Any]]:
        """Shard id -> (slot, assignment key-value) of this process's assignments: built once
        per keyspace revision (callers only read it), by splitting the keys the keyspace's
        decoder validated."""
        ks = self.keyspace
        if self._local is not None and self._local_at[0] is ks and self._local_at[1] == ks.revision:
            return self._local
        prefix = assignments_prefix(ks.root)
        n, me = len(prefix), (self.local_id.zone, self.local_id.suffix)
        out: dict[str, tuple[int, Any]] = {}
        for kv in ks.prefixed(prefix):
            a = split_assignment_key(kv.key, n)
            if (a.zone, a.suffix) == me:
                out[a.item] = (a.slot, kv)
        self._local, self._local_at = out, (ks, ks.revision)
        return out

    def _local_assignment(self, shard_id: str) -> tuple[int, Any] | None:
        """This process's (slot, assignment key-value) of ``shard_id``, or None: from the
        shard's own assignments (a status write must not cost a walk of every shard's)."""
        root = self.keyspace.root
        for kv in self.keyspace.prefixed(item_assignments_prefix(root, shard_id)):
            a = parse_assignment_key(root, kv.key)
            if (a.zone, a.suffix) == (self.local_id.zone, self.local_id.suffix):
                return a.slot, kv
        return None

    async def _follow(self) -> None:
        while True:
            seen = self.keyspace.revision
            await self._reconcile()
            signal, self._reconciled = self._reconciled, asyncio.Event()
            signal.set()
            # A reconcile awaits etcd (status writes): updates applied meanwhile are not seen
            # by it, and waiting for the next would leave them unreconciled until some other
            # change comes (at 500 shards, 185 standbys stayed IDLE for good). Go again.
            if self.keyspace.revision == seen:
                await self.keyspace.wait_for_update()

    async def wait_reconciled(self) -> None:
        await self._reconciled.wait()

    async def _reconcile(self) -> None:
        local = self._local_assignments()
        promoted: dict[str, Player] = {}
        for shard_id, (standby, task) in list(self.standbys.items()):
            slot = local[shard_id][0] if shard_id in local else None
            if slot is not None and slot != 0 and not task.done():
                continue
            if slot == 0 and (player := standby.release()) is not None:
                promoted[shard_id] = player  # still playing: the primary hands it off
            task.cancel()
            del self.standbys[shard_id]
            if slot is None:
                log.info("shard standby left this process", extra={"shard": shard_id})
        for shard_id, (rt, task) in list(self.shards.items()):
            if shard_id not in local or local[shard_id][0] != 0 or task.done():
                if not task.done():
                    task.cancel()
                if shard_id not in local or local[shard_id][0] != 0:
                    del self.shards[shard_id]
                    log.info("shard left this process", extra={"shard": shard_id})
            if shard_id in local:
                rt.assignment = _assignment(*local[shard_id])  # follows the keyspace
        at_once: list[str] = []  # standbys with no recovery log: reported STANDBY together
        for shard_id, (slot, kv) in local.items():
            status = kv.value.code if isinstance(kv.value, pc.ReplicaStatus) else pc.ReplicaStatus.IDLE
            if status == pc.ReplicaStatus.FAILED or shard_id in self.shards or shard_id in self.standbys:
                continue
            item = self.keyspace.search(items_key(self.keyspace.root, shard_id))
            if item is None or not isinstance(item.value, pc.ShardSpec):
                continue
            spec = item.value
            hints = HintsStore(self.etcd, spec) if spec.recovery_log_prefix else None
            if slot != 0:
                if hints is None:  # nothing to follow: a standby at once
                    if status == pc.ReplicaStatus.IDLE:
                        at_once.append(shard_id)
                    continue
                log.info("shard assigned as standby", extra={"shard": shard_id, "slot": slot})
                standby = StandbyReplica(spec, self.client, hints, self.write_status)
                self.standbys[shard_id] = (standby, self._shard_tasks.spawn(f"{shard_id} standby", standby.run()))
                continue
            log.info("shard assigned as primary", extra={
                "shard": shard_id, "sources": ",".join(s.journal for s in spec.sources),
                "from_standby": shard_id in promoted})
            own: list[ShardRuntime[Any]] = []
            rt = ShardRuntime[Any](
                item.key, spec, self.app, self.client, self._own_status_writer(own), assignment=_assignment(slot, kv),
                hints=hints, player=promoted.pop(shard_id, None), hint_interval=self.config.hint_interval)
            own.append(rt)
            self.shards[shard_id] = (rt, self._shard_tasks.spawn(shard_id, rt.run_primary()))
        for player in promoted.values():  # promoted, but not started here (a FAILED status)
            await player.aclose()
        # Concurrently, STATUS_WRITES at a time: not one etcd round trip after another.
        ready = pc.ReplicaStatus(code=pc.ReplicaStatus.STANDBY)
        for at in range(0, len(at_once), STATUS_WRITES):
            results = await asyncio.gather(
                *(self.write_status(s, ready) for s in at_once[at:at + STATUS_WRITES]),
                return_exceptions=True)
            for err in results:
                if isinstance(err, BaseException):
                    raise err

    def _own_status_writer(self, own: list[ShardRuntime[Any]]) -> StatusWriter:
        """A primary's status writer: on its own assignment only (see ``write_status``)."""
        async def write(shard_id: str, status: pc.ReplicaStatus) -> None:
            await self.write_status(shard_id, status, own[0].assignment if own else None)
        return write

    async def write_status(self, shard_id: str, status: pc.ReplicaStatus,
                           expect: Assignment | None = None) -> None:
        """Writes ``status`` on this process's assignment of ``shard_id``, checked against its
        mod revision (a lost race means the assignment moved: nothing to write). With
        ``expect`` (the assignment a primary runs under), only on that same assignment: a
        primary replaced in this process (demoted, then promoted again: a new assignment) must
        not mark its successor's assignment, e.g. FAILED by the fence its successor wrote."""
        local = self._local_assignment(shard_id)
        if local is None:
            return
        kv = local[1]
        if expect is not None and expect.key and (kv.key, kv.create_revision) != (expect.key, expect.create_revision):
            log.info("status of a replaced primary not written", extra={
                "shard": shard_id, "status": pc.ReplicaStatus.Code.Name(status.code)})
            return
        resp = await txn.commit(self.etcd, [txn.Cmp(kv.key, "mod", kv.mod_revision)],
                                [txn.Put(kv.key, status.SerializeToString(), ignore_lease=True)])
        if resp.succeeded:
            name = pc.ReplicaStatus.Code.Name(status.code)
            for code in pc.ReplicaStatus.Code.keys():
                metrics.SHARD_UP.labels(shard_id, code).set(1 if code == name else 0)
            await self.keyspace.wait_for_revision(resp.header.revision)


def _assignment(slot: int, kv: KeyValue) -> Assignment:
    status = kv.value if isinstance(kv.value, pc.ReplicaStatus) else pc.ReplicaStatus()
    return Assignment(key=kv.key, slot=slot, status=status, create_revision=kv.create_revision,
                      mod_revision=kv.mod_revision)

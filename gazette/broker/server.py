"""A broker process: keyspace, announcement, allocator, replicas and servers.

``Broker.run()`` owns every long-lived task in one ``asyncio.TaskGroup``:
the keyspace watch, the allocator, the fragment persister and the servers
(grpcio on a private Unix socket, aiohttp and the public multiplexed port).
The broker announces its BrokerSpec under an etcd lease only after its
public port is bound, so the endpoint it advertises always answers.

Journal consistency is advertised by primaries, from their append pipelines
(see ``append``): once a pipeline is synchronised with its route, the route is
written into every assignment value of the journal (``update_assignments``),
and each replica's pulse makes that happen without waiting for client appends.

Shutdown (``drain()``, on SIGTERM): the announcement is updated to
``exiting`` with zero capacity, so the allocator hands every local journal to
other brokers; once none remains assigned, closed spools are persisted, the
servers stop accepting, in-flight RPCs finish, and the lease is revoked.
Journals nobody else can take are retired here: pipelines torn down, spools
completed and persisted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Any

import aetcd
import grpc
from aiohttp import web

from gazette.allocator import Announcement, allocate, announce, journal_is_consistent, keys
from gazette.broker import append as append_mod
from gazette.broker.fragment import Persister
from gazette.broker.fragment.health import StoreHealth
from gazette.broker.http_gateway import Gateway
from gazette.broker.keys import broker_decoder
from gazette.broker.metrics import metrics_app_routes
from gazette.broker.pipeline import PeerStream
from gazette.broker.replica import Replica
from gazette.broker.replicate import FailedPeerStream, GrpcPeerStream, raw_request
from gazette.broker.resolver import Resolution, Resolver
from gazette.broker.service import JournalService
from gazette.etcd import connect as etcd_connect
from gazette.etcd import txn
from gazette.etcd.keyspace import KeySpace
from gazette.fragment import Fragment
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.rpc import use_grpcio
from gazette.rpc.channel import insecure_channel
from gazette.rpc.server import RpcServer
from gazette.server.mux import Multiplexer
from gazette.stores import Stores

log = logging.getLogger(__name__)

PERSIST_BEFORE_ADVERTISE_TIMEOUT = 30.0
"""Seconds a primary waits for closed spools to persist before advertising a grown route."""
RETIRE_TIMEOUT = 30.0
"""Seconds a draining broker waits for each replica to tear down its pipeline."""

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# Peers ping their long-lived Replicate streams so that a partitioned peer (not just a dead
# process, whose socket resets) fails the pipeline within seconds; the server permits it.
_PEER_CHANNEL_OPTIONS = _CHANNEL_OPTIONS + [
    ("grpc.keepalive_time_ms", 5000), ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0),
]
_SERVER_OPTIONS = _CHANNEL_OPTIONS + [
    ("grpc.http2.min_ping_interval_without_data_ms", 4000), ("grpc.http2.max_ping_strikes", 0),
]

_ADJECTIVES = ("busy", "calm", "eager", "fuzzy", "gentle", "happy", "jolly", "lively", "merry", "proud", "quiet", "swift")
_ANIMALS = ("walrus", "otter", "badger", "heron", "lynx", "marmot", "osprey", "puffin", "tapir", "wombat", "yak", "zebu")


def random_suffix() -> str:
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_ANIMALS)}"


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    zone: str = "local"
    suffix: str = field(default_factory=random_suffix)
    file_root: str = "fragment-store"
    limit: int = 1024
    max_replication: int = 9
    etcd_address: str = "http://127.0.0.1:2379"
    etcd_prefix: str = "/gazette/cluster"
    etcd_lease: float = 20.0
    advertise_host: str | None = None
    # Append flow control, bytes per second (see broker/flow.py); max 0 is no limit.
    max_append_rate: int = 0
    min_append_rate: int = 1 << 16


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.local_id = pb.ProcessSpec.ID(zone=config.zone, suffix=config.suffix)
        self.endpoint = ""
        self.keyspace = KeySpace(config.etcd_prefix, broker_decoder(config.etcd_prefix))
        self.stores = Stores(file_root=config.file_root)
        self.persister = Persister(self.stores, self._spec_for, on_persisted=self._on_persisted)
        self.store_health = StoreHealth(self.stores)
        self.resolver = Resolver(self.keyspace, self.local_id, self._new_replica)
        self.ready = asyncio.Event()
        self.bound_port = 0
        self._spool_dir = tempfile.mkdtemp(prefix="gazette-spool-")
        self._channels: dict[str, Any] = {}  # grpc.aio.Channel-like
        self._replicate_calls: dict[str, Any] = {}
        self._etcd: aetcd.Client | None = None
        self._announcement: Announcement | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._stop = asyncio.Event()

    # -- wiring ------------------------------------------------------------------------

    @property
    def etcd(self) -> aetcd.Client:
        assert self._etcd is not None, "broker is not running"
        return self._etcd

    def _new_replica(self, journal: str, spec: pb.JournalSpec) -> Replica:
        assert self._tg is not None
        return Replica(journal, spec, self._spool_dir, self.stores, self.persister, self._tg, pulse=self._pulse)

    async def _pulse(self, replica: Replica) -> None:
        await append_mod.pulse(self, replica)

    def _spec_for(self, journal: str) -> pb.JournalSpec | None:
        kv = self.keyspace.search(keys.items_key(self.keyspace.root, journal))
        return kv.value if kv is not None else None

    def _on_persisted(self, fragment: Fragment) -> None:
        replica = (self.resolver.replicas or {}).get(fragment.journal)
        if replica is not None:
            replica.index.add_remote(fragment)

    def _channel(self, endpoint: str) -> tuple[str, Any]:
        target = endpoint.split("://", 1)[-1].rstrip("/")
        ch = self._channels.get(target)
        if ch is None:
            ch = insecure_channel(target, options=_PEER_CHANNEL_OPTIONS)
            self._channels[target] = ch
        return target, ch

    def peer_stub(self, endpoint: str) -> pb_grpc.JournalStub:
        return pb_grpc.JournalStub(self._channel(endpoint)[1])  # type: ignore[no-untyped-call]

    def dial_replicate(self, route: pb.Route, i: int) -> PeerStream:
        """Opens a Replicate stream to member ``i`` of ``route`` (requests go pre-serialized)."""
        endpoint = route.endpoints[i] if i < len(route.endpoints) else ""
        if not endpoint:
            m = route.members[i]
            return FailedPeerStream(ConnectionError(f"no endpoint for broker {m.zone}#{m.suffix}"))
        target, ch = self._channel(endpoint)
        mc = self._replicate_calls.get(target)
        if mc is None:
            mc = ch.stream_stream("/protocol.Journal/Replicate", request_serializer=raw_request,
                                  response_deserializer=pb.ReplicateResponse.FromString)
            self._replicate_calls[target] = mc
        return GrpcPeerStream(mc())

    def broker_spec(self, exiting: bool = False) -> pb.BrokerSpec:
        spec = pb.BrokerSpec(journal_limit=0 if exiting else self.config.limit, exiting=exiting)
        spec.process_spec.id.CopyFrom(self.local_id)
        spec.process_spec.endpoint = self.endpoint
        return spec

    async def run(self) -> None:
        """Runs the broker until ``stop()``; then drains and returns."""
        self._etcd = await etcd_connect(self.config.etcd_address)
        grpc_sock = os.path.join(self._spool_dir, "grpc.sock")
        grpc_server: grpc.aio.Server | RpcServer
        if use_grpcio():
            grpc_server = grpc.aio.server(options=_SERVER_OPTIONS)
            grpc_server.add_insecure_port(f"unix:{grpc_sock}")
        else:
            grpc_server = RpcServer()
        _add_journal_service(JournalService(self), grpc_server)

        app = web.Application(client_max_size=0)
        app.add_routes(metrics_app_routes(self))
        app.add_routes(Gateway(self).routes())
        app_runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await app_runner.setup()
        server = app_runner.server
        assert server is not None
        mux = Multiplexer(grpc_sock, server, h2_protocol_factory=(
            grpc_server.protocol if isinstance(grpc_server, RpcServer) else None))

        try:
            await self._load_keyspace()
            if not isinstance(grpc_server, RpcServer):
                await grpc_server.start()
            self.bound_port = await mux.start(self.config.host, self.config.port)
            adv = self.config.advertise_host or (self.config.host if self.config.host not in ("", "0.0.0.0") else socket.gethostname())
            self.endpoint = f"http://{adv}:{self.bound_port}"
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self.keyspace.watch(self.etcd), name="keyspace-watch")
                tg.create_task(self.persister.run(), name="persister")
                tg.create_task(self.store_health.run(), name="store-health")
                member_key = keys.members_key(self.config.etcd_prefix, self.local_id.zone, self.local_id.suffix)
                self._announcement = await announce(
                    self.etcd, member_key, self.broker_spec().SerializeToString(),
                    ttl=max(1, int(self.config.etcd_lease)), conflict_timeout=self.config.etcd_lease,
                )
                tg.create_task(self._announcement.keep_alive(), name="announce")
                await self.keyspace.wait_for_revision(self._announcement.revision)
                alloc_task = tg.create_task(
                    allocate(self.etcd, self.keyspace, member_key, journal_is_consistent), name="allocator"
                )
                log.info(
                    "broker started",
                    extra={"id": f"{self.local_id.zone}#{self.local_id.suffix}", "endpoint": self.endpoint},
                )
                self.ready.set()
                await self._stop.wait()
                await self._drain(alloc_task)
                raise _Shutdown()
        except* _Shutdown:
            pass
        finally:
            self.ready.clear()
            self.resolver.stop_serving()
            await mux.close()
            await grpc_server.stop(grace=5)
            await mux.abort()  # splices grpcio did not end, and the splice helper with them
            await app_runner.cleanup()
            for ch in self._channels.values():
                await ch.close()
            if self._announcement is not None:
                with contextlib.suppress(Exception):
                    await self._announcement.revoke()
            with contextlib.suppress(Exception):
                await self.etcd.close()

    async def _load_keyspace(self) -> None:
        """The first load of the keyspace, retried while etcd is transiently unreachable
        (a connection refused or cut under load) for up to the etcd lease."""
        deadline = asyncio.get_running_loop().time() + max(5.0, self.config.etcd_lease)
        delay = 0.05
        while True:
            try:
                await self.keyspace.load(self.etcd)
                return
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or asyncio.get_running_loop().time() >= deadline:
                    raise
                log.warning("etcd unavailable at start; retrying", extra={"err": err.details()})
            await asyncio.sleep(delay)  # a retry back-off, not a synchronisation
            delay = min(1.0, delay * 2)

    async def _drain(self, alloc_task: asyncio.Task[Any]) -> None:
        """Zero capacity, wait for the allocator to hand off every journal, persist spools."""
        assert self._announcement is not None
        log.info("broker draining: announcing exiting with zero capacity")
        await self._announcement.update(self.broker_spec(exiting=True).SerializeToString())
        while self.resolver.replicas and self._others_can_take_over():
            await self.keyspace.wait_for_update()
        alloc_task.cancel()
        # Journals still held (no other broker could take them) are released here: their
        # pipelines are torn down (in-flight appends finish first) and their spools completed
        # and persisted below, so a later primary starts after them.
        held = list((self.resolver.replicas or {}).values())
        await asyncio.gather(*(r.shutdown(RETIRE_TIMEOUT) for r in held))
        await self.resolver.wait_retired(RETIRE_TIMEOUT)
        await self.persister.finish()

    async def update_assignments(self, replica: Replica, res: Resolution) -> int:
        """Advertises ``res.route`` (synchronised by the caller's pipeline) in every assignment
        value of the journal, in one transaction checked against their mod revisions
        (Gazette's updateAssignments). Returns the revision to read through: the
        transaction's, or (if it lost a race) the next one under our root.

        Before advertising a route of several members which some member joined, spools
        closed by the synchronisation are persisted (bounded by a timeout): the allocator may
        then move the primary to the new member, which never held the older content and must
        find it in the store.
        """
        route = pb.Route()
        route.CopyFrom(res.route)
        del route.endpoints[:]
        advertised = {(m.zone, m.suffix) for kv in res.assignments if isinstance(kv.value, pb.Route)
                      for m in kv.value.members}
        joined = any((m.zone, m.suffix) not in advertised for m in route.members)
        if len(route.members) > 1 and joined and replica.spec.fragment.stores:
            try:
                async with asyncio.timeout(PERSIST_BEFORE_ADVERTISE_TIMEOUT):
                    await self.persister.persist_all_and_wait()
            except TimeoutError:
                log.warning("advertising route before closed spools were persisted", extra={"journal": replica.journal})
        value = route.SerializeToString()
        # Checked against every assignment's mod revision; only values that differ are put
        # (keeping each assignment's lease).
        cmps = [txn.Cmp(kv.key, "mod", kv.mod_revision) for kv in res.assignments]
        ops: list[txn.Op] = []
        for kv in res.assignments:
            v = kv.value
            if not (isinstance(v, pb.Route) and v.primary == route.primary and list(v.members) == list(route.members)):
                ops.append(txn.Put(kv.key, value, ignore_lease=True))
        if not ops:
            return int(res.header.etcd.revision)
        resp = await txn.commit(self.etcd, cmps, ops)
        if not resp.succeeded:
            # Lost a race (e.g. with the allocator): the winning write is under our root,
            # after the resolution's revision. (etcd's header revision may be far beyond
            # anything under our root, which the keyspace would never reach.)
            return int(res.header.etcd.revision) + 1
        return int(resp.header.revision)

    def _others_can_take_over(self) -> bool:
        """Whether another live broker has capacity to take this one's journals."""
        me = keys.members_key(self.keyspace.root, self.local_id.zone, self.local_id.suffix)
        for kv in self.keyspace.prefixed(keys.members_prefix(self.keyspace.root)):
            spec = kv.value
            if kv.key != me and isinstance(spec, pb.BrokerSpec) and spec.journal_limit > 0 and not spec.exiting:
                return True
        return False

    def stop(self) -> None:
        self._stop.set()

    # -- journal specs -----------------------------------------------------------------

    def list_journals(self, selector: labels.LabelSelector) -> tuple[pb.ListResponse, tuple[int, int]]:
        resp = pb.ListResponse(status=pb.OK)
        resp.header.CopyFrom(self.resolver.header())
        resp.header.ClearField("process_id")
        items_prefix = keys.items_key(self.keyspace.root, "")
        max_mod = -1
        for kv in self.keyspace.prefixed(items_prefix):
            spec: pb.JournalSpec | None = kv.value
            if spec is None:
                continue
            if not selector.matches(labels.with_meta_labels(labels.LabelSet.from_proto(spec.labels), spec.name)):
                continue
            j = resp.journals.add(mod_revision=kv.mod_revision, create_revision=kv.create_revision)
            j.spec.CopyFrom(spec)
            j.route.CopyFrom(self.resolver.route_of(list(self.keyspace.prefixed(f"{self.keyspace.root}/assign/{spec.name}#"))))
            max_mod = max(max_mod, kv.mod_revision)
        return resp, (len(resp.journals), max_mod)

    async def apply_journals(self, req: pb.ApplyRequest,
                             unchanged: list[tuple[str, int]] | None = None) -> pb.ApplyResponse:
        """Applies journal spec changes in one etcd transaction; ``unchanged`` adds (key,
        mod revision) comparisons (a suspension also requires the assignments unchanged)."""
        root = self.keyspace.root
        changes = [
            txn.ItemChange(keys.items_key(root, ch.upsert.name), ch.upsert.SerializeToString(), ch.expect_mod_revision)
            if ch.HasField("upsert") else txn.ItemChange(keys.items_key(root, ch.delete), None, ch.expect_mod_revision)
            for ch in req.changes
        ]
        resp = await txn.apply_changes(self.etcd, changes, [txn.Cmp(k, "mod", rev) for k, rev in (unchanged or [])])
        out = pb.ApplyResponse(status=pb.OK if resp.succeeded else pb.ETCD_TRANSACTION_FAILED)
        if resp.succeeded:
            await self.keyspace.wait_for_revision(resp.header.revision)
        out.header.CopyFrom(self.resolver.header())
        return out

    async def update_suspend(self, res: Any, level: int, offset: int) -> int:
        """Revision-checked update of a journal's suspension; returns the revision to read through."""
        assert res.spec is not None
        spec = pb.JournalSpec()
        spec.CopyFrom(res.spec)
        spec.suspend.level = level  # type: ignore[assignment]
        spec.suspend.offset = offset
        req = pb.ApplyRequest()
        req.changes.add(expect_mod_revision=res.item_mod_revision, upsert=spec)
        out = await self.apply_journals(req, [(kv.key, kv.mod_revision) for kv in res.assignments])
        if out.status != pb.OK:
            # Lost a race: whatever changed is under our root, after the resolution's revision.
            return int(res.header.etcd.revision) + 1
        return int(out.header.etcd.revision)


class _Shutdown(Exception):
    pass


def _add_journal_service(svc: JournalService, server: grpc.aio.Server | RpcServer) -> None:
    """Registers the ``protocol.Journal`` service, as the generated code would, except that
    Replicate receives its requests as raw bytes (decoded by ``replicate.decode_request``)
    and Append's content chunks are views (``append.decode_append_request``): neither copies
    content."""
    from google.protobuf import message_factory

    desc = pb.DESCRIPTOR.services_by_name["Journal"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for m in desc.methods:
        req_cls = message_factory.GetMessageClass(m.input_type)
        resp_cls = message_factory.GetMessageClass(m.output_type)
        deserializer = {"Replicate": None, "Append": append_mod.decode_append_request}.get(m.name, req_cls.FromString)
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = kind(getattr(svc, m.name), request_deserializer=deserializer,
                                response_serializer=resp_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))
    server.add_registered_method_handlers(desc.full_name, handlers)

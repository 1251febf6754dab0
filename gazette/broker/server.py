"""A broker process: a member process (``gazette.server.process``) serving journals.

``Broker`` is a :class:`~gazette.server.process.MemberProcess` whose items are journals: it
registers the Journal service (with zero-copy decoders for Append and Replicate) and the HTTP
gateway on the shared one-port server, announces a BrokerSpec, runs the persister and store
health checks as owned tasks, and holds a replica per assigned journal. It implements
``gazette.broker.context.BrokerContext``, which is all the handlers see of it.

Journal consistency is advertised by primaries, from their append pipelines
(see ``append``): once a pipeline is synchronised with its route, the route is
written into every assignment value of the journal (``update_assignments``),
and each replica's pulse makes that happen without waiting for client appends.

Shutdown (on SIGTERM): the announcement is updated to ``exiting`` with zero capacity, so the
allocator hands every local journal to other brokers; once none remains assigned, closed spools
are persisted, the servers stop accepting, in-flight RPCs finish, and the lease is revoked.
Journals nobody else can take are retired here (``drain``): pipelines torn down, spools
completed and persisted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from aiohttp import web

from gazette.allocator import item_route_bytes, journal_is_consistent, keys
from gazette.auth import NO_AUTH, Claims, KeyedAuth, Verifier
from gazette.broker import append as append_mod
from gazette.broker import wire
from gazette.broker.config import BrokerConfig
from gazette.broker.group_commit import AppendGroups
from gazette.broker.health import HealthTicker
from gazette.broker.http_gateway import Gateway
from gazette.broker.keys import broker_decoder
from gazette.broker.persister import Persister
from gazette.broker.pipeline import PeerStream
from gazette.broker.replica import Replica
from gazette.broker.replicate import FailedPeerStream, GrpcPeerStream
from gazette.broker.resolver import Resolution, Resolver
from gazette.broker.service import JournalService
from gazette.broker.store_health import StoreHealth
from gazette.client.channels import ChannelPool
from gazette.etcd import txn
from gazette.etcd.keyspace import KeySpace
from gazette.fragment import Fragment
from gazette.fragment.stores import Stores
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.rpc.channel import insecure_channel
from gazette.rpc.server import RpcServer
from gazette.server import cluster
from gazette.server.grpc import CHANNEL_OPTIONS, GrpcServer, add_service
from gazette.server.process import MemberProcess

log = logging.getLogger(__name__)

PERSIST_BEFORE_ADVERTISE_TIMEOUT = 30.0
"""Seconds a primary waits for closed spools to persist before advertising a grown route."""
RETIRE_TIMEOUT = 30.0
"""Seconds a draining broker waits for each replica to tear down its pipeline."""

# Peers ping their long-lived Replicate streams so that a partitioned peer (not just a dead
# process, whose socket resets) fails the pipeline within seconds; the server permits it.
_PEER_CHANNEL_OPTIONS = CHANNEL_OPTIONS + [
    ("grpc.keepalive_time_ms", 5000), ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0),
]

class Broker(MemberProcess):
    """A broker process: a member process serving the Journal service and its HTTP gateway,
    holding replicas of the journals assigned to it. It implements ``BrokerContext``, what
    the RPC handlers use."""

    kind = "broker"

    def __init__(self, config: BrokerConfig) -> None:
        super().__init__(
            zone=config.zone, suffix=config.suffix, host=config.host, port=config.port,
            etcd_address=config.etcd_address, etcd_lease=config.etcd_lease, etcd_tls=config.etcd_tls,
            keyspace=KeySpace(config.etcd_prefix, broker_decoder(config.etcd_prefix)),
            is_consistent=journal_is_consistent, advertise_host=config.advertise_host,
            tls=config.tls, limits=config.limits,
        )
        self.config = config
        self.auth = KeyedAuth(config.auth_keys) if config.auth_keys else None
        self.verifier: Verifier = self.auth if self.auth is not None else NO_AUTH
        self.stores = Stores(file_root=config.file_root)
        self.persister = Persister(self.stores, self._spec_for, on_persisted=self._on_persisted)
        self.store_health = StoreHealth(self.stores)
        self.health = HealthTicker(config.health_interval)
        self.resolver = Resolver(self.keyspace, self.local_id, self._new_replica)
        # Peers' calls carry tokens this broker signs for the capability they need.
        self.peers = ChannelPool(_PEER_CHANNEL_OPTIONS, insecure_channel, config.peer_tls, self.auth)
        self._replicate_calls: dict[str, Any] = {}

    # -- wiring ------------------------------------------------------------------------

    def _new_replica(self, journal: str, spec: pb.JournalSpec) -> Replica:
        return Replica(journal, spec, self.scratch_dir, self.stores, self.persister, self.tasks, pulse=self._pulse,
                       auto_suspend=self.config.auto_suspend, ticker=self.health)

    async def _pulse(self, replica: Replica, suspend_if_flushed: bool) -> None:
        await append_mod.pulse(self, replica, suspend_if_flushed)

    def _spec_for(self, journal: str) -> pb.JournalSpec | None:
        kv = self.keyspace.search(keys.items_key(self.keyspace.root, journal))
        return kv.value if kv is not None else None

    def _on_persisted(self, fragment: Fragment) -> None:
        replica = (self.resolver.replicas or {}).get(fragment.journal)
        if replica is not None:
            replica.index.add_remote(fragment)

    def peer_stub(self, endpoint: str) -> pb_grpc.JournalStub:
        return self.peers.stub(endpoint, pb_grpc.JournalStub)

    def dial_replicate(self, route: pb.Route, i: int) -> PeerStream:
        """Opens a Replicate stream to member ``i`` of ``route`` (requests go pre-serialized)."""
        endpoint = route.endpoints[i] if i < len(route.endpoints) else ""
        if not endpoint:
            m = route.members[i]
            return FailedPeerStream(ConnectionError(f"no endpoint for broker {m.zone}#{m.suffix}"))
        mc = self._replicate_calls.get(endpoint)
        if mc is None:
            mc = self.peers.channel(endpoint).stream_stream(
                "/protocol.Journal/Replicate", request_serializer=wire.raw_request,
                response_deserializer=pb.ReplicateResponse.FromString)
            self._replicate_calls[endpoint] = mc
        return GrpcPeerStream(mc())

    def broker_spec(self, exiting: bool = False) -> pb.BrokerSpec:
        spec = pb.BrokerSpec(journal_limit=0 if exiting else self.config.limit, exiting=exiting)
        spec.process_spec.id.CopyFrom(self.local_id)
        spec.process_spec.endpoint = self.endpoint
        return spec

    # -- member process hooks ----------------------------------------------------------

    def register_services(self, server: GrpcServer) -> None:
        # Replicate receives its requests as raw bytes (decoded by ``wire.decode_request``) and
        # Append's content chunks are views (``wire.decode_append_request``): neither copies.
        # On our transport Append is served by the compiled servicer itself, bound to this
        # broker: the call's task awaits compiled code with no interpreted coroutine between
        # them, which every resumption of an append would pass through (JournalService.Append
        # is the same call; grpcio's server, which tells a coroutine function by its code
        # flags, keeps it).
        ours = isinstance(server, RpcServer)
        add_service(server, pb.DESCRIPTOR.services_by_name["Journal"], JournalService(self),
                    {"Replicate": None, "Append": wire.decode_append_request},
                    {"Append": functools.partial(append_mod.serve_append, self)} if ours else None)
        if ours:  # whole Append calls of one read commit together
            server.add_batch_servicer("/protocol.Journal/Append", AppendGroups(self))

    def http_routes(self) -> list[web.RouteDef]:
        return Gateway(self).routes()

    def member_spec(self, exiting: bool = False) -> bytes:
        return self.broker_spec(exiting).SerializeToString()

    def has_capacity(self, spec: Any) -> bool:
        return isinstance(spec, pb.BrokerSpec) and spec.journal_limit > 0 and not spec.exiting

    def holds_items(self) -> bool:
        return bool(self.resolver.replicas)

    def start_tasks(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self.persister.run(), name="persister")
        tg.create_task(self.store_health.run(), name="store-health")
        tg.create_task(self.health.run(), name="health-ticker")

    async def drain(self) -> None:
        """Journals still held (no other broker could take them) are released here: their
        pipelines are torn down (in-flight appends finish first) and their spools completed
        and persisted, so a later primary starts after them."""
        held = list((self.resolver.replicas or {}).values())
        await asyncio.gather(*(r.shutdown(RETIRE_TIMEOUT) for r in held))
        await self.resolver.wait_retired(RETIRE_TIMEOUT)
        await self.persister.finish()

    def stopping(self) -> None:
        self.resolver.stop_serving()

    async def closed(self) -> None:
        self._replicate_calls.clear()
        await self.peers.close()

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

    # -- journal specs -----------------------------------------------------------------

    def list_journals(self, selector: labels.LabelSelector, claims: Claims | None = None,
                      page_size: int = 1 << 62) -> tuple[list[bytes], tuple[int, int]]:
        """The journals ``selector`` and ``claims`` match, as serialized ListResponses of
        ``page_size`` journals at most (the first carries the status and header), and a key
        of the answer (count, greatest mod revision) that changes when it does.

        Pages are built from bytes (``wire.list_journal``: the spec as etcd holds it, the
        route as the route cache serialized it), not by copying protobuf messages: at 50,000
        journals that was most of a List's time."""
        first = pb.ListResponse(status=pb.OK)
        first.header.CopyFrom(self.resolver.header())
        first.header.ClearField("process_id")
        ks = self.keyspace
        pages: list[bytes] = []
        page = [first.SerializeToString()]
        max_mod, n, in_page = -1, 0, 0
        for kv, name in cluster.matching_items(ks, pb.JournalSpec, selector, claims, labels.with_meta_labels):
            if in_page == page_size:
                pages.append(b"".join(page))
                page, in_page = [], 0
            mod = kv.mod_revision
            page.append(wire.list_journal(kv.raw, mod, item_route_bytes(ks, name), kv.create_revision))
            max_mod = mod if mod > max_mod else max_mod
            n += 1
            in_page += 1
        pages.append(b"".join(page))
        return pages, (n, max_mod)

    async def apply_journals(self, req: pb.ApplyRequest,
                             unchanged: list[tuple[str, int]] | None = None) -> pb.ApplyResponse:
        """Applies journal spec changes in one etcd transaction; ``unchanged`` adds (key,
        mod revision) comparisons (a suspension also requires the assignments unchanged)."""
        changes = [cluster.SpecChange.of(ch, "name") for ch in req.changes]
        applied = await cluster.apply_spec_changes(self.etcd, self.keyspace, changes, unchanged or ())
        out = pb.ApplyResponse(status=pb.OK if applied else pb.ETCD_TRANSACTION_FAILED)
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

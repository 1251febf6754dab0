"""Resolving a shard to the process that serves it (Gazette's ``consumer/resolver.go``).

``Resolver.resolve(shard_id, ...)`` answers where a request about a shard must go: to the
local primary (with its ``ShardRuntime`` and store, once they are ready and have read through
the requested offsets), or to the remote primary (the resolution's header carries the route
and the primary's process ID, to forward with the request), or nowhere (a status).

This is the seam an application's own APIs use to serve reads of shard state wherever the
request lands (Gazette's ``Service.Loopback`` pattern): resolve, then serve locally or call the
same API at ``Resolution.endpoint`` with ``Resolution.header`` attached.

Invariants:

* A proxied request (``proxy_header`` given) is resolved no earlier than the etcd revision its
  sender resolved at, and is refused if it reached a process other than the one intended or
  came from another etcd cluster: a second hop never happens.
* A local resolution is OK only once the shard's store is restored and its transaction loop
  runs; if the shard ends meanwhile the status is SHARD_STOPPED.
* ``read_through`` offsets of journals the shard does not read are ignored; the others block
  the resolution until a completed transaction read through them.
* Errors (status other than OK) carry this process's ID as the header's process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gazette.allocator.keys import (
    item_assignments_prefix,
    items_key,
    items_prefix,
    members_key,
    parse_assignment_key,
)
from gazette.consumer.errors import ConsumerError
from gazette.consumer.interfaces import MessageProducer
from gazette.consumer.shard import ShardRuntime
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.tasks import wait_first

__all__ = ["ProxyError", "Resolution", "Resolver", "ResolverHost"]


class ProxyError(ConsumerError):
    """A proxied request reached the wrong process or the wrong etcd cluster."""

    grpc_code = "FAILED_PRECONDITION"


class ResolverHost(Protocol):
    """What the resolver needs of its consumer process."""

    local_id: pb.ProcessSpec.ID
    keyspace: KeySpace
    shards: dict[str, tuple[ShardRuntime[Any], asyncio.Task[None]]]

    async def wait_reconciled(self) -> None:
        """Returns after the next reconcile of local shards with the keyspace."""
        ...


@dataclass
class Resolution:
    status: int  # a pc.Status value
    header: pb.Header
    spec: pc.ShardSpec | None = None
    shard: ShardRuntime[Any] | None = None  # the local primary, or None
    endpoint: str = ""  # the primary's endpoint, when remote

    @property
    def store(self) -> Any:
        return self.shard.store if self.shard is not None else None


def route_of(ks: KeySpace, shard_id: str) -> tuple[pb.Route, list[pc.ReplicaStatus]]:
    """The shard's route (members, primary, endpoints) and replica statuses, from ``ks``."""
    route, statuses = pb.Route(primary=-1), []
    for kv in ks.prefixed(item_assignments_prefix(ks.root, shard_id)):
        a = parse_assignment_key(ks.root, kv.key)
        if a.slot == 0:
            route.primary = len(route.members)
        route.members.add(zone=a.zone, suffix=a.suffix)
        member = ks.search(members_key(ks.root, a.zone, a.suffix))
        route.endpoints.append(member.value.process_spec.endpoint
                               if member is not None and member.value else "")
        statuses.append(kv.value if isinstance(kv.value, pc.ReplicaStatus) else pc.ReplicaStatus())
    return route, statuses


class Resolver:
    def __init__(self, host: ResolverHost) -> None:
        self.host = host

    async def resolve(self, shard_id: str, *, may_proxy: bool = True,
                      proxy_header: pb.Header | None = None,
                      read_through: Mapping[str, int] | None = None) -> Resolution:
        host, ks = self.host, self.host.keyspace
        local = host.local_id
        if proxy_header is not None:
            if proxy_header.etcd.cluster_id and proxy_header.etcd.cluster_id != ks.header.cluster_id:
                raise ProxyError(f"request etcd cluster_id doesn't match our own "
                                 f"({proxy_header.etcd.cluster_id} vs {ks.header.cluster_id})")
            pid = proxy_header.process_id
            if (pid.zone or pid.suffix) and (pid.zone, pid.suffix) != (local.zone, local.suffix):
                raise ProxyError(f"request process_id doesn't match our own ({pid.zone}/{pid.suffix} "
                                 f"vs {local.zone}/{local.suffix})")
            if proxy_header.etcd.revision > ks.header.revision:
                await ks.wait_for_revision(proxy_header.etcd.revision)
        while True:
            res = self._resolve_now(shard_id, may_proxy)
            if res.status != pc.Status.OK or res.endpoint:
                return res
            entry = host.shards.get(shard_id)
            if entry is not None:
                break
            # Assigned here, but the shard is not started yet: wait for the next reconcile.
            await host.wait_reconciled()
        rt, task = entry
        if not rt.ready.is_set():
            await wait_first(rt.ready.wait(), task)
            if not rt.ready.is_set():
                return self._stopped(res)
        if isinstance(rt.app, MessageProducer):  # the app says what its shard must read
            wanted = dict(rt.app.read_through(rt, rt.store, dict(read_through or {})))
        else:
            sources = {s.journal for s in rt.spec.sources}
            wanted = {j: o for j, o in (read_through or {}).items() if j in sources and o}
        while True:
            done, _ = rt.progress()
            if all(done.get(j, 0) >= o for j, o in wanted.items()):
                break
            if task.done():
                return self._stopped(res)
            await wait_first(rt.progressed.wait(), task)
        if task.done():
            return self._stopped(res)
        res.shard = rt
        return res

    def shards_with_source(self, journal: str) -> list[pc.ShardSpec]:
        """The specs of the shards reading ``journal`` (Gazette's ``ShardsWithSource``): how an
        app maps a key, through the journal its messages go to, to the shard that owns it."""
        ks = self.host.keyspace
        out = []
        for kv in ks.prefixed(items_prefix(ks.root)):
            if isinstance(kv.value, pc.ShardSpec) and any(s.journal == journal for s in kv.value.sources):
                out.append(kv.value)
        return out

    def _resolve_now(self, shard_id: str, may_proxy: bool) -> Resolution:
        ks, local = self.host.keyspace, self.host.local_id
        hdr = pb.Header()
        hdr.etcd.CopyFrom(ks.header.to_proto())
        item = ks.search(items_key(ks.root, shard_id))
        spec = item.value if item is not None and isinstance(item.value, pc.ShardSpec) else None
        route = route_of(ks, shard_id)[0] if spec is not None else pb.Route(primary=-1)
        hdr.route.CopyFrom(route)
        res = Resolution(pc.Status.OK, hdr, spec)
        primary = route.members[route.primary] if route.primary != -1 else None
        if spec is None:
            res.status = pc.Status.SHARD_NOT_FOUND
        elif primary is None:
            res.status = pc.Status.NO_SHARD_PRIMARY
        elif (primary.zone, primary.suffix) != (local.zone, local.suffix):
            if not may_proxy:
                res.status = pc.Status.NOT_SHARD_PRIMARY
            else:
                hdr.process_id.CopyFrom(primary)
                res.endpoint = route.endpoints[route.primary]
                return res
        hdr.process_id.CopyFrom(local)  # the local primary, or the author of an error status
        return res

    def _stopped(self, res: Resolution) -> Resolution:
        res.status = pc.Status.SHARD_STOPPED
        res.header.process_id.CopyFrom(self.host.local_id)
        return res


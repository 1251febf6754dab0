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
  sender resolved at, and is refused if it reached a process other than the one intended
  (``MisroutedRequest``, UNAVAILABLE: the sender retries once its route updates) or came from
  another etcd cluster (``ForeignCluster``): a second hop never happens. The check, the route
  (endpoints attached) and the header are the broker resolver's own (``gazette.server.cluster``,
  ``gazette.allocator.item_route``).
* A local resolution is OK only once the shard's store is restored and its transaction loop
  runs; if the shard ends meanwhile the status is SHARD_STOPPED.
* ``read_through`` offsets of journals the shard does not read are ignored; the others block
  the resolution until a completed transaction read through them.
* Errors (status other than OK) carry this process's ID as the header's process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gazette.allocator import item_route
from gazette.allocator.keys import items_key, items_prefix
from gazette.consumer.interfaces import MessageProducer
from gazette.consumer.shard import ShardRuntime
from gazette.etcd.keyspace import KeySpace, KeyValue
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.server import cluster
from gazette.tasks import wait_first

__all__ = ["Resolution", "Resolver", "ResolverHost", "replica_statuses"]


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
    """Where a shard's request goes: its status and, for a local primary, the shard;
    for a remote one, the endpoint to proxy to."""

    status: int  # a pc.Status value
    header: pb.Header
    spec: pc.ShardSpec | None = None
    shard: ShardRuntime[Any] | None = None  # the local primary, or None
    endpoint: str = ""  # the primary's endpoint, when remote ("" if it has none in the keyspace)
    proxied: bool = False  # the primary is another process: forward to ``endpoint``

    @property
    def store(self) -> Any:
        return self.shard.store if self.shard is not None else None


def replica_statuses(assignments: Sequence[KeyValue]) -> list[pc.ReplicaStatus]:
    """The status of each assignment (IDLE where none was written), in route member order."""
    return [kv.value if isinstance(kv.value, pc.ReplicaStatus) else pc.ReplicaStatus() for kv in assignments]


class Resolver:
    def __init__(self, host: ResolverHost) -> None:
        self.host = host

    async def resolve(self, shard_id: str, *, may_proxy: bool = True,
                      proxy_header: pb.Header | None = None,
                      read_through: Mapping[str, int] | None = None) -> Resolution:
        host, ks = self.host, self.host.keyspace
        revision = cluster.check_proxy_header(ks, host.local_id, proxy_header)
        if revision > ks.header.revision:
            await ks.wait_for_revision(revision)
        while True:
            res = self._resolve_now(shard_id, may_proxy)
            if res.status != pc.Status.OK or (res.proxied and res.endpoint):
                return res
            entry = None if res.proxied else host.shards.get(shard_id)
            if entry is not None:
                break
            # Assigned here but not started yet, or primary elsewhere but its member spec (its
            # endpoint) not yet in the keyspace: wait for the next reconcile, then resolve again.
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
        item = ks.search(items_key(ks.root, shard_id))
        spec = item.value if item is not None and isinstance(item.value, pc.ShardSpec) else None
        route = item_route(ks, shard_id)[0] if spec is not None else pb.Route(primary=-1)
        hdr = cluster.response_header(ks, local, route)  # the local primary, or the author of an error status
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
                res.endpoint = route.endpoints[route.primary] if route.endpoints else ""
                res.proxied = True
        return res

    def _stopped(self, res: Resolution) -> Resolution:
        res.status = pc.Status.SHARD_STOPPED
        res.header.process_id.CopyFrom(self.host.local_id)
        return res


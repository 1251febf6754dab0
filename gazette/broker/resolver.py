"""Resolution of a journal name to its spec, route and local replica.

The resolver reads the broker's keyspace (items, members and assignments under
Gazette's key layout) at one revision and answers, for a journal:

* the JournalSpec (or JOURNAL_NOT_FOUND),
* its Route: assigned members sorted by (zone, suffix), the primary's index
  (the member of slot 0, else -1) and each member's endpoint,
* the local Replica when this broker is assigned the journal,
* a Status per Gazette's rules for reads (any member) and appends (primary).

Invariants: a resolution is computed under one keyspace revision and carries
it in its Header; it is immutable, and cached until the revision or the set of
local replicas changes (appends resolve their journal at every RPC); a request that names a later revision waits for the
keyspace to reach it first. A request proxied by a peer must come from the
same etcd cluster and be addressed to this broker (its header's process ID).
The set of local replicas is updated by a keyspace observer, in revision
order, so a replica exists exactly while the local broker holds an assignment
of its journal (and its item's create revision is unchanged: a journal
deleted and re-created is a new replica). Whenever a journal's assignments
change (keys or values), its replica's route signal fires, so RPCs waiting
under the older resolution (its ``signal``) resolve again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from gazette.allocator import item_route, keys
from gazette.auth import Claims
from gazette.broker.replica import Replica
from gazette.errors import GazetteError
from gazette.etcd.keyspace import KeyLayoutError, KeySpace, KeyValue
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb
from gazette.server import cluster

__all__ = ["Resolution", "Resolver", "ResolverStopped", "route_key"]

log = logging.getLogger(__name__)


class ResolverStopped(GazetteError):
    """The resolver no longer serves local replicas (the broker is shutting down): transient,
    the client retries elsewhere."""

    grpc_code = "UNAVAILABLE"


@dataclass
class Resolution:
    status: int
    header: pb.Header
    local_id: pb.ProcessSpec.ID
    spec: pb.JournalSpec | None = None
    item_mod_revision: int = 0
    item_create_revision: int = 0
    replica: Replica | None = None
    assignments: list[KeyValue] = field(default_factory=list)
    signal: asyncio.Event | None = None  # set once this resolution's assignments change
    # What an append reads of ``spec``, taken once (``gazette.broker.append.AppendPlan``):
    # a resolution is cached for its keyspace revision, so appends share it.
    append_plan: object | None = None

    @property
    def route(self) -> pb.Route:
        return self.header.route

    @cached_property
    def is_local(self) -> bool:
        return self.header.process_id == self.local_id

    @cached_property
    def route_key(self) -> tuple[int, tuple[tuple[str, str], ...]]:
        """The route's primary and members, comparable cheaply (endpoints aside)."""
        return route_key(self.route)

    @cached_property
    def advertised(self) -> bool:
        """Every assignment's value is this route (Gazette's
        JournalRouteMatchesAssignments): the journal is consistent."""
        key = self.route_key
        return all(isinstance(kv.value, pb.Route) and route_key(kv.value) == key for kv in self.assignments)


def route_key(route: pb.Route) -> tuple[int, tuple[tuple[str, str], ...]]:
    return int(route.primary), tuple((m.zone, m.suffix) for m in route.members)


def _id_key(pid: pb.ProcessSpec.ID) -> tuple[str, str]:
    return (pid.zone, pid.suffix)


class Resolver:
    def __init__(
        self,
        keyspace: KeySpace,
        local_id: pb.ProcessSpec.ID,
        new_replica: Callable[[str, pb.JournalSpec], Replica],
    ) -> None:
        self.ks = keyspace
        self.local_id = local_id
        self._new_replica = new_replica
        self.replicas: dict[str, Replica] | None = {}
        self._create_revs: dict[str, int] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._cache: dict[tuple[str, bool, bool], Resolution] = {}
        self._cache_rev = -1
        keyspace.observers.append(self.update_replicas)

    def _item_key(self, journal: str) -> str:
        return keys.items_key(self.ks.root, journal)

    def header(self, route: pb.Route | None = None, process_id: pb.ProcessSpec.ID | None = None) -> pb.Header:
        return cluster.response_header(self.ks, process_id if process_id is not None else self.local_id, route)

    async def resolve(
        self,
        journal: str,
        *,
        may_proxy: bool,
        require_primary: bool,
        min_etcd_revision: int = 0,
        proxy_header: pb.Header | None = None,
        claims: Claims | None = None,
    ) -> Resolution:
        """Resolves ``journal``; a journal ``claims`` do not reach resolves as not found (a
        token scoped elsewhere learns nothing of it, as in Gazette)."""
        res = self.cached(journal, may_proxy=may_proxy, require_primary=require_primary,
                          min_etcd_revision=min_etcd_revision, proxy_header=proxy_header, claims=claims)
        if res is None:
            res = self._scoped(
                await self._resolve(journal, may_proxy, require_primary, min_etcd_revision, proxy_header), claims)
        return res

    def cached(
        self,
        journal: str,
        *,
        may_proxy: bool,
        require_primary: bool,
        min_etcd_revision: int = 0,
        proxy_header: pb.Header | None = None,
        claims: Claims | None = None,
    ) -> Resolution | None:
        """:meth:`resolve`'s steady state, with no coroutine to make: the resolution of the
        current revision if one is cached and nothing asks for more (a later revision, a
        proxied request's header), scoped by ``claims`` as ``resolve`` scopes it; else None."""
        if proxy_header is not None or not min_etcd_revision <= self._cache_rev == self.ks.revision:
            return None
        res = self._cache.get((journal, may_proxy, require_primary))
        if res is None or claims is None or claims.unrestricted:
            return res  # (what _scoped returns for them, without the call)
        return self._scoped(res, claims)

    def _scoped(self, res: Resolution, claims: Claims | None) -> Resolution:
        if claims is not None and res.spec is not None and not claims.unrestricted and not claims.permits(
                labels.with_meta_labels(labels.LabelSet.from_proto(res.spec.labels), res.spec.name)):
            return Resolution(status=pb.JOURNAL_NOT_FOUND, header=self.header(), local_id=self.local_id,
                              spec=None, item_mod_revision=0, item_create_revision=0, assignments=[])
        return res

    async def _resolve(self, journal: str, may_proxy: bool, require_primary: bool,
                       min_etcd_revision: int, proxy_header: pb.Header | None) -> Resolution:
        journal = journal.split(";", 1)[0]  # strip Gazette's ";meta" suffix
        min_etcd_revision = max(min_etcd_revision, cluster.check_proxy_header(self.ks, self.local_id, proxy_header))
        if min_etcd_revision > self.ks.revision:
            await self.ks.wait_for_revision(min_etcd_revision)

        rev = self.ks.revision
        if rev != self._cache_rev:
            self._cache.clear()
            self._cache_rev = rev
        key = (journal, may_proxy, require_primary)
        cached = self._cache.get(key)
        if cached is not None:
            return cached

        route, assignments = item_route(self.ks, journal)
        item = self.ks.search(self._item_key(journal))
        spec: pb.JournalSpec | None = item.value if item is not None else None

        process_id = pb.ProcessSpec.ID()
        if require_primary and route.primary != -1:
            process_id.CopyFrom(route.members[route.primary])
        elif not require_primary:
            for m in route.members:
                if _id_key(m) == _id_key(self.local_id):
                    process_id.CopyFrom(self.local_id)
            if not process_id.zone and len(route.members) > 0 and may_proxy:
                # Reads may be served by any member: prefer the primary.
                pick = route.primary if route.primary != -1 else 0
                process_id.CopyFrom(route.members[pick])

        res = Resolution(
            status=pb.OK,
            header=self.header(route, process_id),
            local_id=self.local_id,
            spec=spec,
            item_mod_revision=item.mod_revision if item is not None else 0,
            item_create_revision=item.create_revision if item is not None else 0,
            assignments=list(assignments),
        )
        is_local = _id_key(process_id) == _id_key(self.local_id)
        if is_local and self.replicas is None:
            raise ResolverStopped("resolver has stopped serving local replicas")
        if self.replicas is not None and journal in self.replicas:
            res.replica = self.replicas[journal]
            res.signal = res.replica.route_signal

        if spec is None:
            res.status = pb.JOURNAL_NOT_FOUND
        elif spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            res.status = pb.SUSPENDED
        elif require_primary and route.primary == -1:
            res.status = pb.NO_JOURNAL_PRIMARY_BROKER
        elif len(route.members) == 0:
            res.status = pb.INSUFFICIENT_JOURNAL_BROKERS
        elif not may_proxy and not is_local:
            res.status = pb.NOT_JOURNAL_PRIMARY_BROKER if require_primary else pb.NOT_JOURNAL_BROKER
        if res.status != pb.OK:
            res.header.process_id.CopyFrom(self.local_id)
        self._cache[key] = res
        return res

    def update_replicas(self) -> None:
        """Keyspace observer: start replicas of newly-assigned journals, stop revoked ones,
        and signal replicas whose journal's assignments changed.

        Works on the journals the update touched (`KeySpace.changed`: their items or
        assignments), each through its own key range, so a change costs O(changed * log n),
        not O(n): with 10,000 journals every broker sees every allocator write. After a load
        (`changed` None) it walks every assigned or held journal."""
        if self.replicas is None:
            return
        self._cache.clear()
        changed = self.ks.changed
        if changed is None:
            journals = {keys.parse_assignment_key(self.ks.root, kv.key).item
                        for kv in self.ks.prefixed(keys.assignments_prefix(self.ks.root))}
            journals.update(self.replicas)
        else:
            journals = self._journals_of(changed)
        for name in sorted(journals):
            self._update_journal(name, self.replicas)

    def _journals_of(self, changed: frozenset[str]) -> set[str]:
        assign_prefix = keys.assignments_prefix(self.ks.root)
        items_prefix = keys.items_prefix(self.ks.root)
        journals: set[str] = set()
        for key in changed:
            if key.startswith(assign_prefix):
                try:
                    journals.add(keys.parse_assignment_key(self.ks.root, key).item)
                except KeyLayoutError:
                    continue  # not an assignment the allocator wrote: nothing of ours
            elif key.startswith(items_prefix):
                journals.add(key[len(items_prefix):])
        return journals

    def _update_journal(self, name: str, replicas: dict[str, Replica]) -> None:
        """Brings the local replica of ``name`` (if any) in line with its item and assignments."""
        local_key = _id_key(self.local_id)
        sig: list[tuple[str, int]] = []
        slot: int | None = None
        for kv in self.ks.prefixed(keys.item_assignments_prefix(self.ks.root, name)):
            a = keys.parse_assignment_key(self.ks.root, kv.key)
            sig.append((kv.key, kv.mod_revision))
            if (a.zone, a.suffix) == local_key:
                slot = a.slot
        item = self.ks.search(self._item_key(name))
        replica = replicas.get(name)
        if slot is None or item is None or item.value is None:
            if replica is not None:
                log.info("stopping local journal replica", extra={"journal": name})
                self._cancel(replica)
                del replicas[name]
                self._create_revs.pop(name, None)
            return
        spec: pb.JournalSpec = item.value
        if replica is None or self._create_revs.get(name) != item.create_revision:
            if replica is not None:
                self._cancel(replica)
            log.info("starting local journal replica", extra={"journal": name, "primary": slot == 0})
            replica = self._new_replica(name, spec)
            self._create_revs[name] = item.create_revision
            replicas[name] = replica
        else:
            replica.spec = spec
        replica.set_primary(slot == 0)
        if tuple(sig) != replica.assignments_sig:
            replica.assignments_sig = tuple(sig)
            replica.signal_route_change()

    def _cancel(self, replica: Replica) -> None:
        self._cache.clear()
        replica.cancel()
        task = replica.retired
        if task is not None and not task.done():
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def wait_retired(self, timeout: float) -> None:  # noqa: ASYNC109 - a bounded drain step
        """Waits (at most ``timeout``) for stopped replicas to finish retiring."""
        if self._retiring:
            await asyncio.wait(list(self._retiring), timeout=timeout)

    def stop_serving(self) -> None:
        self._cache.clear()
        if self.replicas is not None:
            for r in self.replicas.values():
                self._cancel(r)
        self.replicas = None

"""How Gazette's specs map onto allocator items and members, and when an item is consistent.

* A JournalSpec is an item of desired replication `replication`, reduced to 1 when the
  journal is partially suspended and to 0 when fully suspended. A ShardSpec wants
  1 + hot_standbys replicas, or 0 when disabled.
* A BrokerSpec is a member of limit `journal_limit`, a ConsumerSpec of limit `shard_limit`;
  both carry `exiting`.
* Brokers: an assignment's value is the Route its broker last synchronised (an empty value
  is no route at all). A journal is consistent when every assignment advertises the Route
  implied by the assignments themselves (same members, same primary), i.e. all replicas
  have synchronised with the current topology.
* An item's Route (Gazette's ``Route.Init`` and ``AttachEndpoints``, one copy for brokers and
  consumers): its assignments' members in key order (which is member order), the primary the
  member of slot 0 (else -1), and, when it has members, one endpoint per member from the
  member's spec ("" for a member missing from the keyspace, as Gazette). ``item_route``
  builds an item's Route once per change of its assignments (or of any member), then copies
  it: a keyspace's first ``item_route`` registers, ahead of its other observers, one that
  forgets the routes of items whose assignments a batch touched, and all of them when a
  member changed or the keyspace was loaded. (At 50,000 journals, building every Route for
  a List was 1.4 s of a broker's loop.)
* Consumers: an assignment's value is a ReplicaStatus. A replica is consistent when STANDBY
  or PRIMARY; a FAILED replica is consistent only if the primary has failed too (swapping
  one failed replica for another is harmless, and it frees the primary to move).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from gazette.allocator.keys import (
    SEP,
    assignments_prefix,
    item_assignments_prefix,
    members_key,
    members_prefix,
    parse_assignment_key,
    parse_item_key,
    parse_member_key,
    split_assignment_key,
)
from gazette.etcd.keyspace import KeySpace, KeyValue
from gazette.protocol import consumer_pb2
from gazette.protocol import protocol_pb2 as pb

from .model import Assignment, Entry, Item, Member


def desired_replication(spec: object, max_hot_standbys: int | None = None) -> int:
    """The number of replicas an item spec asks for; a shard's hot standbys are bounded by
    ``max_hot_standbys`` (the consumer's ``--consumer.max-hot-standbys``) when given."""
    if isinstance(spec, pb.JournalSpec):
        level = spec.suspend.level
        if level == pb.JournalSpec.Suspend.FULL:
            return 0
        if level == pb.JournalSpec.Suspend.PARTIAL:
            return 1
        return int(spec.replication)
    if isinstance(spec, consumer_pb2.ShardSpec):
        standbys = int(spec.hot_standbys)
        if max_hot_standbys is not None:
            standbys = min(standbys, max_hot_standbys)
        return 0 if spec.disable else 1 + standbys
    raise TypeError(f"not an item spec: {type(spec).__name__}")


def member_capacity(spec: object) -> tuple[int, bool]:
    """(item limit, exiting) of a member spec."""
    if isinstance(spec, pb.BrokerSpec):
        return int(spec.journal_limit), bool(spec.exiting)
    if isinstance(spec, consumer_pb2.ConsumerSpec):
        return int(spec.shard_limit), bool(spec.exiting)
    raise TypeError(f"not a member spec: {type(spec).__name__}")


def item_entry(root: str, kv: KeyValue,
               replication: Callable[[object], int] = desired_replication) -> Entry[Item]:
    item = Item(parse_item_key(root, kv.key), replication(kv.value), kv.value)
    return Entry(kv.key, item, kv.raw, kv.create_revision, kv.mod_revision, kv.lease)


def member_entry(root: str, kv: KeyValue) -> Entry[Member]:
    zone, suffix = parse_member_key(root, kv.key)
    limit, exiting = member_capacity(kv.value)
    member = Member(zone, suffix, limit, exiting, kv.value)
    return Entry(kv.key, member, kv.raw, kv.create_revision, kv.mod_revision, kv.lease)


def assignment_entry(root: str, kv: KeyValue) -> Entry[Assignment]:
    k = parse_assignment_key(root, kv.key)
    a = Assignment(k.item, k.zone, k.suffix, k.slot, kv.value)
    return Entry(kv.key, a, kv.raw, kv.create_revision, kv.mod_revision, kv.lease)


class _Slot(Protocol):
    """An assignment's member and slot (an ``AssignmentKey`` or an allocator ``Assignment``)."""

    @property
    def zone(self) -> str: ...
    @property
    def suffix(self) -> str: ...
    @property
    def slot(self) -> int: ...


def init_route(assignments: Iterable[_Slot]) -> pb.Route:
    """Gazette's ``Route.Init``: the members of an item's assignments (given in key order,
    which is member order), the primary the member of slot 0; primary -1 if none."""
    route = pb.Route(primary=-1)
    for i, a in enumerate(assignments):
        if a.slot == 0:
            route.primary = i
        route.members.add(zone=a.zone, suffix=a.suffix)
    return route


def attach_endpoints(ks: KeySpace, route: pb.Route) -> None:
    """Gazette's ``Route.AttachEndpoints``: one endpoint per member, from its member spec (a
    BrokerSpec or ConsumerSpec) in ``ks``; "" for a member missing from the keyspace."""
    del route.endpoints[:]
    for m in route.members:
        kv = ks.search(members_key(ks.root, m.zone, m.suffix))
        route.endpoints.append(kv.value.process_spec.endpoint if kv is not None and kv.value is not None else "")


class _RouteCache:
    """Routes of one keyspace's items, built since their assignments or the members last
    changed (see the module docstring)."""

    __slots__ = ("_routes", "_shared", "_ks", "_assign", "_members")

    def __init__(self, ks: KeySpace) -> None:
        self._routes: dict[str, tuple[pb.Route, bytes]] = {}  # with its serialized form
        # Items with the same members, primary and endpoints share one Route: a cluster has
        # few distinct routes, and each Route costs about a kilobyte (its protobuf arena).
        self._shared: dict[tuple[tuple[str, str, int], ...], tuple[pb.Route, bytes]] = {}
        self._ks = weakref.ref(ks)  # the keyspace holds us (as an observer), not the reverse
        self._assign = assignments_prefix(ks.root)
        self._members = members_prefix(ks.root)

    def observe(self) -> None:
        ks = self._ks()
        changed = ks.changed if ks is not None else None
        routes = self._routes
        if changed is None or not routes:
            routes.clear()
            self._shared.clear()
            return
        assign, members, n = self._assign, self._members, len(self._assign)
        for key in changed:
            if key.startswith(assign):
                routes.pop(key[n:key.find(SEP, n)], None)
            elif key.startswith(members):
                routes.clear()  # endpoints of any route may have changed
                self._shared.clear()
                return

    def entry(self, ks: KeySpace, item: str, assignments: Sequence[KeyValue] | None) -> tuple[pb.Route, bytes]:
        """The cached (route, serialized route) of ``item``; ``assignments`` (None: looked up)
        build it on a miss."""
        entry = self._routes.get(item)
        if entry is None:
            if assignments is None:
                assignments = ks.prefixed(item_assignments_prefix(ks.root, item))
            # The keyspace's decoder validated these keys (``layout_decoder``): split them,
            # and look members up by keys built from them (``attach_endpoints`` checks both).
            n = len(self._assign)
            slots = tuple((k.zone, k.suffix, k.slot) for k in (split_assignment_key(kv.key, n) for kv in assignments))
            entry = self._shared.get(slots)
            if entry is None:
                entry = self._shared[slots] = self._build(ks, slots)
            self._routes[item] = entry
        return entry

    def _build(self, ks: KeySpace, slots: tuple[tuple[str, str, int], ...]) -> tuple[pb.Route, bytes]:
        route = pb.Route(primary=-1)
        for i, (zone, suffix, slot) in enumerate(slots):
            if slot == 0:
                route.primary = i
            route.members.add(zone=zone, suffix=suffix)
            kv = ks.search(f"{self._members}{zone}{SEP}{suffix}")
            route.endpoints.append(kv.value.process_spec.endpoint if kv is not None and kv.value is not None else "")
        return route, route.SerializeToString(deterministic=True)

    def route(self, ks: KeySpace, item: str, assignments: Sequence[KeyValue]) -> pb.Route:
        out = pb.Route()
        out.CopyFrom(self.entry(ks, item, assignments)[0])  # callers own what they get
        return out


_ROUTE_CACHES: weakref.WeakKeyDictionary[KeySpace, _RouteCache] = weakref.WeakKeyDictionary()


def _route_cache(ks: KeySpace) -> _RouteCache:
    cache = _ROUTE_CACHES.get(ks)
    if cache is None:
        cache = _ROUTE_CACHES[ks] = _RouteCache(ks)
        ks.observers.insert(0, cache.observe)  # before any observer that asks for routes
    return cache


def item_route(ks: KeySpace, item: str) -> tuple[pb.Route, Sequence[KeyValue]]:
    """The Route of ``item`` in ``ks``, endpoints attached, and its assignments in key order."""
    assignments = ks.prefixed(item_assignments_prefix(ks.root, item))
    return _route_cache(ks).route(ks, item, assignments), assignments


def item_route_bytes(ks: KeySpace, item: str) -> bytes:
    """``item_route``'s Route, serialized (shared: the caller must not change it)."""
    return _route_cache(ks).entry(ks, item, None)[1]


def route_of(assignments: Sequence[Entry[Assignment]]) -> pb.Route:
    """The Route implied by an item's assignments (in key order); primary -1 if none."""
    return init_route(a.decoded for a in assignments)


def routes_equivalent(a: pb.Route, b: pb.Route | None) -> bool:
    """Same primary and members; endpoints are not compared."""
    if b is None:
        b = pb.Route(primary=-1)
    return a.primary == b.primary and list(a.members) == list(b.members)


def journal_is_consistent(
    item: Entry[Item], assignment: Entry[Assignment], all_of_item: Sequence[Entry[Assignment]]
) -> bool:
    """Every assignment of the journal advertises the Route its assignments imply."""
    route = route_of(all_of_item)
    return all(routes_equivalent(route, _route_value(a)) for a in all_of_item)


def _route_value(a: Entry[Assignment]) -> pb.Route | None:
    value: Any = a.decoded.value
    return value if isinstance(value, pb.Route) else None


def shard_is_consistent(
    item: Entry[Item], assignment: Entry[Assignment], all_of_item: Sequence[Entry[Assignment]]
) -> bool:
    """The replica is ready to take over (see the module docstring)."""
    code = _status_code(assignment)
    status = consumer_pb2.ReplicaStatus
    if code in (status.STANDBY, status.PRIMARY):
        return True
    if code == status.FAILED:
        return any(a.decoded.slot == 0 and _status_code(a) == status.FAILED for a in all_of_item)
    return False  # IDLE or BACKFILL: still starting, or reading its recovery log.


def _status_code(a: Entry[Assignment]) -> int:
    value: Any = a.decoded.value
    if value is None:
        return int(consumer_pb2.ReplicaStatus.IDLE)
    return int(value.code)

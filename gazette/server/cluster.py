"""The cluster plumbing brokers and consumers share: the proxy check, response headers, spec
listing, claim scoping and spec apply, over the allocator's key layout (routes are
``gazette.allocator.item_route``: Gazette's ``Init`` and ``AttachEndpoints``).

Invariants:

* A proxied request is checked once, here, by both resolvers: one from another etcd cluster is
  ``ForeignCluster`` (FAILED_PRECONDITION: a deployment error), one that reached a process other
  than the one its sender resolved is ``MisroutedRequest`` (UNAVAILABLE: the sender's route is
  stale, which a retry after it updates mends); otherwise it is resolved no earlier than the
  etcd revision its sender resolved at. Gazette returns both as plain errors from either
  resolver; the codes are ours.
* Listing reads one keyspace revision: each item whose spec is of the listed type and whose
  labels with meta-labels match the selector and the caller's claims, with its route
  (endpoints attached) and its assignments, in key order.
* An upsert is scoped by the new spec's labels and meta-labels, a delete by its name alone
  (as Gazette): a change outside the caller's claims refuses the whole request.
* An apply is one etcd transaction (every change or none), checked against each change's
  expected mod revision and any further (key, mod revision) pairs; once it applied, the
  keyspace has read through its revision before the caller answers (read-your-writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd

from gazette.allocator import item_route
from gazette.allocator.keys import items_key, items_prefix, parse_item_key
from gazette.auth import Claims, PermissionDenied
from gazette.errors import GazetteError
from gazette.etcd import txn
from gazette.etcd.keyspace import KeySpace, KeyValue
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "ForeignCluster",
    "Listed",
    "MisroutedRequest",
    "SpecChange",
    "apply_spec_changes",
    "check_changes_permitted",
    "check_proxy_header",
    "list_items",
    "matching_items",
    "response_header",
]

S = TypeVar("S")
LabelsOf = Callable[[labels.LabelSet, str], labels.LabelSet]
"""An item's labels with its meta-labels, from its own labels and name (journal or shard)."""


class MisroutedRequest(GazetteError):
    """A proxied request reached a process other than the one its sender resolved (a process
    restarted on the address of one whose etcd lease has not yet lapsed): the sender's route
    is stale, which a retry after the route updates mends."""

    grpc_code = "UNAVAILABLE"


class ForeignCluster(GazetteError):
    """A proxied request comes from a process of another etcd cluster: a deployment error."""

    grpc_code = "FAILED_PRECONDITION"


def check_proxy_header(ks: KeySpace, local_id: pb.ProcessSpec.ID, header: pb.Header | None) -> int:
    """Checks a proxied request's ``header`` (None: not proxied) against this process and its
    etcd cluster; returns the etcd revision the request must be resolved at or after (0: any)."""
    if header is None:
        return 0
    if header.HasField("etcd"):
        theirs, ours = header.etcd.cluster_id, ks.header.cluster_id
        if theirs and ours and theirs != ours:
            raise ForeignCluster(f"request Etcd ClusterId doesn't match our own ({theirs} vs {ours})")
    if header.HasField("process_id"):
        pid = header.process_id
        if (pid.zone or pid.suffix) and (pid.zone, pid.suffix) != (local_id.zone, local_id.suffix):
            raise MisroutedRequest(f"request ProcessId doesn't match our own ({pid.zone}#{pid.suffix} vs "
                                   f"{local_id.zone}#{local_id.suffix})")
    return int(header.etcd.revision)


def response_header(ks: KeySpace, process_id: pb.ProcessSpec.ID,
                    route: pb.Route | None = None) -> pb.Header:
    """A response header: the answering (or resolved) process, ``route`` if given, and the
    keyspace's etcd header."""
    hdr = pb.Header()
    hdr.process_id.CopyFrom(process_id)
    if route is not None:
        hdr.route.CopyFrom(route)
    hdr.etcd.CopyFrom(ks.header.to_proto())
    return hdr


@dataclass(frozen=True, slots=True)
class Listed:
    """One listed item: its spec key-value, its route and its assignments (key order)."""

    kv: KeyValue
    route: pb.Route
    assignments: Sequence[KeyValue]


def list_items(ks: KeySpace, spec_type: type[Any], selector: labels.LabelSelector,
               claims: Claims | None, labels_of: LabelsOf) -> Iterator[Listed]:
    """The items of ``spec_type`` (a JournalSpec or ShardSpec class) whose labels with
    meta-labels match ``selector`` and ``claims`` (None: any), in key order (see
    ``matching_items``), each with its route and assignments."""
    for kv, name in matching_items(ks, spec_type, selector, claims, labels_of):
        route, assignments = item_route(ks, name)
        yield Listed(kv, route, assignments)


def matching_items(ks: KeySpace, spec_type: type[Any], selector: labels.LabelSelector,
                   claims: Claims | None, labels_of: LabelsOf) -> Iterator[tuple[KeyValue, str]]:
    """The spec key-values (and names) of the items of ``spec_type`` (a JournalSpec or
    ShardSpec class) whose labels with meta-labels match ``selector`` and ``claims`` (None:
    any), in key order.

    A selector that includes an item's name (``name`` or ``id``) or a journal ``prefix`` is
    answered from those keys' ranges alone (`selected_ranges`), not by a scan of every item:
    each starting shard lists its source journal, by name."""
    root = ks.root
    base = items_prefix(root)
    ranges = selected_ranges(selector, journals=spec_type is pb.JournalSpec)
    if ranges is None:
        candidates: Sequence[KeyValue] = ks.prefixed(base)
    else:
        seen: dict[str, KeyValue] = {}
        for start, end in ranges:
            for kv in (ks.range(base + start, base + end) if end is not None else ks.prefixed(base + start)):
                seen[kv.key] = kv
        candidates = [seen[k] for k in sorted(seen)]
    # Every candidate matches when the selector is empty or its ranges are exactly what it
    # matches, and the claims (if any) are unrestricted: no labels to build (50,000 journals'
    # label sets took a second of a `prefix=` listing).
    exact = (not selector.include and not selector.exclude) or (
        ranges is not None and _ranged_exactly(selector, journals=spec_type is pb.JournalSpec))
    everything = exact and (claims is None or claims.unrestricted)
    for kv in candidates:
        spec = kv.value
        if not isinstance(spec, spec_type):
            continue
        name = parse_item_key(root, kv.key)
        if not everything:
            ext = labels_of(labels.LabelSet.from_proto(spec.labels), name)
            if not selector.matches(ext) or (claims is not None and not claims.permits(ext)):
                continue
        yield kv, name


def selected_ranges(selector: labels.LabelSelector, *, journals: bool) -> list[tuple[str, str | None]] | None:
    """Name ranges (``start``, ``end``: [start, end), or every name starting with ``start``
    when ``end`` is None) holding every item ``selector`` can match, from its includes of the
    name meta-label (``name`` for journals, ``id`` for shards) or, for journals, ``prefix``;
    None when it includes neither (or an empty value, which matches any): scan them all.
    A superset: each candidate is still matched against the whole selector."""
    names = (labels.META_NAME, labels.META_PREFIX) if journals else (labels.META_ID,)
    for meta in names:
        include = [lb for lb in selector.include if lb.name == meta]
        if not include or any(lb.value == "" for lb in include):
            continue
        return [(lb.value, None) if lb.prefix or meta == labels.META_PREFIX else (lb.value, lb.value + "\0")
                for lb in include]
    return None


def _ranged_exactly(selector: labels.LabelSelector, *, journals: bool) -> bool:
    """Whether every name in `selected_ranges` of ``selector`` is matched by it: it excludes
    nothing and includes one meta-label only, either names (journals' ``name``, shards' ``id``,
    exact or by prefix) or journals' exact ``prefix`` values ending in ``/`` (a journal has
    ``prefix=p/`` exactly when its name starts with ``p/``; no name ends in ``/``)."""
    if selector.exclude or not selector.include:
        return False
    metas = {lb.name for lb in selector.include}
    if len(metas) != 1:
        return False
    meta = metas.pop()
    if meta == (labels.META_NAME if journals else labels.META_ID):
        return True
    return journals and meta == labels.META_PREFIX and all(
        not lb.prefix and lb.value.endswith("/") for lb in selector.include)


@dataclass(frozen=True, slots=True)
class SpecChange:
    """One change of an ApplyRequest, journal or shard alike: an upsert (``spec``, its
    ``labels``) or a delete (``spec`` None), expecting ``expect_mod_revision``."""

    name: str
    spec: Any  # the new JournalSpec or ShardSpec; None deletes
    expect_mod_revision: int
    labels: labels.LabelSet

    @classmethod
    def of(cls, change: Any, name_field: str) -> SpecChange:
        """From an ApplyRequest.Change of either API (``name_field``: "name" or "id")."""
        if change.HasField("upsert"):
            spec = change.upsert
            return cls(getattr(spec, name_field), spec, int(change.expect_mod_revision),
                       labels.LabelSet.from_proto(spec.labels))
        return cls(change.delete, None, int(change.expect_mod_revision), labels.LabelSet())


def check_changes_permitted(claims: Claims, changes: Iterable[SpecChange], labels_of: LabelsOf) -> None:
    """PermissionDenied for the first change ``claims`` do not reach (upserts by the new
    spec's labels and meta-labels, deletes by name)."""
    if claims.unrestricted:
        return
    for ch in changes:
        if not claims.permits(labels_of(ch.labels, ch.name)):
            raise PermissionDenied(f"not authorized to {ch.name}")


async def apply_spec_changes(etcd: aetcd.Client, ks: KeySpace, changes: Iterable[SpecChange],
                             unchanged: Iterable[tuple[str, int]] = ()) -> bool:
    """Applies ``changes`` in one transaction, also checked against the (key, mod revision)
    pairs ``unchanged``; whether it applied (then ``ks`` has read through it)."""
    resp = await txn.apply_changes(
        etcd,
        [txn.ItemChange(items_key(ks.root, ch.name),
                        ch.spec.SerializeToString() if ch.spec is not None else None, ch.expect_mod_revision)
         for ch in changes],
        [txn.Cmp(k, "mod", rev) for k, rev in unchanged])
    if resp.succeeded:
        await ks.wait_for_revision(resp.header.revision)
    return bool(resp.succeeded)

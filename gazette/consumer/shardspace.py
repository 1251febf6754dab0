"""Shard spec spaces: the YAML that ``gazctl shards list/apply/edit`` speak.

A :class:`ShardSet` is a ``common`` ShardSpec template plus a list of ``shards``. Each shard
inherits every field of ``common`` it leaves zero-valued; labels merge per label name (a shard
that sets any value of a name replaces common's values of that name). ``delete`` and
``revision`` belong to individual shards.

Invariants (Gazette's, reproduced exactly):

* :func:`flatten` pushes ``common`` down and returns fully-specified shards in document order;
  :func:`nest` sorts shards by id and hoists every value shared by *all* of them into
  ``common``, clearing it at the shards. ``flatten(nest(es)) == sorted(es)`` for canonical
  entries, and ``to_yaml``/``parse_yaml`` preserve the flattened result.
* Shard ids are unique and non-empty; ``common`` has no ``id``.
* Flat specs are canonical: zero durations and empty ``labels`` are absent; labels are sorted
  by (name, value).

Errors are :class:`~gazette.journalspace.SpecSpaceError` naming the shard and field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gazette.durations import format_duration_ns, ns_from_pb, ns_to_pb
from gazette.protocol import consumer_pb2 as pc
from gazette.specspace import (
    INT32,
    INT64,
    UINT32,
    SpecSpaceError,
    as_bool,
    as_duration_ns,
    as_int,
    as_list,
    as_map,
    as_opt_bool,
    as_str,
    check_keys,
    checked_map,
    dump,
    intersect_labels,
    labels_from_yaml,
    labels_of,
    labels_to_yaml,
    load_document,
    set_labels,
    subtract_labels,
    union_labels,
)

__all__ = [
    "apply_request",
    "FlatShard",
    "ShardEntry",
    "ShardSet",
    "SpecSpaceError",
    "flatten",
    "from_list_response",
    "nest",
    "parse_yaml",
    "set_from_dict",
    "set_to_dict",
    "shard_spec_from_dict",
    "shard_spec_to_dict",
    "to_yaml",
]

_SPEC_KEYS = (
    "id",
    "sources",
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "max_txn_duration",
    "min_txn_duration",
    "disable",
    "hot_standbys",
    "labels",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
)
_SHARD_KEYS = ("comment", "delete", *_SPEC_KEYS, "revision")
_STR_KEYS = ("recovery_log_prefix", "hint_prefix")
_UINT_KEYS = ("hot_standbys", "ring_buffer_size", "read_channel_size")
_BOOL_KEYS = ("disable", "disable_wait_for_ack")
_DURATION_KEYS = ("max_txn_duration", "min_txn_duration")


@dataclass
class ShardEntry:
    """A member of a :class:`ShardSet`; zero fields of ``spec`` come from ``common``."""

    spec: pc.ShardSpec = field(default_factory=pc.ShardSpec)
    delete: bool | None = None
    revision: int = 0
    comment: str = ""


@dataclass
class ShardSet:
    """Shards sharing a ``common`` ShardSpec template."""

    common: pc.ShardSpec = field(default_factory=pc.ShardSpec)
    shards: list[ShardEntry] = field(default_factory=list)


@dataclass
class FlatShard:
    """One fully-specified shard, as gazctl applies it."""

    spec: pc.ShardSpec
    revision: int = 0  # Etcd mod revision expected by the apply; 0 creates, -1 skips the check.
    delete: bool = False
    comment: str = ""


# ---------------------------------------------------------------------------------------------
# ShardSpec <-> YAML mapping, in the field order Gazette prints.


def _canonical(spec: pc.ShardSpec) -> pc.ShardSpec:
    for key in _DURATION_KEYS:
        if spec.HasField(key) and ns_from_pb(getattr(spec, key)) == 0:  # type: ignore[arg-type]
            spec.ClearField(key)  # type: ignore[arg-type]
    if spec.HasField("labels") and not spec.labels.labels:
        spec.ClearField("labels")
    return spec


def _spec_from_yaml(d: dict[Any, Any], where: str) -> pc.ShardSpec:
    spec = pc.ShardSpec()
    spec.id = as_str(d.get("id"), where, "id")
    for i, item in enumerate(as_list(d.get("sources"), where, "sources")):
        at = f"sources[{i}]"
        src = as_map(item, where, at)
        check_keys(src, ("journal", "min_offset"), where, at + ".")
        spec.sources.add(
            journal=as_str(src.get("journal"), where, at + ".journal"),
            min_offset=as_int(src.get("min_offset"), where, at + ".min_offset", *INT64),
        )
    for key in _STR_KEYS:
        setattr(spec, key, as_str(d.get(key), where, key))
    spec.hint_backups = as_int(d.get("hint_backups"), where, "hint_backups", *INT32)
    for key in _DURATION_KEYS:
        ns = as_duration_ns(d.get(key), where, key)
        if ns:
            getattr(spec, key).CopyFrom(ns_to_pb(ns))
    for key in _BOOL_KEYS:
        setattr(spec, key, as_bool(d.get(key), where, key))
    for key in _UINT_KEYS:
        setattr(spec, key, as_int(d.get(key), where, key, *UINT32))
    set_labels(spec.labels, labels_from_yaml(d.get("labels"), where))
    return _canonical(spec)


def shard_spec_from_dict(d: dict[str, Any], where: str = "spec") -> pc.ShardSpec:
    """A ShardSpec from its YAML mapping; malformed input raises :class:`SpecSpaceError`."""
    return _spec_from_yaml(checked_map(d, where, _SPEC_KEYS), where)


def shard_spec_to_dict(spec: pc.ShardSpec) -> dict[str, Any]:
    """The YAML mapping of a ShardSpec: zero fields omitted, keys in Gazette's order."""
    out: dict[str, Any] = {}
    if spec.id:
        out["id"] = spec.id
    if spec.sources:
        sources: list[dict[str, Any]] = []
        for src in spec.sources:
            s: dict[str, Any] = {}
            if src.journal:
                s["journal"] = src.journal
            if src.min_offset:
                s["min_offset"] = src.min_offset
            sources.append(s)
        out["sources"] = sources
    for key in ("recovery_log_prefix", "hint_prefix", "hint_backups"):
        if getattr(spec, key):
            out[key] = getattr(spec, key)
    for key in _DURATION_KEYS:
        ns = ns_from_pb(getattr(spec, key))
        if ns:
            out[key] = format_duration_ns(ns)
    for key in ("disable", "hot_standbys"):
        if getattr(spec, key):
            out[key] = getattr(spec, key)
    if spec.labels.labels:
        out["labels"] = labels_to_yaml(labels_of(spec.labels))
    for key in ("disable_wait_for_ack", "ring_buffer_size", "read_channel_size"):
        if getattr(spec, key):
            out[key] = getattr(spec, key)
    return out


def set_from_dict(d: Any) -> ShardSet:
    """A :class:`ShardSet` from its YAML mapping (``common`` and ``shards``), checked."""
    m = as_map(d, "document", "set")
    check_keys(m, ("common", "shards"), "document", "")
    common_map = as_map(m.get("common"), "common", "common")
    check_keys(common_map, _SPEC_KEYS, "common", "")
    out = ShardSet(common=_spec_from_yaml(common_map, "common"))
    if out.common.id:
        raise SpecSpaceError("common", "id", "the common template cannot name a shard")

    seen: set[str] = set()
    for i, item in enumerate(as_list(m.get("shards"), "document", "shards")):
        fallback = f"shards[{i}]"
        sm = as_map(item, fallback, "shard")
        shard_id = as_str(sm.get("id"), fallback, "id")
        where = f"shard {shard_id!r}" if shard_id else fallback
        check_keys(sm, _SHARD_KEYS, where, "")
        if not shard_id:
            raise SpecSpaceError(where, "id", "missing shard id")
        if shard_id in seen:
            raise SpecSpaceError(where, "id", "shard appears more than once")
        seen.add(shard_id)
        out.shards.append(
            ShardEntry(
                spec=_spec_from_yaml(sm, where),
                delete=as_opt_bool(sm.get("delete"), where, "delete"),
                revision=as_int(sm.get("revision"), where, "revision", *INT64),
                comment=as_str(sm.get("comment"), where, "comment"),
            )
        )
    return out


def set_to_dict(s: ShardSet) -> dict[str, Any]:
    """The YAML mapping of a :class:`ShardSet`, as ``gazctl shards list -o yaml`` prints it."""
    out: dict[str, Any] = {}
    common = shard_spec_to_dict(s.common)
    if common:
        out["common"] = common
    shards: list[dict[str, Any]] = []
    for shard in s.shards:
        d: dict[str, Any] = {}
        if shard.comment:
            d["comment"] = shard.comment
        if shard.delete is not None:
            d["delete"] = shard.delete
        d.update(shard_spec_to_dict(shard.spec))
        if shard.revision:
            d["revision"] = shard.revision
        shards.append(d)
    if shards:
        out["shards"] = shards
    return out


def parse_yaml(text: str) -> ShardSet:
    """Parse and check one YAML shard-set document."""
    doc = load_document(text)
    if doc is None:
        raise SpecSpaceError("document", None, "empty document")
    return set_from_dict(doc)


def to_yaml(s: ShardSet) -> str:
    """The YAML document of a :class:`ShardSet`."""
    return dump(set_to_dict(s))


# ---------------------------------------------------------------------------------------------
# Spec algebra (Gazette's Union / Intersect / Subtract of ShardSpecs) and the set operations.


def _copy(spec: pc.ShardSpec) -> pc.ShardSpec:
    out = pc.ShardSpec()
    out.CopyFrom(spec)
    return out


def _sources(spec: pc.ShardSpec) -> list[tuple[str, int]]:
    return [(s.journal, s.min_offset) for s in spec.sources]


_SCALAR_KEYS = (
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "disable",
    "hot_standbys",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
)


def _union(a: pc.ShardSpec, b: pc.ShardSpec) -> pc.ShardSpec:
    """``a`` with each zero-valued field taken from ``b`` (``id`` is ``a``'s)."""
    out = _copy(a)
    if not out.sources:
        out.sources.extend(b.sources)
    for key in _SCALAR_KEYS:
        if not getattr(out, key):
            setattr(out, key, getattr(b, key))
    for key in _DURATION_KEYS:
        if not ns_from_pb(getattr(out, key)):
            getattr(out, key).CopyFrom(getattr(b, key))
    set_labels(out.labels, union_labels(labels_of(a.labels), labels_of(b.labels)))
    return _canonical(out)


def _intersect(a: pc.ShardSpec, b: pc.ShardSpec) -> pc.ShardSpec:
    out = _copy(a)
    if _sources(out) != _sources(b):
        del out.sources[:]
    for key in _SCALAR_KEYS:
        if getattr(out, key) != getattr(b, key):
            out.ClearField(key)  # type: ignore[arg-type]
    for key in _DURATION_KEYS:
        if ns_from_pb(getattr(out, key)) != ns_from_pb(getattr(b, key)):
            out.ClearField(key)  # type: ignore[arg-type]
    set_labels(out.labels, intersect_labels(labels_of(a.labels), labels_of(b.labels)))
    return _canonical(out)


def _subtract(a: pc.ShardSpec, b: pc.ShardSpec) -> pc.ShardSpec:
    out = _copy(a)
    if _sources(out) == _sources(b):
        del out.sources[:]
    for key in _SCALAR_KEYS:
        if getattr(out, key) == getattr(b, key):
            out.ClearField(key)  # type: ignore[arg-type]
    for key in _DURATION_KEYS:
        if ns_from_pb(getattr(out, key)) == ns_from_pb(getattr(b, key)):
            out.ClearField(key)  # type: ignore[arg-type]
    set_labels(out.labels, subtract_labels(labels_of(a.labels), labels_of(b.labels)))
    return _canonical(out)


def flatten(s: ShardSet) -> list[FlatShard]:
    """Push ``common`` into every shard: fully-specified shards, in document order."""
    out: list[FlatShard] = []
    seen: set[str] = set()
    for i, shard in enumerate(s.shards):
        where = f"shard {shard.spec.id!r}" if shard.spec.id else f"shards[{i}]"
        if not shard.spec.id:
            raise SpecSpaceError(where, "id", "missing shard id")
        if shard.spec.id in seen:
            raise SpecSpaceError(where, "id", "shard appears more than once")
        seen.add(shard.spec.id)
        out.append(
            FlatShard(
                spec=_union(shard.spec, s.common),
                revision=shard.revision,
                delete=bool(shard.delete),
                comment=shard.comment,
            )
        )
    return out


def nest(entries: Iterable[FlatShard]) -> ShardSet:
    """Sort shards by id and hoist the values all of them share into ``common``."""
    out = ShardSet()
    common: pc.ShardSpec | None = None
    for e in sorted(entries, key=lambda e: e.spec.id):
        where = f"shard {e.spec.id!r}"
        if not e.spec.id:
            raise SpecSpaceError("shards", "id", "missing shard id")
        if out.shards and out.shards[-1].spec.id == e.spec.id:
            raise SpecSpaceError(where, "id", "shard appears more than once")
        spec = _copy(e.spec)
        set_labels(spec.labels, sorted(labels_of(spec.labels)))
        spec = _canonical(spec)
        out.shards.append(
            ShardEntry(spec, delete=True if e.delete else None, revision=e.revision, comment=e.comment)
        )
        common = _copy(spec) if common is None else _intersect(common, spec)
    if common is not None:
        common.ClearField("id")
        out.common = _canonical(common)
        for shard in out.shards:
            shard.spec = _subtract(shard.spec, out.common)
    return out


def apply_request(text: str) -> pc.ApplyRequest:
    """The consumer ApplyRequest of a shard-space YAML document (what ``shards apply`` sends)."""
    req = pc.ApplyRequest()
    for entry in flatten(parse_yaml(text)):
        change = req.changes.add(expect_mod_revision=entry.revision)
        if entry.delete:
            change.delete = entry.spec.id
        else:
            change.upsert.CopyFrom(entry.spec)
    return req


def from_list_response(resp: pc.ListResponse) -> ShardSet:
    """The hoisted set of a consumer's List response (``gazctl shards list -o yaml``)."""
    return nest(FlatShard(s.spec, s.mod_revision) for s in resp.shards)

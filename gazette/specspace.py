"""Spec spaces: the YAML that ``gazctl`` speaks for journal trees and shard sets, generically.

Both ``gazette.journalspace`` (journals, a tree of directories) and
``gazette.consumer.shardspace`` (shards, a ``common`` block over a list) are built from the parts
here: a YAML loader and dumper that read scalars as Go's yaml.v2 does, typed coercions that
refuse bad input with an error naming the node and field, and the label algebra that nesting
and flattening use ("common + items": a child inherits every label name it does not set).

Invariants:

* Loading keeps a plain scalar's source text (``value: yes`` is "yes" to a string field, true
  to a boolean one), as Go does; dumping writes strings that would read back as something else
  quoted, so ``load_document(dump(x)) == x`` for the documents this package builds.
* Every coercion (``as_str``, ``as_int``, ``as_bool``, ``as_duration_ns``, ``as_enum``, ...)
  returns the typed value or raises :class:`SpecSpaceError` naming ``where`` (the node) and
  ``fld`` (the field path); ``check_keys`` refuses unknown keys the same way.
* Labels are lists of (name, value) pairs, sorted by name. Label algebra works per label
  *name*: ``union_labels(child, parent)`` keeps the child's values of every name it sets and
  the parent's of the rest; ``intersect_labels`` keeps the names both hold with the same
  values; ``subtract_labels(a, b)`` drops from ``a`` the names whose values ``b`` holds
  identically. So hoisting what items share and pushing it back down is lossless:
  ``union_labels(subtract_labels(item, common), common) == item`` when ``common`` is the
  intersection of the items' labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gazette.durations import parse_duration_ns
from gazette.errors import GazetteError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "INT32",
    "INT64",
    "UINT32",
    "Labels",
    "Scalar",
    "SpecSpaceError",
    "as_bool",
    "as_duration_ns",
    "as_enum",
    "as_int",
    "as_list",
    "as_map",
    "as_opt_bool",
    "as_str",
    "check_keys",
    "checked_map",
    "dump",
    "intersect_labels",
    "is_null",
    "labels_from_yaml",
    "labels_of",
    "labels_to_yaml",
    "load_document",
    "set_labels",
    "shown",
    "subtract_labels",
    "union_labels",
]


class SpecSpaceError(GazetteError, ValueError):
    """A spec space (journal tree or shard set) is malformed.

    ``where`` names the node (``node 'foo/bar'``, ``shard 'a'``, ``common``, ``document``),
    ``field`` the offending field path (``fragment.retention``) or ``None``.
    """

    def __init__(self, where: str, field: str | None, detail: str) -> None:
        self.where = where
        self.field = field
        self.detail = detail
        super().__init__(f"{where}: {field}: {detail}" if field else f"{where}: {detail}")


# ---------------------------------------------------------------------------------------------
# YAML loading that keeps scalar source text.
#
# Go's yaml.v2 decodes a plain scalar into a string field as its source text (`value: yes` is
# "yes", `value: 1.50` is "1.50"), whereas PyYAML would hand back True / 1.5. The loader below
# therefore wraps every non-string implicit scalar in Scalar, keeping both readings.


@dataclass(frozen=True)
class Scalar:
    text: str
    value: Any  # What YAML 1.1 resolves the text to: None, bool, int, float or a date.


# libyaml's parser and emitter when present; construction and representation stay in Python.
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """Safe loader that keeps non-string scalars' text and rejects duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key_node.value)
        out: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return out


def _wrap(base: Any) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Scalar:
        return Scalar(str(node.value), base(loader, node))

    return construct


for _tag, _base in [
    ("tag:yaml.org,2002:null", yaml.SafeLoader.construct_yaml_null),
    ("tag:yaml.org,2002:bool", yaml.SafeLoader.construct_yaml_bool),
    ("tag:yaml.org,2002:int", yaml.SafeLoader.construct_yaml_int),
    ("tag:yaml.org,2002:float", yaml.SafeLoader.construct_yaml_float),
    ("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_timestamp),
]:
    _Loader.add_constructor(_tag, _wrap(_base))


def load_document(text: str) -> Any:
    """Load exactly one YAML document with :class:`_Loader`."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader.
    except yaml.YAMLError as err:
        raise SpecSpaceError("document", None, f"invalid YAML: {err}") from err


class _Dumper(_BaseDumper):  # type: ignore[misc]
    """Safe dumper choosing string styles as Go's yaml.v2 does."""


_STR_TAG = "tag:yaml.org,2002:str"


def _represent_str(dumper: Any, value: str) -> yaml.ScalarNode:
    # Go double-quotes a string that would otherwise read back as another type ("", "yes",
    # "1.50"), uses a literal block for multi-line text, and leaves the rest to the emitter
    # (plain where allowed, else single-quoted).
    style: str | None = None
    if "\n" in value:
        style = "|"
    elif dumper.resolve(yaml.ScalarNode, value, (True, False)) != _STR_TAG:
        style = '"'
    node: yaml.ScalarNode = dumper.represent_scalar(_STR_TAG, value, style=style)
    return node


_Dumper.add_representer(str, _represent_str)


def dump(doc: Any) -> str:
    return yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 16,
    )


# ---------------------------------------------------------------------------------------------
# Typed field accessors. Each takes the raw YAML value and the (where, field) to blame.


def shown(v: Any) -> str:
    return repr(v.text) if isinstance(v, Scalar) else repr(v)


def as_str(v: Any, where: str, fld: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, Scalar):
        return "" if v.value is None else v.text
    if v is None:
        return ""
    raise SpecSpaceError(where, fld, f"expected a string, got {shown(v)}")


def as_int(v: Any, where: str, fld: str, lo: int, hi: int) -> int:
    raw = v.value if isinstance(v, Scalar) else v
    if raw is None:
        return 0
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise SpecSpaceError(where, fld, f"expected an integer, got {shown(v)}")
    if not lo <= raw <= hi:
        raise SpecSpaceError(where, fld, f"{raw} is out of range [{lo}, {hi}]")
    return raw


def as_bool(v: Any, where: str, fld: str) -> bool:
    raw = v.value if isinstance(v, Scalar) else v
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise SpecSpaceError(where, fld, f"expected true or false, got {shown(v)}")
    return raw


def as_opt_bool(v: Any, where: str, fld: str) -> bool | None:
    raw = v.value if isinstance(v, Scalar) else v
    return None if raw is None else as_bool(v, where, fld)


def as_list(v: Any, where: str, fld: str) -> list[Any]:
    if v is None or (isinstance(v, Scalar) and v.value is None):
        return []
    if not isinstance(v, list):
        raise SpecSpaceError(where, fld, f"expected a list, got {shown(v)}")
    return v


def as_map(v: Any, where: str, fld: str) -> dict[Any, Any]:
    if v is None or (isinstance(v, Scalar) and v.value is None):
        return {}
    if not isinstance(v, dict):
        raise SpecSpaceError(where, fld, f"expected a mapping, got {shown(v)}")
    return v


def is_null(v: Any) -> bool:
    return v is None or (isinstance(v, Scalar) and v.value is None)


def as_duration_ns(v: Any, where: str, fld: str) -> int:
    raw = v.value if isinstance(v, Scalar) else v
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool) and raw == 0):
        return 0
    if not isinstance(v, str):
        # A bare number would be nanoseconds to Go; almost surely not what was meant.
        raise SpecSpaceError(where, fld, f"expected a duration such as '1m0s', got {shown(v)}")
    try:
        return parse_duration_ns(v)
    except ValueError as err:
        raise SpecSpaceError(where, fld, str(err)) from None


def as_enum(
    v: Any, where: str, fld: str, names: dict[str, int], type_name: str, ints: bool
) -> int:
    raw = v.value if isinstance(v, Scalar) else v
    if raw is None:
        return 0
    if ints and isinstance(raw, int) and not isinstance(raw, bool):
        return as_int(v, where, fld, 0, (1 << 31) - 1)
    text = as_str(v, where, fld)
    if text not in names:
        options = ", ".join(sorted(names, key=lambda n: names[n]))
        raise SpecSpaceError(
            where, fld, f"{text!r} is not a valid {type_name} (options are {options})"
        )
    return names[text]


def check_keys(d: dict[Any, Any], allowed: Sequence[str], where: str, prefix: str) -> None:
    for key in d:
        if not isinstance(key, str) or key not in allowed:
            shown = key.text if isinstance(key, Scalar) else key
            raise SpecSpaceError(
                where,
                f"{prefix}{shown}",
                f"unknown field (expected one of {', '.join(allowed)})",
            )


INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)

# ---------------------------------------------------------------------------------------------
# Labels: sorted (name, value) pairs; merged per name, as Gazette's label-set algebra does.

Labels = list[tuple[str, str]]


def labels_from_yaml(v: Any, where: str, fld: str = "labels") -> Labels:
    out: Labels = []
    for i, item in enumerate(as_list(v, where, fld)):
        at = f"{fld}[{i}]"
        d = as_map(item, where, at)
        check_keys(d, ("name", "value"), where, at + ".")
        name = as_str(d.get("name"), where, at + ".name")
        if not name:
            raise SpecSpaceError(where, at + ".name", "missing label name")
        out.append((name, as_str(d.get("value"), where, at + ".value")))
    out.sort()
    for a, b in zip(out, out[1:], strict=False):
        if a == b:
            raise SpecSpaceError(where, fld, f"duplicate label {a[0]}={a[1]!r}")
    return out


def labels_to_yaml(labels: Labels) -> list[dict[str, str]]:
    return [{"name": n, "value": v} for n, v in labels]


def labels_of(ls: pb.LabelSet) -> Labels:
    return [(label.name, label.value) for label in ls.labels]


def set_labels(ls: pb.LabelSet, labels: Iterable[tuple[str, str]]) -> None:
    del ls.labels[:]
    ls.labels.extend(pb.Label(name=n, value=v) for n, v in labels)


def _groups(labels: Labels) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for name, value in labels:
        out.setdefault(name, []).append(value)
    return {n: tuple(vs) for n, vs in out.items()}


def _ungroup(groups: dict[str, tuple[str, ...]]) -> Labels:
    return [(n, v) for n in sorted(groups) for v in groups[n]]


def union_labels(a: Labels, b: Labels) -> Labels:
    """Labels of ``a``, plus those of ``b`` whose names ``a`` does not use."""
    ga, gb = _groups(a), _groups(b)
    return _ungroup({**gb, **ga})


def intersect_labels(a: Labels, b: Labels) -> Labels:
    """Label names having identical values in ``a`` and ``b``."""
    ga, gb = _groups(a), _groups(b)
    return _ungroup({n: vs for n, vs in ga.items() if gb.get(n) == vs})


def subtract_labels(a: Labels, b: Labels) -> Labels:
    """Label names of ``a`` whose values ``b`` does not match exactly."""
    ga, gb = _groups(a), _groups(b)
    return _ungroup({n: vs for n, vs in ga.items() if gb.get(n) != vs})


def checked_map(d: Any, where: str, allowed: Sequence[str]) -> dict[Any, Any]:
    """``d`` as a YAML mapping holding only ``allowed`` keys (a spec's mapping)."""
    m = as_map(d, where, "spec")
    check_keys(m, allowed, where, "")
    return m

"""Journal spec spaces: the hierarchical YAML that ``gazctl journals list/apply/edit`` speak.

Etcd stores every JournalSpec fully spelled out. Operators instead read and write a tree of
:class:`Node` s in which journals sharing a ``/``-delimited prefix sit under a *directory* node,
and fields common to the journals of a directory are written once on the directory.

Invariants (Gazette's, reproduced exactly):

* A node whose name is empty or ends in ``/`` is a directory; any other node is a journal.
  A directory has at least one child and no ``revision``; a journal has a valid journal name
  and no children.
* Children carry full names, each prefixed by its parent's name, in strictly increasing order.
* Flattening pushes fields down: a child inherits every field it leaves zero-valued. Labels merge
  per label *name*: a child that sets any value of a name replaces the parent's values of that
  name, and inherits the other names. ``delete`` is tri-state (unset inherits the parent's).
  ``suspend`` is never inherited (Gazette ignores it on directories; here that is an error).
* Nesting (:func:`nest`) groups flat specs by shared path components and hoists every value
  common to all children of a directory into the directory, so ``flatten(nest(es))`` returns
  ``es`` sorted by name, and ``to_yaml``/``parse_yaml`` preserve the flattened result.
* Flat specs are canonical: zero durations, empty ``fragment`` and empty ``labels`` are absent
  (Go cannot tell them apart from unset), labels are sorted by (name, value); ``suspend`` keeps
  its presence, as Go's pointer does.

Errors are :class:`SpecSpaceError` (a ``ValueError``) naming the node and the field.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gazette.durations import format_duration_ns, ns_from_pb, ns_to_pb
from gazette.protocol import protocol_pb2 as pb
from gazette.specspace import (
    INT32,
    INT64,
    SpecSpaceError,
    as_duration_ns,
    as_enum,
    as_int,
    as_list,
    as_map,
    as_opt_bool,
    as_str,
    check_keys,
    checked_map,
    dump,
    intersect_labels,
    is_null,
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
    "FlatEntry",
    "Node",
    "SpecSpaceError",
    "flatten",
    "from_list_response",
    "hoist",
    "nest",
    "node_from_dict",
    "node_to_dict",
    "parse_yaml",
    "spec_from_dict",
    "spec_to_dict",
    "to_yaml",
    "validate",
]


# ---------------------------------------------------------------------------------------------
# Journal names (Gazette's rule: a clean, relative path of letters, digits and "-_+/.=%",
# 4 to 512 bytes, optionally followed by a ";meta" segment of the same alphabet).

_PATH_SYMBOLS = frozenset("-_+/.=%")


def _path_component_error(text: str, lo: int, hi: int) -> str | None:
    size = len(text.encode())
    if not lo <= size <= hi:
        return f"invalid length ({size}; expected {lo} <= length <= {hi})"
    for ch in text:
        if not (ch.isalpha() or ch.isnumeric() or ch in _PATH_SYMBOLS):
            return f"not a valid token ({text})"
    if text and (posixpath.normpath(text) != text or text.startswith("//")):
        return f"must be a clean path ({text})"
    if text.startswith("/"):
        return f"cannot begin with '/' ({text})"
    return None


def _journal_name_error(name: str) -> str | None:
    base, sep, meta = name.partition(";")
    err = _path_component_error(base, 4, 512)
    if err is None and sep:
        err = _path_component_error(meta, 1, 512)
        if err is not None:
            err = f"metadata path segment: {err}"
    return err


# ---------------------------------------------------------------------------------------------
# JournalSpec <-> YAML mapping, in the field order Gazette prints.

_SPEC_KEYS = (
    "name",
    "replication",
    "labels",
    "fragment",
    "flags",
    "max_append_rate",
    "suspend",
)
_FRAGMENT_KEYS = (
    "length",
    "compression_codec",
    "stores",
    "refresh_interval",
    "retention",
    "flush_interval",
    "path_postfix_template",
)
_DURATION_KEYS = ("refresh_interval", "retention", "flush_interval")
_CODECS: dict[str, int] = {n: int(v) for n, v in pb.CompressionCodec.items()}
_FLAGS: dict[str, int] = {n: int(v) for n, v in pb.JournalSpec.Flag.items()}
_LEVELS: dict[str, int] = {n: int(v) for n, v in pb.JournalSpec.Suspend.Level.items()}
_FLAG_NAMES = {v: n for n, v in _FLAGS.items()}
_LEVEL_NAMES = {v: n for n, v in _LEVELS.items()}


def _spec_from_yaml(d: dict[Any, Any], where: str) -> pb.JournalSpec:
    """Build a (possibly partial) JournalSpec from the spec keys of ``d``."""
    spec = pb.JournalSpec()
    spec.name = as_str(d.get("name"), where, "name")
    spec.replication = as_int(d.get("replication"), where, "replication", *INT32)
    set_labels(spec.labels, labels_from_yaml(d.get("labels"), where))

    frag = as_map(d.get("fragment"), where, "fragment")
    check_keys(frag, _FRAGMENT_KEYS, where, "fragment.")
    f = spec.fragment
    f.length = as_int(frag.get("length"), where, "fragment.length", *INT64)
    f.compression_codec = as_enum(  # type: ignore[assignment]
        frag.get("compression_codec"),
        where,
        "fragment.compression_codec",
        _CODECS,
        "CompressionCodec",
        ints=False,
    )
    for i, store in enumerate(as_list(frag.get("stores"), where, "fragment.stores")):
        f.stores.append(as_str(store, where, f"fragment.stores[{i}]"))
    for key in _DURATION_KEYS:
        ns = as_duration_ns(frag.get(key), where, f"fragment.{key}")
        if ns:
            getattr(f, key).CopyFrom(ns_to_pb(ns))
    f.path_postfix_template = as_str(
        frag.get("path_postfix_template"), where, "fragment.path_postfix_template"
    )

    spec.flags = as_enum(d.get("flags"), where, "flags", _FLAGS, "JournalSpec.Flag", ints=True)
    spec.max_append_rate = as_int(d.get("max_append_rate"), where, "max_append_rate", *INT64)

    if not is_null(d.get("suspend")):
        sus = as_map(d.get("suspend"), where, "suspend")
        check_keys(sus, ("level", "offset"), where, "suspend.")
        spec.suspend.SetInParent()
        spec.suspend.level = as_enum(  # type: ignore[assignment]
            sus.get("level"), where, "suspend.level", _LEVELS, "Suspend.Level", ints=True
        )
        spec.suspend.offset = as_int(sus.get("offset"), where, "suspend.offset", *INT64)
    return _canonical(spec)


def spec_from_dict(d: dict[str, Any], where: str = "spec") -> pb.JournalSpec:
    """A JournalSpec from its YAML mapping (as :func:`spec_to_dict` writes it).

    Unknown keys, wrong types, bad durations and codec names raise :class:`SpecSpaceError`.
    """
    return _spec_from_yaml(checked_map(d, where, _SPEC_KEYS), where)


def spec_to_dict(spec: pb.JournalSpec) -> dict[str, Any]:
    """The YAML mapping of a JournalSpec: zero fields omitted, keys in Gazette's order."""
    out: dict[str, Any] = {}
    if spec.name:
        out["name"] = spec.name
    if spec.replication:
        out["replication"] = spec.replication
    if spec.labels.labels:
        out["labels"] = labels_to_yaml(labels_of(spec.labels))
    f = spec.fragment
    frag: dict[str, Any] = {}
    if f.length:
        frag["length"] = f.length
    if f.compression_codec:
        frag["compression_codec"] = pb.CompressionCodec.Name(f.compression_codec)
    if f.stores:
        frag["stores"] = list(f.stores)
    for key in _DURATION_KEYS:
        ns = ns_from_pb(getattr(f, key))
        if ns:
            frag[key] = format_duration_ns(ns)
    if f.path_postfix_template:
        frag["path_postfix_template"] = f.path_postfix_template
    if frag:
        out["fragment"] = frag
    if spec.flags:
        out["flags"] = _FLAG_NAMES.get(spec.flags, spec.flags)
    if spec.max_append_rate:
        out["max_append_rate"] = spec.max_append_rate
    if spec.HasField("suspend"):
        sus: dict[str, Any] = {}
        if spec.suspend.level:
            sus["level"] = _LEVEL_NAMES.get(spec.suspend.level, int(spec.suspend.level))
        if spec.suspend.offset:
            sus["offset"] = spec.suspend.offset
        out["suspend"] = sus
    return out


# ---------------------------------------------------------------------------------------------
# Spec algebra (Gazette's Union / Intersect / Subtract of JournalSpecs).


def _canonical(spec: pb.JournalSpec) -> pb.JournalSpec:
    """Clear zero-valued sub-messages, which Go cannot distinguish from absent ones."""
    if spec.HasField("fragment"):
        f = spec.fragment
        for key in _DURATION_KEYS:
            if f.HasField(key) and ns_from_pb(getattr(f, key)) == 0:  # type: ignore[arg-type]
                f.ClearField(key)  # type: ignore[arg-type]
        if f.ByteSize() == 0:
            spec.ClearField("fragment")
    if spec.HasField("labels") and not spec.labels.labels:
        spec.ClearField("labels")
    return spec


def _copy(spec: pb.JournalSpec) -> pb.JournalSpec:
    out = pb.JournalSpec()
    out.CopyFrom(spec)
    return out


def _dur(f: pb.JournalSpec.Fragment, key: str) -> int:
    return ns_from_pb(getattr(f, key))


def _set_dur(f: pb.JournalSpec.Fragment, key: str, ns: int) -> None:
    if ns:
        getattr(f, key).CopyFrom(ns_to_pb(ns))
    else:
        f.ClearField(key)  # type: ignore[arg-type]


def _union(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """``a`` with each zero-valued field taken from ``b`` (name and suspend are ``a``'s)."""
    out = _copy(a)
    if not out.replication:
        out.replication = b.replication
    set_labels(out.labels, union_labels(labels_of(a.labels), labels_of(b.labels)))
    fo, fb = out.fragment, b.fragment
    if not fo.length:
        fo.length = fb.length
    if not fo.compression_codec:
        fo.compression_codec = fb.compression_codec
    if not fo.stores:
        fo.stores.extend(fb.stores)
    for key in _DURATION_KEYS:
        if not _dur(fo, key):
            _set_dur(fo, key, _dur(fb, key))
    if not fo.path_postfix_template:
        fo.path_postfix_template = fb.path_postfix_template
    if not out.flags:
        out.flags = b.flags
    if not out.max_append_rate:
        out.max_append_rate = b.max_append_rate
    return _canonical(out)


def _intersect(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """Fields on which ``a`` and ``b`` agree; never ``suspend``."""
    out = _copy(a)
    if out.replication != b.replication:
        out.replication = 0
    set_labels(out.labels, intersect_labels(labels_of(a.labels), labels_of(b.labels)))
    fo, fb = out.fragment, b.fragment
    if fo.length != fb.length:
        fo.length = 0
    if fo.compression_codec != fb.compression_codec:
        fo.compression_codec = pb.INVALID
    if list(fo.stores) != list(fb.stores):
        del fo.stores[:]
    for key in _DURATION_KEYS:
        if _dur(fo, key) != _dur(fb, key):
            _set_dur(fo, key, 0)
    if fo.path_postfix_template != fb.path_postfix_template:
        fo.path_postfix_template = ""
    if out.flags != b.flags:
        out.flags = 0
    if out.max_append_rate != b.max_append_rate:
        out.max_append_rate = 0
    out.ClearField("suspend")
    return _canonical(out)


def _subtract(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """``a`` with every field that ``b`` matches zeroed (``suspend`` untouched)."""
    out = _copy(a)
    if out.replication == b.replication:
        out.replication = 0
    set_labels(out.labels, subtract_labels(labels_of(a.labels), labels_of(b.labels)))
    fo, fb = out.fragment, b.fragment
    if fo.length == fb.length:
        fo.length = 0
    if fo.compression_codec == fb.compression_codec:
        fo.compression_codec = pb.INVALID
    if list(fo.stores) == list(fb.stores):
        del fo.stores[:]
    for key in _DURATION_KEYS:
        if _dur(fo, key) == _dur(fb, key):
            _set_dur(fo, key, 0)
    if fo.path_postfix_template == fb.path_postfix_template:
        fo.path_postfix_template = ""
    if out.flags == b.flags:
        out.flags = 0
    if out.max_append_rate == b.max_append_rate:
        out.max_append_rate = 0
    return _canonical(out)


# ---------------------------------------------------------------------------------------------
# The tree.


@dataclass
class Node:
    """A journal (terminal) or directory of the hierarchy; ``spec`` may be partial."""

    spec: pb.JournalSpec = field(default_factory=pb.JournalSpec)
    delete: bool | None = None
    revision: int = 0
    comment: str = ""
    children: list[Node] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_dir(self) -> bool:
        return self.spec.name == "" or self.spec.name.endswith("/")

    def walk_terminals(self) -> Iterator[Node]:
        """Journal nodes beneath (or at) this node, in tree order."""
        if not self.is_dir:
            yield self
            return
        for child in self.children:
            yield from child.walk_terminals()


@dataclass
class FlatEntry:
    """One fully-specified journal of a spec space, as gazctl applies it."""

    spec: pb.JournalSpec
    revision: int = 0  # Etcd mod revision expected by the apply; 0 creates, -1 skips the check.
    delete: bool = False
    comment: str = ""


_NODE_KEYS = ("comment", "delete", *_SPEC_KEYS, "revision", "children")


def _where(name: str, fallback: str) -> str:
    return f"node {name!r}" if name else fallback


def node_from_dict(d: Any, where: str = "root node") -> Node:
    """A :class:`Node` tree from its YAML mapping. Does not :func:`validate` it."""
    m = as_map(d, where, "node")
    name = as_str(m.get("name"), where, "name")
    where = _where(name, where)
    check_keys(m, _NODE_KEYS, where, "")
    node = Node(
        spec=_spec_from_yaml(m, where),
        delete=as_opt_bool(m.get("delete"), where, "delete"),
        revision=as_int(m.get("revision"), where, "revision", *INT64),
        comment=as_str(m.get("comment"), where, "comment"),
    )
    for i, child in enumerate(as_list(m.get("children"), where, "children")):
        node.children.append(node_from_dict(child, f"{where}: children[{i}]"))
    return node


def node_to_dict(node: Node) -> dict[str, Any]:
    """The YAML mapping of a node tree, keys in Gazette's order."""
    out: dict[str, Any] = {}
    if node.comment:
        out["comment"] = node.comment
    if node.delete is not None:
        out["delete"] = node.delete
    out.update(spec_to_dict(node.spec))
    if node.revision:
        out["revision"] = node.revision
    if node.children:
        out["children"] = [node_to_dict(c) for c in node.children]
    return out


def validate(node: Node, where: str = "root node") -> None:
    """Check the tree is well formed (Gazette's rules); raise :class:`SpecSpaceError` if not.

    Specs themselves may be partial here and are not validated as JournalSpecs.
    """
    where = _where(node.name, where)
    if node.is_dir:
        if node.revision:
            raise SpecSpaceError(
                where, "revision", f"unexpected revision ({node.revision}) on a directory"
            )
        if node.spec.HasField("suspend"):
            raise SpecSpaceError(
                where, "suspend", "may be set only on journals (directories do not pass it down)"
            )
        if not node.children:
            raise SpecSpaceError(where, "children", "a directory expects one or more children")
        prev: str | None = None
        for i, child in enumerate(node.children):
            if not child.name.startswith(node.name):
                raise SpecSpaceError(
                    where,
                    f"children[{i}].name",
                    f"expected parent name to prefix child ({node.name} vs {child.name})",
                )
            if prev is not None and prev >= child.name:
                raise SpecSpaceError(
                    where,
                    f"children[{i}].name",
                    f"expected children to be ordered by name ({prev} vs {child.name})",
                )
            prev = child.name
            validate(child, f"{where}: children[{i}]")
        return

    err = _journal_name_error(node.name)
    if err is not None:
        raise SpecSpaceError(where, "name", err)
    if node.children:
        raise SpecSpaceError(
            where,
            "children",
            f"only directories have children, and a directory's name ends in '/' ({node.name})",
        )


def parse_yaml(text: str) -> Node:
    """Parse and validate one YAML document: a hierarchy, or a single journal at the top."""
    doc = load_document(text)
    if doc is None:
        raise SpecSpaceError("document", None, "empty document")
    node = node_from_dict(doc)
    validate(node)
    return node


def to_yaml(node: Node) -> str:
    """The YAML document of a node tree, as ``gazctl journals list -o yaml`` prints it."""
    return dump(node_to_dict(node))


def flatten(node: Node) -> list[FlatEntry]:
    """Validate the tree and push fields down: fully-specified journals in name order."""
    validate(node)
    out: list[FlatEntry] = []
    _push_down(node, pb.JournalSpec(), None, out)
    for a, b in zip(out, out[1:], strict=False):
        if a.spec.name == b.spec.name:
            raise SpecSpaceError(f"node {a.spec.name!r}", None, "journal appears more than once")
    return out


def _push_down(
    node: Node, above: pb.JournalSpec, delete: bool | None, out: list[FlatEntry]
) -> None:
    spec = _union(node.spec, above)
    if node.delete is not None:
        delete = node.delete
    if node.is_dir:
        for child in node.children:
            _push_down(child, spec, delete, out)
    else:
        out.append(FlatEntry(spec, node.revision, bool(delete), node.comment))


def nest(entries: Iterable[FlatEntry]) -> Node:
    """Group flat journals into a hierarchy and hoist common fields into directories.

    Entries are sorted by name; names must be valid and unique. An empty input yields an empty
    root directory, which does not validate (as in Gazette).
    """
    nodes: list[Node] = []
    for e in sorted(entries, key=lambda e: e.spec.name):
        where = f"node {e.spec.name!r}"
        err = _journal_name_error(e.spec.name)
        if err is not None:
            raise SpecSpaceError(where, "name", err)
        if nodes and nodes[-1].name == e.spec.name:
            raise SpecSpaceError(where, None, "journal appears more than once")
        nodes.append(
            Node(
                spec=_canonical(_sorted_labels(_copy(e.spec))),
                delete=True if e.delete else None,
                revision=e.revision,
                comment=e.comment,
            )
        )
    root = _extract_tree(nodes)
    _hoist(root)
    return root


def apply_request(text: str) -> pb.ApplyRequest:
    """The broker ApplyRequest of a journal-space YAML document (what ``journals apply`` sends)."""
    req = pb.ApplyRequest()
    for entry in flatten(parse_yaml(text)):
        change = req.changes.add(expect_mod_revision=entry.revision)
        if entry.delete:
            change.delete = entry.spec.name
        else:
            change.upsert.CopyFrom(entry.spec)
    return req


def from_list_response(resp: pb.ListResponse) -> Node:
    """The hoisted hierarchy of a broker's List response (``gazctl journals list -o yaml``)."""
    return nest(FlatEntry(j.spec, j.mod_revision) for j in resp.journals)


def _sorted_labels(spec: pb.JournalSpec) -> pb.JournalSpec:
    set_labels(spec.labels, sorted(labels_of(spec.labels)))
    return spec


def _shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` ending in '/'."""
    if len(a) > len(b):
        a, b = b, a
    n = 0
    while True:
        i = a.find("/", n)
        if i == -1 or a[: i + 1] != b[: i + 1]:
            return n
        n = i + 1


def _extract_tree(nodes: list[Node]) -> Node:
    """The directory tree of name-sorted, unique journal nodes.

    Gazette builds it by repeatedly wrapping the longest run of adjacent nodes that share the
    longest component prefix in a directory, which is quadratic. The same tree results from
    recursing top-down: a group of two or more nodes becomes a directory named by their
    longest shared component prefix, whose children are its nodes grouped by the next
    component. A directory thus appears only where it groups two or more nodes, and
    single-child chains (``a/b/`` holding only ``a/b/c/``) collapse into the deeper one.
    """
    if not nodes:
        return Node()
    if len(nodes) == 1:
        return nodes[0]
    return _directory(nodes, 0, len(nodes))


def _directory(nodes: list[Node], lo: int, hi: int) -> Node:
    """The directory grouping ``nodes[lo:hi]`` (two or more, sorted, sharing a prefix)."""
    plen = _shared_prefix(nodes[lo].name, nodes[hi - 1].name)
    out = Node(spec=pb.JournalSpec(name=nodes[lo].name[:plen]))
    i = lo
    while i < hi:
        name = nodes[i].name
        slash = name.find("/", plen)
        j = i + 1
        if slash != -1:
            # Names under the same next component are contiguous in sorted order.
            group = name[: slash + 1]
            while j < hi and nodes[j].name.startswith(group):
                j += 1
        out.children.append(nodes[i] if j - i == 1 else _directory(nodes, i, j))
        i = j
    return out


def hoist(node: Node) -> None:
    """In place, rewrite a tree so each directory carries the values all its journals share.

    The tree is first pushed down (every journal made explicit), then hoisted bottom-up:
    values moved into a directory are cleared at its children. ``flatten`` is unchanged by it.
    :func:`nest` hoists for you; this is for trees built or edited by hand.
    """
    validate(node)
    _push_down_in_place(node, pb.JournalSpec(), None)
    _hoist(node)


def _push_down_in_place(node: Node, above: pb.JournalSpec, delete: bool | None) -> None:
    node.spec = _union(node.spec, above)
    if node.delete is None:
        node.delete = delete
    if node.is_dir:
        for child in node.children:
            _push_down_in_place(child, node.spec, node.delete)
        node.spec, node.delete = pb.JournalSpec(name=node.name), None


def _hoist(node: Node) -> None:
    """Bottom-up hoisting of an already pushed-down tree (Gazette's ``Hoist``)."""
    if not node.is_dir:
        return
    for child in node.children:
        _hoist(child)
    common: pb.JournalSpec | None = None
    delete: bool | None = None
    for i, child in enumerate(node.children):
        if i == 0:
            common, delete = _copy(child.spec), child.delete
            # A lone child passes nothing non-hoistable up.
            common.ClearField("suspend")
        else:
            assert common is not None
            if delete != child.delete:
                delete = None
            common = _intersect(common, child.spec)
    if common is None:
        return
    common.name = node.name
    node.spec, node.delete = _canonical(common), delete
    for child in node.children:
        if delete is not None:
            child.delete = None
        child.spec = _subtract(child.spec, common)

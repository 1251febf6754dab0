"""Validation of protocol messages and values, rule for rule after Gazette.

Every ``validate_*`` function returns ``None`` for a well-formed argument and
otherwise raises ``ValidationError`` whose ``field`` is the attribute path, from
the argument, of the first offending value (see ``gazette.protocol.errors``), and
whose ``rule`` says which bound or rule was broken, with the offending value.

Invariants and deliberate choices:

* Checks run in Gazette's order, so the first error reported is Gazette's.
* Bounds are Gazette's: journal names 4..512 bytes, replication 1..5, fragment
  length 1 KiB..16 GiB, refresh interval 1 s..24 h, flush interval 0 or >= 1 min,
  broker journal limit <= 2^17, shard ids 4..512 bytes, fragments page limit <= 10000.
* Proto3 messages cannot tell an unset sub-message from an empty one, except where
  Gazette's own field is nullable (``Header`` of requests, ``Suspend``,
  ``signatureTTL``, registers ...); those are tested with ``HasField``.
* Stricter than Gazette, on purpose: path components (journal names, fragment path
  postfixes) may not contain ``..`` (Gazette's ``path.Clean`` keeps a leading
  ``..``, which would escape a file store's root); a fragment store URL may carry
  only the query arguments its scheme's store understands, which Gazette checks
  only when it first opens the store; ``path_postfix_template`` is checked for
  unclosed and empty actions only, not evaluated as a Go template.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, NamedTuple
from urllib.parse import unquote, unquote_plus, urlsplit

from google.protobuf.duration_pb2 import Duration

from gazette.protocol import consumer_pb2 as cpb
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.errors import ValidationError
from gazette.protocol.labels import (
    CONTENT_TYPE,
    MESSAGE_SUB_TYPE,
    MESSAGE_TYPE,
    META_NAME,
    META_PREFIX,
    PATH_SYMBOLS,
    TOKEN_SYMBOLS,
    validate_label_set,
    validate_single_value_labels,
    validate_token,
)

__all__ = [
    "fmt_ns",
    "go_clean",
    "within",
    "MAX_JOURNAL_REPLICATION",
    "STORE_QUERY_ARGS",
    "StoreURL",
    "parse_store_url",
    "validate_append_request",
    "validate_apply_request",
    "validate_broker_spec",
    "validate_change",
    "validate_compression_codec",
    "validate_duration",
    "validate_endpoint",
    "validate_fragment",
    "validate_fragment_spec",
    "validate_fragment_store",
    "validate_fragment_store_health_request",
    "validate_fragments_request",
    "validate_header",
    "validate_journal",
    "validate_journal_spec",
    "validate_label_selector",
    "validate_label_set",
    "validate_list_request",
    "validate_offsets",
    "validate_path_component",
    "validate_process_id",
    "validate_process_spec",
    "validate_read_request",
    "validate_replicate_request",
    "validate_route",
]

MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN = 4, 512
MAX_JOURNAL_REPLICATION = 5
MIN_FRAGMENT_LEN, MAX_FRAGMENT_LEN = 1 << 10, 1 << 34
_SECOND_NS = 1_000_000_000
MIN_REFRESH_INTERVAL_NS, MAX_REFRESH_INTERVAL_NS = _SECOND_NS, 24 * 3600 * _SECOND_NS
MIN_FLUSH_INTERVAL_NS = 60 * _SECOND_NS
MIN_ZONE_LEN, MAX_ZONE_LEN = 1, 32
MIN_BROKER_SUFFIX_LEN, MAX_BROKER_SUFFIX_LEN = 4, 128
MAX_BROKER_JOURNAL_LIMIT = 1 << 17
MAX_FRAGMENTS_PAGE_LIMIT = 10_000

# Protobuf's Duration range: +-10,000 years.
_MAX_DURATION_SECONDS = 315_576_000_000

_CODECS = frozenset(pb.CompressionCodec.values()) - {pb.INVALID}
_FLAGS = frozenset(pb.JournalSpec.Flag.values())
_SUSPEND_LEVELS = frozenset(pb.JournalSpec.Suspend.Level.values())
_APPEND_SUSPENDS = frozenset(pb.AppendRequest.Suspend.values())


@contextmanager
def within(parent: str) -> Iterator[None]:
    """Prefix ``parent`` to the field path of a ValidationError passing through."""
    try:
        yield
    except ValidationError as err:
        err.add_parent(parent)
        raise


# --- Scalars: durations, paths, names. ---


def fmt_ns(ns: int) -> str:
    if ns % _SECOND_NS == 0:
        return f"{ns // _SECOND_NS}s"
    return f"{ns / _SECOND_NS:g}s"


def validate_duration(
    d: Duration, field: str = "", *, min_ns: int | None = None, max_ns: int | None = None
) -> int:
    """Check a well-formed ``Duration`` within ``[min_ns, max_ns]``; returns nanoseconds."""
    if not -_MAX_DURATION_SECONDS <= d.seconds <= _MAX_DURATION_SECONDS:
        raise ValidationError(field, f"invalid duration (seconds {d.seconds} out of range)")
    if not -999_999_999 <= d.nanos <= 999_999_999 or (d.seconds * d.nanos < 0):
        raise ValidationError(
            field, f"invalid duration (seconds {d.seconds} and nanos {d.nanos} disagree)"
        )
    ns = d.seconds * _SECOND_NS + d.nanos
    if (min_ns is not None and ns < min_ns) or (max_ns is not None and ns > max_ns):
        lo = fmt_ns(min_ns) if min_ns is not None else ""
        hi = fmt_ns(max_ns) if max_ns is not None else ""
        if min_ns is not None and max_ns is not None:
            bound = f"{lo} <= duration <= {hi}"
        elif min_ns is not None:
            bound = f"duration >= {lo}"
        else:
            bound = f"duration <= {hi}"
        raise ValidationError(field, f"invalid duration ({fmt_ns(ns)}; expected {bound})")
    return ns


def go_clean(p: str) -> str:
    """Go's ``path.Clean``: the shortest lexically equivalent path."""
    if not p:
        return "."
    rooted = p.startswith("/")
    parts: list[str] = []
    for comp in p.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
        else:
            parts.append(comp)
    out = ("/" if rooted else "") + "/".join(parts)
    return out or "."


def validate_path_component(s: str, min_len: int, max_len: int, field: str = "") -> None:
    """A token of path symbols which is a clean, relative path without ``..``."""
    validate_token(s, PATH_SYMBOLS, min_len, max_len, field)
    if not s:
        return
    if go_clean(s) != s:
        raise ValidationError(field, f"must be a clean path ({s})")
    if s[0] == "/":
        raise ValidationError(field, f"cannot begin with '/' ({s})")
    if ".." in s.split("/"):
        raise ValidationError(field, f"cannot contain '..' components ({s})")


def validate_journal(name: str, field: str = "") -> None:
    """A journal name, optionally followed by a ``;metadata`` path segment."""
    if name in _VALID_JOURNALS:  # every append names its journal: check each name once
        return
    base, sep, meta = name.partition(";")
    validate_path_component(base, MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN, field)
    if sep:
        try:
            validate_path_component(meta, 1, MAX_JOURNAL_NAME_LEN)
        except ValidationError as err:
            raise ValidationError(field, f"metadata path segment: {err.rule}") from None
    if len(_VALID_JOURNALS) >= _VALID_JOURNALS_MAX:
        _VALID_JOURNALS.clear()
    _VALID_JOURNALS[name] = None


_VALID_JOURNALS: dict[str, None] = {}
"""Journal names found valid (bounded: cleared when full)."""
_VALID_JOURNALS_MAX = 8192


def _validate_registers_once(msg: pb.LabelSelector | pb.LabelSet, field: str) -> None:
    """``check_registers`` / ``union_registers`` of an append, validated once per distinct
    encoding: a writer fencing its appends (a recorder, a transactional producer) repeats the
    same selector on every one."""
    key = (field, msg.SerializeToString())
    if key in _VALID_REGISTERS:
        return
    with within(field):
        if isinstance(msg, pb.LabelSelector):
            validate_label_selector(msg)
        else:
            validate_label_set(msg)
    if len(_VALID_REGISTERS) >= _VALID_JOURNALS_MAX:
        _VALID_REGISTERS.clear()
    _VALID_REGISTERS[key] = None


_VALID_REGISTERS: dict[tuple[str, bytes], None] = {}
"""Encoded register selectors and sets found valid (bounded: cleared when full)."""



def validate_offsets(offsets: Mapping[str, int], field: str = "") -> None:
    """Journal → offset maps: valid journals, offsets >= 0; fields ``<field>['<journal>']``."""
    for journal, offset in offsets.items():
        key = f"{field}[{journal!r}]"
        validate_journal(journal, key)
        if offset < 0:
            raise ValidationError(key, f"invalid offset ({offset}; expected >= 0)")


def validate_compression_codec(codec: int, field: str = "compression_codec") -> None:
    if codec not in _CODECS:
        raise ValidationError(field, f"invalid value ({codec})")


# --- Processes, routes, headers. ---


def validate_process_id(pid: pb.ProcessSpec.ID) -> None:
    validate_token(pid.zone, TOKEN_SYMBOLS, MIN_ZONE_LEN, MAX_ZONE_LEN, "zone")
    validate_token(
        pid.suffix, TOKEN_SYMBOLS, MIN_BROKER_SUFFIX_LEN, MAX_BROKER_SUFFIX_LEN, "suffix"
    )


def validate_endpoint(endpoint: str, field: str = "") -> None:
    """An absolute URL with a host, e.g. ``http://host:port`` or ``unix://host/path``."""
    if _CONTROL.search(endpoint):
        raise ValidationError(field, f"invalid control character in URL ({endpoint!r})")
    try:
        parts = urlsplit(endpoint)
    except ValueError as err:
        raise ValidationError(field, f"{err} ({endpoint})") from None
    if not parts.scheme:
        raise ValidationError(field, f"not absolute: {endpoint}")
    if not parts.netloc:
        raise ValidationError(field, f"missing host: {endpoint}")


def validate_process_spec(spec: pb.ProcessSpec) -> None:
    with within("id"):
        validate_process_id(spec.id)
    validate_endpoint(spec.endpoint, "endpoint")


def validate_broker_spec(spec: pb.BrokerSpec) -> None:
    with within("process_spec"):
        validate_process_spec(spec.process_spec)
    if spec.journal_limit > MAX_BROKER_JOURNAL_LIMIT:
        raise ValidationError(
            "journal_limit",
            f"invalid journal_limit ({spec.journal_limit}; "
            f"expected 0 <= journal_limit <= {MAX_BROKER_JOURNAL_LIMIT})",
        )




def validate_route(route: pb.Route) -> None:
    members = route.members
    for i, member in enumerate(members):
        with within(f"members[{i}]"):
            validate_process_id(member)
        if i:
            prev = members[i - 1]
            if (prev.zone, prev.suffix) >= (member.zone, member.suffix):
                raise ValidationError(
                    f"members[{i}]",
                    f"members not in unique, sorted order (index {i}; "
                    f"{prev.zone}/{prev.suffix} >= {member.zone}/{member.suffix})",
                )
    if not -1 <= route.primary < len(members):
        raise ValidationError(
            "primary",
            f"invalid primary ({route.primary}; expected -1 <= primary < {len(members)})",
        )
    n = len(route.endpoints)
    if n and n != len(members):
        raise ValidationError(
            "endpoints", f"len(endpoints) != 0, and != len(members) ({n} vs {len(members)})"
        )
    for i, ep in enumerate(route.endpoints):
        if ep:
            validate_endpoint(ep, f"endpoints[{i}]")


def _validate_etcd(etcd: pb.Header.Etcd) -> None:
    if etcd.cluster_id == 0:
        raise ValidationError("cluster_id", "invalid cluster_id (expected != 0)")
    if etcd.member_id == 0:
        raise ValidationError("member_id", "invalid member_id (expected != 0)")
    if etcd.revision <= 0:
        raise ValidationError(
            "revision", f"invalid revision ({etcd.revision}; expected 0 < revision)"
        )
    if etcd.raft_term == 0:
        raise ValidationError("raft_term", "invalid raft_term (expected != 0)")


def validate_header(header: pb.Header) -> None:
    """``process_id`` is checked only when set; ``route`` and ``etcd`` always."""
    if header.process_id.zone or header.process_id.suffix:
        with within("process_id"):
            validate_process_id(header.process_id)
    with within("route"):
        validate_route(header.route)
    with within("etcd"):
        _validate_etcd(header.etcd)


# --- Fragments and fragment stores. ---


def validate_fragment(fragment: pb.Fragment) -> None:
    validate_journal(fragment.journal, "journal")
    if fragment.begin > fragment.end:
        raise ValidationError(
            "end", f"expected begin <= end (have {fragment.begin}, {fragment.end})"
        )
    validate_compression_codec(fragment.compression_codec)
    validate_path_component(fragment.path_postfix, 0, MAX_JOURNAL_NAME_LEN, "path_postfix")


class StoreURL(NamedTuple):
    """A parsed fragment store URL."""

    scheme: str
    #: Host part: the bucket (s3, gs), storage account (azure) or tenant id (azure-ad);
    #: empty for file stores.
    bucket: str
    #: Unescaped path, always ending in '/'. For azure-ad it begins
    #: ``/<storage account>/<container>/``.
    path: str
    #: Query arguments with lower-cased names (matching is case-insensitive) and the
    #: last value of a repeated name.
    query: Mapping[str, str]


#: Query arguments each store understands (lower-cased). Every store takes the
#: path rewriter's ``find`` and ``replace``; S3 also takes client settings.
STORE_QUERY_ARGS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "file": frozenset({"find", "replace"}),
        "gs": frozenset({"find", "replace"}),
        "azure": frozenset({"find", "replace"}),
        "azure-ad": frozenset({"find", "replace"}),
        "s3": frozenset(
            {
                "find",
                "replace",
                "profile",
                "endpoint",
                "acl",
                "storageclass",
                "sse",
                "ssekmskeyid",
                "region",
            }
        ),
    }
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def parse_store_url(url: str) -> StoreURL:
    """Parse and check a fragment store URL such as ``s3://bucket/prefix/?region=x``.

    Raises ``ValidationError`` (with an empty field) when the URL is not absolute,
    has an unknown scheme, misses its bucket (or azure-ad tenant, account and
    container), has a host on a file store, a path not ending in '/', malformed
    escapes, or a query argument the scheme's store does not take.
    """
    if _CONTROL.search(url):
        raise ValidationError("", f"invalid control character in URL ({url!r})")
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise ValidationError("", f"{err} ({url})") from None
    scheme = parts.scheme
    if not scheme:
        raise ValidationError("", f"not absolute ({url})")
    host = parts.netloc
    # A scheme not followed by '/' makes the rest opaque: there is no path.
    raw_path = parts.path if url[len(scheme) + 1 :].startswith("/") else ""
    if _BAD_ESCAPE.search(raw_path) or _BAD_ESCAPE.search(parts.query):
        raise ValidationError("", f"invalid URL escape ({url})")
    path = unquote(raw_path)
    if any(c.isspace() for c in host):
        raise ValidationError("", f"invalid character in host name ({host})")

    if scheme in ("s3", "gs", "azure"):
        if not host:
            raise ValidationError("", f"missing bucket ({url})")
    elif scheme == "azure-ad":
        split = path[1:].split("/")
        if not host:
            raise ValidationError("", f"missing tenant ID ({url})")
        if split[0] == "":
            raise ValidationError("", f"missing storage account ({url})")
        if len(split) < 2 or split[1] == "":
            raise ValidationError("", f"missing storage container ({url})")
    elif scheme == "file":
        if host:
            raise ValidationError("", f"file scheme cannot have host ({url})")
    else:
        raise ValidationError("", f"invalid scheme ({scheme})")

    if not path.endswith("/"):
        raise ValidationError("", f"path component doesn't end in '/' ({path})")

    query: dict[str, str] = {}
    allowed = STORE_QUERY_ARGS[scheme]
    for item in parts.query.split("&") if parts.query else ():
        if not item:
            continue
        if ";" in item:
            raise ValidationError("", f"invalid semicolon separator in query ({url})")
        key, _, value = item.partition("=")
        key = unquote_plus(key).lower()
        if key not in allowed:
            raise ValidationError(
                "",
                f"unknown query argument {key!r} of {scheme} store "
                f"(expected one of {', '.join(sorted(allowed))})",
            )
        query[key] = unquote_plus(value)
    return StoreURL(scheme, host, path, MappingProxyType(query))


def validate_fragment_store(url: str, field: str = "") -> None:
    try:
        parse_store_url(url)
    except ValidationError as err:
        raise err.add_parent(field) from None


# --- Journal specs. ---


def _check_media_type(value: str) -> None:
    """Go's ``mime.ParseMediaType`` checks on a label value (which cannot hold ';')."""
    mt = value.partition(";")[0].strip().lower()
    typ, rest = _consume_mime_token(mt)
    if not typ:
        raise ValidationError("", f"parsing {CONTENT_TYPE}: mime: no media type")
    if not rest:
        return
    if not rest.startswith("/"):
        raise ValidationError("", f"parsing {CONTENT_TYPE}: mime: expected slash after first token")
    sub, rest = _consume_mime_token(rest[1:])
    if not sub:
        raise ValidationError("", f"parsing {CONTENT_TYPE}: mime: expected token after slash")
    if rest:
        raise ValidationError(
            "", f"parsing {CONTENT_TYPE}: mime: unexpected content after media subtype"
        )


_MIME_TOKEN = re.compile(r'[^\x00-\x20\x7f-\U0010ffff()<>@,;:\\"/\[\]?=]*')


def _consume_mime_token(s: str) -> tuple[str, str]:
    m = _MIME_TOKEN.match(s)
    assert m is not None
    return m.group(), s[m.end() :]


def _validate_journal_labels(labels: pb.LabelSet) -> None:
    validate_label_set(labels)
    for reserved in (META_NAME, META_PREFIX):
        if any(lb.name == reserved for lb in labels.labels):
            raise ValidationError("", f'labels cannot include label "{reserved}"')
    validate_single_value_labels(labels)
    content_types = [lb.value for lb in labels.labels if lb.name == CONTENT_TYPE]
    if content_types:
        _check_media_type(content_types[0])
    names = {lb.name for lb in labels.labels}
    if MESSAGE_TYPE in names:
        if not content_types:
            raise ValidationError("", f"expected {CONTENT_TYPE} label alongside {MESSAGE_TYPE}")
    elif MESSAGE_SUB_TYPE in names:
        raise ValidationError("", f"expected {MESSAGE_TYPE} label alongside {MESSAGE_SUB_TYPE}")


def _check_template(tpl: str) -> None:
    i = tpl.find("{{")
    while i != -1:
        j = tpl.find("}}", i + 2)
        line = tpl.count("\n", 0, i) + 1
        if j == -1:
            raise ValidationError("", f"template: postfix:{line}: unclosed action")
        body = tpl[i + 2 : j].strip("-").strip()
        if not body:
            raise ValidationError("", f"template: postfix:{line}: missing value for command")
        i = tpl.find("{{", j + 2)


def validate_fragment_spec(frag: pb.JournalSpec.Fragment) -> None:
    """A JournalSpec's ``fragment`` configuration."""
    if not MIN_FRAGMENT_LEN <= frag.length <= MAX_FRAGMENT_LEN:
        raise ValidationError(
            "length",
            f"invalid length ({frag.length}; expected "
            f"{MIN_FRAGMENT_LEN} <= length <= {MAX_FRAGMENT_LEN})",
        )
    validate_compression_codec(frag.compression_codec)
    for i, store in enumerate(frag.stores):
        validate_fragment_store(store, f"stores[{i}]")
        if (
            i == 0
            and frag.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION
            and urlsplit(store).scheme == "file"
        ):
            raise ValidationError(
                "stores[0]",
                f"GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores ({store})",
            )
    validate_duration(
        frag.refresh_interval,
        "refresh_interval",
        min_ns=MIN_REFRESH_INTERVAL_NS,
        max_ns=MAX_REFRESH_INTERVAL_NS,
    )
    flush = validate_duration(frag.flush_interval, "flush_interval")
    if flush != 0 and flush < MIN_FLUSH_INTERVAL_NS:
        raise ValidationError(
            "flush_interval",
            f"invalid flush_interval ({fmt_ns(flush)}; "
            f"expected 0 or >= {fmt_ns(MIN_FLUSH_INTERVAL_NS)})",
        )
    with within("path_postfix_template"):
        _check_template(frag.path_postfix_template)
    # Any retention is allowed, as in Gazette; it must only be a well-formed Duration.
    validate_duration(frag.retention, "retention")


def validate_journal_spec(
    spec: pb.JournalSpec, *, max_replication: int = MAX_JOURNAL_REPLICATION
) -> None:
    validate_journal(spec.name, "name")
    if ";" in spec.name:
        raise ValidationError(
            "name",
            f"name cannot have a metadata path segment "
            f"({spec.name[spec.name.index(';') :]}; expected no segment)",
        )
    if not 1 <= spec.replication <= max_replication:
        raise ValidationError(
            "replication",
            f"invalid replication ({spec.replication}; "
            f"expected 1 <= replication <= {max_replication})",
        )
    with within("labels"):
        _validate_journal_labels(spec.labels)
    with within("fragment"):
        validate_fragment_spec(spec.fragment)
    if spec.flags not in _FLAGS:
        raise ValidationError("flags", f"invalid combination ({spec.flags})")
    if spec.max_append_rate < 0:
        raise ValidationError(
            "max_append_rate", f"invalid max_append_rate ({spec.max_append_rate}; expected >= 0)"
        )
    if spec.HasField("suspend"):
        if spec.suspend.level not in _SUSPEND_LEVELS:
            raise ValidationError("suspend.level", f"invalid level variant ({spec.suspend.level})")
        if spec.suspend.offset < 0:
            raise ValidationError(
                "suspend.offset", f"invalid offset ({spec.suspend.offset}; expected >= 0)"
            )


def validate_label_selector(selector: pb.LabelSelector) -> None:
    """Fields are ``include.labels[i]...`` and ``exclude.labels[i]...``."""
    with within("include"):
        validate_label_set(selector.include, allow_prefix=True)
    with within("exclude"):
        validate_label_set(selector.exclude, allow_prefix=True)


# --- Journal RPC requests. ---


def validate_read_request(req: pb.ReadRequest) -> None:
    if req.HasField("header"):
        with within("header"):
            validate_header(req.header)
    validate_journal(req.journal, "journal")
    if req.offset < -1:
        raise ValidationError(
            "offset", f"invalid offset ({req.offset}; expected -1 <= offset <= MaxInt64)"
        )
    if req.end_offset < 0 or (req.end_offset != 0 and req.end_offset < req.offset):
        raise ValidationError(
            "end_offset",
            f"invalid end_offset ({req.end_offset}; expected 0 or offset <= end_offset)",
        )


def validate_append_request(req: pb.AppendRequest) -> None:
    """The first message of an Append names the journal; later ones carry only content."""
    if req.journal:
        if req.HasField("header"):
            with within("header"):
                validate_header(req.header)
        validate_journal(req.journal, "journal")
        if req.offset < 0:
            raise ValidationError("offset", f"invalid offset ({req.offset}; expected >= 0)")
        if req.content:
            raise ValidationError("content", "unexpected content")
        if req.HasField("check_registers"):
            _validate_registers_once(req.check_registers, "check_registers")
        if req.HasField("union_registers"):
            _validate_registers_once(req.union_registers, "union_registers")
        if req.HasField("subtract_registers"):
            with within("subtract_registers"):
                validate_label_set(req.subtract_registers)
        if req.suspend not in _APPEND_SUSPENDS:
            raise ValidationError("suspend", f"invalid suspend variant ({req.suspend})")
        return
    for name in ("header", "check_registers", "union_registers", "subtract_registers"):
        if req.HasField(name):
            raise ValidationError(name, f"unexpected {name}")
    if req.do_not_proxy:
        raise ValidationError("do_not_proxy", "unexpected do_not_proxy")
    if req.offset != 0:
        raise ValidationError("offset", "unexpected offset")
    if req.suspend != pb.AppendRequest.SUSPEND_RESUME:
        raise ValidationError(
            "suspend", f"unexpected suspend ({req.suspend}; expected SUSPEND_RESUME)"
        )


def validate_replicate_request(req: pb.ReplicateRequest) -> None:
    """A proposal (the first message carries the header) or a chunk of content."""
    if req.HasField("proposal"):
        if req.HasField("header"):
            with within("header"):
                validate_header(req.header)
            if not req.acknowledge:
                raise ValidationError("acknowledge", "expected acknowledge with header")
        with within("proposal"):
            validate_fragment(req.proposal)
        # Absent registers read as empty, as Gazette's migration stub does.
        with within("registers"):
            validate_label_set(req.registers)
        if req.content:
            raise ValidationError(
                "content", f"unexpected content with proposal (len {len(req.content)})"
            )
        if req.content_delta != 0:
            raise ValidationError(
                "content_delta", f"unexpected content_delta with proposal ({req.content_delta})"
            )
        if req.deprecated_journal and req.deprecated_journal != req.proposal.journal:
            raise ValidationError(
                "deprecated_journal",
                f"deprecated_journal and proposal.journal mismatch "
                f"({req.deprecated_journal} vs {req.proposal.journal})",
            )
        return
    if not req.content:
        raise ValidationError("", "expected content or proposal")
    if req.content_delta < 0:
        raise ValidationError(
            "content_delta", f"invalid content_delta ({req.content_delta}; expected >= 0)"
        )
    if req.HasField("header"):
        raise ValidationError("header", "unexpected header with content")
    if req.HasField("registers"):
        raise ValidationError("registers", "unexpected registers with content")
    if req.acknowledge:
        raise ValidationError("acknowledge", "unexpected acknowledge with content")
    if req.deprecated_journal:
        raise ValidationError("deprecated_journal", "unexpected deprecated_journal with content")


def validate_list_request(req: pb.ListRequest) -> None:
    with within("selector"):
        validate_label_selector(req.selector)
    for side, labels in (("include", req.selector.include), ("exclude", req.selector.exclude)):
        for i, lb in enumerate(labels.labels):
            if lb.name == META_PREFIX and not lb.value.endswith("/"):
                raise ValidationError(
                    f"selector.{side}.labels[{i}].value",
                    f"expected trailing '/' of prefix ({lb.value})",
                )


def validate_apply_request(req: pb.ApplyRequest) -> None:
    for i, change in enumerate(req.changes):
        with within(f"changes[{i}]"):
            _validate_journal_change(change)


def _validate_journal_change(change: pb.ApplyRequest.Change) -> None:
    validate_change(change, validate_journal_spec, validate_journal)


def validate_change(
    change: pb.ApplyRequest.Change | cpb.ApplyRequest.Change,
    validate_spec: Callable[[Any], None],
    validate_name: Callable[[str, str], None],
) -> None:
    """The rules every ApplyRequest.Change follows, journals' and shards' alike: exactly one of
    ``upsert`` (a spec, checked by ``validate_spec``) or ``delete`` (a name, checked by
    ``validate_name``), and an ``expect_mod_revision`` that fits it (-1 is unchecked)."""
    if change.HasField("upsert"):
        if change.delete:
            raise ValidationError("", "both upsert and delete are set (expected exactly one)")
        with within("upsert"):
            validate_spec(change.upsert)
        if change.expect_mod_revision < -1:
            raise ValidationError(
                "expect_mod_revision",
                f"invalid expect_mod_revision ({change.expect_mod_revision}; expected >= 0 or -1)",
            )
    elif change.delete:
        validate_name(change.delete, "delete")
        if change.expect_mod_revision <= 0 and change.expect_mod_revision != -1:
            raise ValidationError(
                "expect_mod_revision",
                f"invalid expect_mod_revision ({change.expect_mod_revision}; expected > 0 or -1)",
            )
    else:
        raise ValidationError("", "neither upsert nor delete are set (expected exactly one)")


def validate_fragments_request(req: pb.FragmentsRequest) -> None:
    if req.HasField("header"):
        with within("header"):
            validate_header(req.header)
    validate_journal(req.journal, "journal")
    if req.end_mod_time != 0 and req.end_mod_time < req.begin_mod_time:
        raise ValidationError(
            "end_mod_time",
            f"invalid end_mod_time ({req.end_mod_time} must be after {req.begin_mod_time})",
        )
    if req.next_page_token < 0:
        raise ValidationError(
            "next_page_token", f"invalid next_page_token ({req.next_page_token}; must be >= 0)"
        )
    if not 0 <= req.page_limit <= MAX_FRAGMENTS_PAGE_LIMIT:
        raise ValidationError(
            "page_limit",
            f"invalid page_limit ({req.page_limit}; must be >= 0 and <= "
            f"{MAX_FRAGMENTS_PAGE_LIMIT})",
        )
    if req.HasField("signatureTTL"):
        ttl = validate_duration(req.signatureTTL, "signatureTTL")
        if ttl <= 0:
            raise ValidationError(
                "signatureTTL", f"invalid signatureTTL ({fmt_ns(ttl)}; must be > 0s)"
            )


def validate_fragment_store_health_request(req: pb.FragmentStoreHealthRequest) -> None:
    validate_fragment_store(req.fragment_store, "fragment_store")
    prefix = req.check_delete_prefix
    if prefix and not req.check_delete:
        raise ValidationError("check_delete_prefix", "cannot be set when check_delete is false")
    if prefix:
        if not prefix.endswith("/"):
            raise ValidationError("check_delete_prefix", f"must end in '/' ({prefix})")
        trimmed = prefix[:-1]
        if trimmed == ".." or trimmed.startswith("../"):
            raise ValidationError(
                "check_delete_prefix", f"cannot traverse outside the store ({prefix})"
            )
        validate_path_component(trimmed, 1, MAX_JOURNAL_NAME_LEN, "check_delete_prefix")

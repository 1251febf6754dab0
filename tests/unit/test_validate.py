"""Protocol validation: bad messages are refused naming the field and the rule.

Cases marked "Gazette" restate those of Gazette's *_extensions_test.go files
(broker/protocol and consumer/protocol), with snake_case field paths.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from gazette.protocol import consumer_pb2 as cpb
from gazette.protocol import labels as L
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import recoverylog_pb2 as rpb
from gazette.protocol import validate as v
from gazette.protocol import validate_consumer as vc
from gazette.protocol.errors import GazetteError, StatusError, ValidationError
from gazette.protocol.labels import LabelSet
from gazette.server.edge import grpc_status

_SEGMENT = re.compile(r"\.?(\w+)|\[(\d+)\]|\[('[^']*')\]")


def _segments(path: str) -> list[str | int]:
    out: list[str | int] = []
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        assert m, f"malformed field path {path!r} at {pos}"
        if m.group(1):
            out.append(m.group(1))
        elif m.group(2):
            out.append(int(m.group(2)))
        else:
            out.append(m.group(3)[1:-1])
        pos = m.end()
    return out


def _resolve(msg: Any, path: str) -> Any:
    """Evaluate a ValidationError field path on the validated message."""
    for seg in _segments(path):
        msg = msg[seg] if isinstance(seg, int) or not hasattr(msg, seg) else getattr(msg, seg)
    return msg


def _set(path: str, value: Any) -> Callable[[Any], None]:
    def mutate(msg: Any) -> None:
        *head, last = _segments(path)
        target = msg
        for seg in head:
            target = target[seg] if isinstance(seg, int) else getattr(target, seg)
        if isinstance(last, int):
            target[last] = value
        else:
            setattr(target, last, value)

    return mutate


def _present(name: str) -> Callable[[Any], None]:
    """Mark an empty sub-message field as set."""
    return lambda msg: getattr(msg, name).SetInParent()


def _refused(fn: Callable[[Any], None], msg: Message, field: str, rule_part: str) -> None:
    with pytest.raises(ValidationError) as info:
        fn(msg)
    err = info.value
    assert err.field == field, str(err)
    assert rule_part in err.rule, str(err)
    assert str(err) == (f"{field}: {err.rule}" if field else err.rule)
    _resolve(msg, field)  # The path names a real attribute of the message.


# --- Errors module. ---


def test_error_hierarchy_and_rpc_mapping() -> None:
    err = ValidationError("length", "too short")
    assert isinstance(err, GazetteError) and isinstance(err, ValueError)
    err.add_parent("fragment")
    err.add_parent("changes[0].upsert")
    assert err.field == "changes[0].upsert.fragment.length"
    assert str(err) == "changes[0].upsert.fragment.length: too short"
    assert str(ValidationError("", "whole message").add_parent("labels[2]")) == (
        "labels[2]: whole message"
    )
    assert ValidationError("[1]", "x").add_parent("members").field == "members[1]"

    assert grpc_status(err) == (grpc.StatusCode.INVALID_ARGUMENT, str(err))
    assert grpc_status(RuntimeError()) is None  # a bug: the edge ends it UNKNOWN, with an incident id
    status_err = StatusError(pb.JOURNAL_NOT_FOUND, "a/journal")
    assert status_err.status == pb.JOURNAL_NOT_FOUND
    assert str(status_err) == "JOURNAL_NOT_FOUND: a/journal"


# --- Journal names (Gazette: TestJournalValidationCases). ---


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("a/valid/path/to/a/journal", None),
        ("/leading/slash", "cannot begin with '/' (/leading/slash)"),
        ("trailing/slash/", "must be a clean path (trailing/slash/)"),
        ("extra-middle//slash", "must be a clean path (extra-middle//slash)"),
        ("not-$%|-a valid token", "not a valid token"),
        ("", "invalid length (0; expected 4 <= length <= 512)"),
        ("zz", "invalid length (2; expected 4 <= length <= 512)"),
        ("foo/bar;baz/bing", None),
        ("foo/bar/webhook;foo/bar/webhook/http%3A%2F%2Fexample.com%3A9000%2F", None),
        ("foo/bar;disallowed#rune", "metadata path segment: not a valid token (disallowed#rune)"),
        ("foo/bar;", "metadata path segment: invalid length (0; expected 1 <= length <= 512)"),
        # Beyond Gazette's table.
        ("a/./journal", "must be a clean path"),
        ("../escape", "cannot contain '..' components"),
        ("a" * 513, "invalid length (513;"),
    ],
)
def test_journal_names(name: str, rule: str | None) -> None:
    if rule is None:
        v.validate_journal(name, "journal")
        return
    with pytest.raises(ValidationError) as info:
        v.validate_journal(name, "journal")
    assert info.value.field == "journal"
    assert rule in info.value.rule


# --- Journal specs (Gazette: TestSpecValidationCases, and more). ---


def _seconds(s: int, nanos: int = 0) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=s, nanos=nanos)


def _journal_spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name="a/journal",
        replication=3,
        labels=LabelSet.of("aaa", "bbb").to_proto(),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 18,
            compression_codec=pb.GZIP,
            stores=["s3://bucket/path/", "gs://other-bucket/path/"],
            refresh_interval=_seconds(300),
            retention=_seconds(365 * 24 * 3600),
            path_postfix_template='date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
            '/hour={{ .Spool.FirstAppendTime.Format "15" }}',
        ),
        flags=pb.JournalSpec.O_RDWR,
        max_append_rate=12345,
    )


def _labels(*nv: str) -> Callable[[Any], object]:
    return lambda spec: spec.labels.CopyFrom(LabelSet.of(*nv).to_proto())


def _store(url: str, index: int = 0) -> Callable[[Any], object]:
    return _set(f"fragment.stores[{index}]", url)


def _duration(path: str, seconds: int, nanos: int = 0) -> Callable[[Any], object]:
    def mutate(spec: pb.JournalSpec) -> None:
        _resolve(spec, path).CopyFrom(_seconds(seconds, nanos))

    return mutate


_BAD_JOURNAL_SPECS: list[tuple[str, Callable[[Any], object], str, str]] = [
    ("rooted name", _set("name", "/bad/name"), "name", "cannot begin with '/' (/bad/name)"),
    (
        "metadata segment",
        _set("name", "a/journal;disallowed/meta"),
        "name",
        "name cannot have a metadata path segment (;disallowed/meta; expected no segment)",
    ),
    (
        "no replication",
        _set("replication", 0),
        "replication",
        "(0; expected 1 <= replication <= 5)",
    ),
    ("over replication", _set("replication", 1024), "replication", "invalid replication (1024;"),
    ("replication 6", _set("replication", 6), "replication", "invalid replication (6;"),
    (
        "bad label name",
        _set("labels.labels[0].name", "xxx xxx"),
        "labels.labels[0].name",
        "not a valid token (xxx xxx)",
    ),
    ("name label", _labels("name", "x"), "labels", 'labels cannot include label "name"'),
    ("empty name label", _labels("name", ""), "labels", 'cannot include label "name"'),
    ("prefix label", _labels("prefix", "a/"), "labels", 'cannot include label "prefix"'),
    (
        "repeated message type",
        _labels(L.MESSAGE_TYPE, "a", L.MESSAGE_TYPE, "b"),
        "labels.labels[1]",
        "expected single-value label has multiple values",
    ),
    (
        "unsorted labels",
        lambda s: s.labels.labels.add(name="aa", value="x"),
        "labels.labels[1]",
        "labels not in unique, sorted order",
    ),
    (
        "bad content type",
        _labels(L.CONTENT_TYPE, "invalid/content/type"),
        "labels",
        "parsing content-type: mime: unexpected content after media subtype",
    ),
    (
        "empty content type",
        _labels(L.CONTENT_TYPE, ""),
        "labels",
        "parsing content-type: mime: no media type",
    ),
    (
        "sub-type alone",
        _labels(L.MESSAGE_SUB_TYPE, "subtype"),
        "labels",
        f"expected {L.MESSAGE_TYPE} label alongside {L.MESSAGE_SUB_TYPE}",
    ),
    (
        "message type without content type",
        _labels(L.MESSAGE_SUB_TYPE, "subtype", L.MESSAGE_TYPE, "type"),
        "labels",
        f"expected {L.CONTENT_TYPE} label alongside {L.MESSAGE_TYPE}",
    ),
    (
        "zero length",
        _set("fragment.length", 0),
        "fragment.length",
        "invalid length (0; expected 1024 <= length <= 17179869184)",
    ),
    (
        "huge length",
        _set("fragment.length", (1 << 34) + 1),
        "fragment.length",
        "invalid length (17179869185;",
    ),
    (
        "bad codec",
        _set("fragment.compression_codec", 9999),
        "fragment.compression_codec",
        "invalid value (9999)",
    ),
    (
        "no codec",
        _set("fragment.compression_codec", pb.INVALID),
        "fragment.compression_codec",
        "invalid value (0)",
    ),
    (
        "offload with file store",
        lambda s: (
            _set("fragment.compression_codec", pb.GZIP_OFFLOAD_DECOMPRESSION)(s),
            _store("file:///a/root/")(s),
        ),
        "fragment.stores[0]",
        "GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores (file:///a/root/)",
    ),
    (
        "refresh 1ms",
        _duration("fragment.refresh_interval", 0, 1_000_000),
        "fragment.refresh_interval",
        "(0.001s; expected 1s <= duration <= 86400s)",
    ),
    (
        "refresh 25h",
        _duration("fragment.refresh_interval", 25 * 3600),
        "fragment.refresh_interval",
        "(90000s;",
    ),
    (
        "refresh unset",
        _duration("fragment.refresh_interval", 0),
        "fragment.refresh_interval",
        "(0s;",
    ),
    (
        "flush 1s",
        _duration("fragment.flush_interval", 1),
        "fragment.flush_interval",
        "invalid flush_interval (1s; expected 0 or >= 60s)",
    ),
    (
        "retention malformed",
        _duration("fragment.retention", 1, -5),
        "fragment.retention",
        "disagree",
    ),
    (
        "bad template",
        _set("fragment.path_postfix_template", "{{ bad template"),
        "fragment.path_postfix_template",
        "template: postfix:1: unclosed action",
    ),
    (
        "empty action",
        _set("fragment.path_postfix_template", "a\n{{ }}"),
        "fragment.path_postfix_template",
        "template: postfix:2: missing value",
    ),
    (
        "relative store",
        lambda s: s.fragment.stores.append("invalid"),
        "fragment.stores[2]",
        "not absolute (invalid)",
    ),
    ("ftp store", _store("ftp://host/path/"), "fragment.stores[0]", "invalid scheme (ftp)"),
    ("s3 without bucket", _store("s3:///path/"), "fragment.stores[0]", "missing bucket"),
    ("opaque s3", _store("s3:bucket/path/"), "fragment.stores[0]", "missing bucket"),
    (
        "store path without slash",
        _store("s3://bucket/path", 1),
        "fragment.stores[1]",
        "path component doesn't end in '/' (/path)",
    ),
    (
        "store without path",
        _store("gs://bucket"),
        "fragment.stores[0]",
        "path component doesn't end in '/' ()",
    ),
    (
        "unknown s3 argument",
        _store("s3://bucket/p/?bogus=1"),
        "fragment.stores[0]",
        "unknown query argument 'bogus' of s3 store",
    ),
    (
        "s3 argument on gs",
        _store("gs://bucket/p/?region=x"),
        "fragment.stores[0]",
        "unknown query argument 'region' of gs store",
    ),
    ("bad escape", _store("s3://bucket/p%zz/"), "fragment.stores[0]", "invalid URL escape"),
    (
        "semicolon query",
        _store("s3://bucket/p/?region=a;b"),
        "fragment.stores[0]",
        "invalid semicolon separator",
    ),
    (
        "file with host",
        _store("file://host/path/"),
        "fragment.stores[0]",
        "file scheme cannot have host",
    ),
    (
        "azure-ad no account",
        _store("azure-ad://tenant/"),
        "fragment.stores[0]",
        "missing storage account",
    ),
    (
        "azure-ad no container",
        _store("azure-ad://tenant/acct/"),
        "fragment.stores[0]",
        "missing storage container",
    ),
    (
        "azure-ad no tenant",
        _store("azure-ad:///acct/cont/"),
        "fragment.stores[0]",
        "missing tenant ID",
    ),
    (
        "flags rdwr|rdonly",
        _set("flags", pb.JournalSpec.O_RDWR | pb.JournalSpec.O_RDONLY),
        "flags",
        "invalid combination (5)",
    ),
    (
        "flags rdwr|wronly",
        _set("flags", pb.JournalSpec.O_RDWR | pb.JournalSpec.O_WRONLY),
        "flags",
        "invalid combination (6)",
    ),
    (
        "flags rdonly|wronly",
        _set("flags", pb.JournalSpec.O_RDONLY | pb.JournalSpec.O_WRONLY),
        "flags",
        "invalid combination (3)",
    ),
    (
        "negative append rate",
        _set("max_append_rate", -1),
        "max_append_rate",
        "invalid max_append_rate (-1; expected >= 0)",
    ),
    (
        "negative suspend offset",
        _set("suspend.offset", -1),
        "suspend.offset",
        "invalid offset (-1; expected >= 0)",
    ),
    (
        "bad suspend level",
        _set("suspend.level", 12345),
        "suspend.level",
        "invalid level variant (12345)",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "rule"),
    [pytest.param(m, f, r, id=i) for i, m, f, r in _BAD_JOURNAL_SPECS],
)
def test_bad_journal_specs(mutate: Callable[[Any], object], field: str, rule: str) -> None:
    spec = _journal_spec()
    v.validate_journal_spec(spec)  # The base case is valid...
    mutate(spec)
    _refused(v.validate_journal_spec, spec, field, rule)  # ...and one change breaks it.


_GOOD_JOURNAL_SPECS: list[tuple[str, Callable[[Any], object]]] = [
    ("base", lambda s: None),
    *((f"flags {f}", _set("flags", f)) for f in (0, 1, 2, 4)),
    ("no template", _set("fragment.path_postfix_template", "")),
    ("no stores", lambda s: s.fragment.ClearField("stores")),
    ("replication 5", _set("replication", 5)),
    ("length bounds", _set("fragment.length", 1024)),
    ("flush 1m", _duration("fragment.flush_interval", 60)),
    ("refresh 24h", _duration("fragment.refresh_interval", 24 * 3600)),
    ("negative retention", _duration("fragment.retention", -5)),
    ("suspended", _set("suspend.level", pb.JournalSpec.Suspend.FULL)),
    ("typed", _labels(L.MESSAGE_TYPE, "type", L.CONTENT_TYPE, L.CONTENT_TYPE_JSON_LINES)),
    (
        "sub-typed",
        _labels(
            L.MESSAGE_SUB_TYPE,
            "sub",
            L.MESSAGE_TYPE,
            "type",
            L.CONTENT_TYPE,
            "text/csv",
            L.TAG,
            "a",
            L.TAG,
            "b",
        ),
    ),
    ("bare media type", _labels(L.CONTENT_TYPE, "text")),
    (
        "every s3 argument",
        _store(
            "s3://bucket/p/?endpoint=http%3A%2F%2Flocalhost%3A9000&region=us-east-1&ACL=x"
            "&StorageClass=y&SSE=AES256&SSEKMSKeyId=k&profile=p&find=a&replace=b"
        ),
    ),
    ("azure", _store("azure://account/container/prefix/?find=x&replace=y")),
    ("azure-ad", _store("azure-ad://tenant/account/container/prefix/")),
    ("file", _store("file:///a/root/")),
    ("offload on s3", _set("fragment.compression_codec", pb.GZIP_OFFLOAD_DECOMPRESSION)),
]


@pytest.mark.parametrize("mutate", [pytest.param(m, id=i) for i, m in _GOOD_JOURNAL_SPECS])
def test_good_journal_specs(mutate: Callable[[Any], object]) -> None:
    spec = _journal_spec()
    mutate(spec)
    v.validate_journal_spec(spec)


def test_max_replication_is_configurable() -> None:
    spec = _journal_spec()
    spec.replication = 7
    v.validate_journal_spec(spec, max_replication=9)
    _refused(v.validate_journal_spec, spec, "replication", "expected 1 <= replication <= 5")


def test_tutorial_specs_are_valid() -> None:
    # The broker tutorial's example/journal and a foobar/ partition.
    example = pb.JournalSpec(
        name="example/journal",
        replication=1,
        labels=LabelSet.of(
            L.MESSAGE_TYPE,
            "TestMessage",
            L.REGION,
            "local",
            L.TAG,
            "demo",
            L.CONTENT_TYPE,
            L.CONTENT_TYPE_JSON_LINES,
        ).to_proto(),
        fragment=pb.JournalSpec.Fragment(
            length=131072,
            compression_codec=pb.SNAPPY,
            stores=["file:///"],
            refresh_interval=_seconds(60),
        ),
    )
    v.validate_journal_spec(example)
    part = pb.JournalSpec(
        name="foobar/part-000",
        replication=1,
        labels=LabelSet.of(L.CONTENT_TYPE, L.CONTENT_TYPE_JSON_LINES, "my-label", "").to_proto(),
        fragment=pb.JournalSpec.Fragment(
            length=4096,
            compression_codec=pb.GZIP,
            stores=["file:///"],
            refresh_interval=_seconds(60),
            flush_interval=_seconds(60),
        ),
    )
    v.validate_journal_spec(part)
    # The parent node "foobar/" itself is not a journal name.
    part.name = "foobar/"
    _refused(v.validate_journal_spec, part, "name", "must be a clean path")


def test_parse_store_url() -> None:
    url = v.parse_store_url("S3://my-bucket/a%20b/?Region=us-east-1&region=eu-west-1&SSE=AES256")
    assert tuple(url) == ("s3", "my-bucket", "/a b/", {"region": "eu-west-1", "sse": "AES256"})
    assert url.query["region"] == "eu-west-1"  # Last value wins; names are case-insensitive.
    assert v.parse_store_url("file:///") == ("file", "", "/", {})
    assert v.parse_store_url("azure-ad://t/acct/cont/").path == "/acct/cont/"
    assert v.parse_store_url("file:///x/?find=a+b").query == {"find": "a b"}
    with pytest.raises(ValidationError) as info:
        v.parse_store_url("s3://bucket/\x00/")
    assert "control character" in str(info.value)


# --- Brokers, routes, headers (Gazette: broker_spec, route, header tests). ---


@pytest.mark.parametrize(
    ("zone", "suffix", "field", "rule"),
    [
        ("a-zone", "a-name", None, ""),
        ("", "a-name", "zone", "invalid length (0; expected 1 <= length <= 32)"),
        ("&*", "a-name", "zone", "not a valid token"),
        ("a-very-very-very-very-looong-zone", "a-name", "zone", "invalid length (33;"),
        ("a-zone", "ae", "suffix", "invalid length (2; expected 4 <= length <= 128)"),
        ("a-zone", "&*($", "suffix", "not a valid token"),
    ],
)
def test_process_ids(zone: str, suffix: str, field: str | None, rule: str) -> None:
    pid = pb.ProcessSpec.ID(zone=zone, suffix=suffix)
    if field is None:
        v.validate_process_id(pid)
    else:
        _refused(v.validate_process_id, pid, field, rule)


def test_broker_spec() -> None:
    spec = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone="a-zone", suffix="a-name"), endpoint="http://foo"
        ),
        journal_limit=5,
    )
    v.validate_broker_spec(spec)
    spec.process_spec.id.zone = ""
    _refused(v.validate_broker_spec, spec, "process_spec.id.zone", "invalid length")
    spec.process_spec.id.zone = "a-zone"
    spec.process_spec.endpoint = "invalid"
    _refused(v.validate_broker_spec, spec, "process_spec.endpoint", "not absolute: invalid")
    spec.process_spec.endpoint = "unix://host/a/socket"
    v.validate_broker_spec(spec)
    spec.journal_limit = (1 << 17) + 1
    _refused(v.validate_broker_spec, spec, "journal_limit", "expected 0 <= journal_limit <= 131072")

    consumer = cpb.ConsumerSpec(process_spec=spec.process_spec, shard_limit=3)
    vc.validate_consumer_spec(consumer)
    consumer.process_spec.endpoint = "http://"
    _refused(vc.validate_consumer_spec, consumer, "process_spec.endpoint", "missing host")


def _route() -> pb.Route:
    return pb.Route(
        primary=-1,
        members=[
            pb.ProcessSpec.ID(zone="zone-a", suffix="member-1"),
            pb.ProcessSpec.ID(zone="zone-a", suffix="member-3"),
            pb.ProcessSpec.ID(zone="zone-b", suffix="member-2"),
        ],
        endpoints=["http://foo", "http://bar", "http://baz"],
    )


def test_route() -> None:
    rt = _route()
    v.validate_route(rt)
    rt.members[0].zone = "invalid zone"
    _refused(v.validate_route, rt, "members[0].zone", "not a valid token (invalid zone)")
    rt = _route()
    rt.members[1].suffix = "member-4"
    rt.members[1].zone = "zone-c"
    _refused(v.validate_route, rt, "members[2]", "members not in unique, sorted order (index 2;")
    rt = _route()
    rt.members[1].CopyFrom(rt.members[0])
    _refused(v.validate_route, rt, "members[1]", "unique, sorted")
    rt = _route()
    rt.primary = -2
    _refused(v.validate_route, rt, "primary", "invalid primary (-2; expected -1 <= primary < 3)")
    rt.primary = 3
    _refused(v.validate_route, rt, "primary", "invalid primary (3;")
    rt.primary = 2
    rt.endpoints.append("http://bing")
    _refused(v.validate_route, rt, "endpoints", "(4 vs 3)")
    del rt.endpoints[3]
    rt.endpoints[2] = "invalid"
    _refused(v.validate_route, rt, "endpoints[2]", "not absolute: invalid")
    rt.endpoints[2] = ""  # An unknown endpoint is permitted.
    v.validate_route(rt)


def _header() -> pb.Header:
    return pb.Header(
        process_id=pb.ProcessSpec.ID(zone="zone", suffix="name"),
        route=pb.Route(primary=0, members=[pb.ProcessSpec.ID(zone="zone", suffix="name")]),
        etcd=pb.Header.Etcd(cluster_id=12, member_id=34, revision=56, raft_term=78),
    )


def test_header() -> None:
    h = _header()
    v.validate_header(h)
    h.process_id.suffix = ""
    _refused(v.validate_header, h, "process_id.suffix", "invalid length")
    h.ClearField("process_id")  # An empty process id is permitted.
    v.validate_header(h)
    h.route.primary = 2
    _refused(v.validate_header, h, "route.primary", "invalid primary")
    h.route.primary = 0
    for field, rule in [
        ("cluster_id", "invalid cluster_id (expected != 0)"),
        ("member_id", "invalid member_id (expected != 0)"),
        ("revision", "invalid revision (0; expected 0 < revision)"),
        ("raft_term", "invalid raft_term (expected != 0)"),
    ]:
        bad = _header()
        setattr(bad.etcd, field, 0)
        _refused(v.validate_header, bad, f"etcd.{field}", rule)
    bad = _header()
    bad.ClearField("etcd")
    _refused(v.validate_header, bad, "etcd.cluster_id", "invalid cluster_id")


# --- Fragments. ---


def _fragment() -> pb.Fragment:
    return pb.Fragment(
        journal="a/journal", begin=10, end=20, compression_codec=pb.SNAPPY, path_postfix="a=1/b=2"
    )


@pytest.mark.parametrize(
    ("mutate", "field", "rule"),
    [
        (_set("journal", "/bad"), "journal", "cannot begin with '/' (/bad)"),
        (_set("journal", "bad journal"), "journal", "not a valid token"),
        (_set("begin", 21), "end", "expected begin <= end (have 21, 20)"),
        (_set("compression_codec", 0), "compression_codec", "invalid value (0)"),
        (_set("path_postfix", "/rooted"), "path_postfix", "cannot begin with '/'"),
        (_set("path_postfix", "a/../.."), "path_postfix", "must be a clean path"),
        (_set("path_postfix", "../x"), "path_postfix", "cannot contain '..'"),
    ],
)
def test_bad_fragments(mutate: Callable[[Any], object], field: str, rule: str) -> None:
    frag = _fragment()
    v.validate_fragment(frag)
    mutate(frag)
    _refused(v.validate_fragment, frag, field, rule)


# --- Journal RPC requests. ---


def test_read_request() -> None:
    req = pb.ReadRequest(journal="a/journal", offset=-1)
    v.validate_read_request(req)
    req.header.CopyFrom(_header())
    v.validate_read_request(req)
    req.header.etcd.revision = 0
    _refused(v.validate_read_request, req, "header.etcd.revision", "invalid revision")
    req.ClearField("header")
    req.journal = "/a"
    _refused(v.validate_read_request, req, "journal", "invalid length")
    req.journal = "a/journal"
    req.offset = -2
    _refused(v.validate_read_request, req, "offset", "invalid offset (-2; expected -1 <= offset")
    req.offset = 100
    req.end_offset = 50
    _refused(v.validate_read_request, req, "end_offset", "expected 0 or offset <= end_offset")
    req.end_offset = -1
    _refused(v.validate_read_request, req, "end_offset", "invalid end_offset (-1;")
    req.end_offset = 100
    v.validate_read_request(req)


def test_append_request() -> None:
    first = pb.AppendRequest(journal="a/journal", offset=0)
    v.validate_append_request(first)
    first.check_registers.include.labels.add(name="bad label", value="x")
    _refused(
        v.validate_append_request,
        first,
        "check_registers.include.labels[0].name",
        "not a valid token",
    )
    first.ClearField("check_registers")
    first.union_registers.labels.add(name="zz", value="1", prefix=True)
    _refused(v.validate_append_request, first, "union_registers.labels[0].prefix", "prefix")
    first.ClearField("union_registers")
    first.subtract_registers.labels.add(name="a", value="1")
    _refused(v.validate_append_request, first, "subtract_registers.labels[0].name", "length")
    first.ClearField("subtract_registers")
    first.offset = -1
    _refused(v.validate_append_request, first, "offset", "invalid offset (-1; expected >= 0)")
    first.offset = 0
    first.content = b"data"
    _refused(v.validate_append_request, first, "content", "unexpected content")
    first.content = b""
    first.suspend = 99  # type: ignore[assignment]
    _refused(v.validate_append_request, first, "suspend", "invalid suspend variant (99)")

    chunk = pb.AppendRequest(content=b"data")
    v.validate_append_request(chunk)
    v.validate_append_request(pb.AppendRequest())  # The empty commit chunk.
    mutations: list[tuple[str, Callable[[Any], object]]] = [
        ("header", lambda r: r.header.CopyFrom(_header())),
        ("do_not_proxy", _set("do_not_proxy", True)),
        ("offset", _set("offset", 5)),
        ("check_registers", _present("check_registers")),
        ("union_registers", _present("union_registers")),
        ("subtract_registers", _present("subtract_registers")),
        ("suspend", _set("suspend", pb.AppendRequest.SUSPEND_NOW)),
    ]
    for field, mutate in mutations:
        bad = pb.AppendRequest(content=b"data")
        mutate(bad)
        _refused(v.validate_append_request, bad, field, "unexpected")


def test_replicate_request() -> None:
    proposal = pb.ReplicateRequest(
        header=_header(), proposal=_fragment(), acknowledge=True, registers=pb.LabelSet()
    )
    v.validate_replicate_request(proposal)
    proposal.acknowledge = False
    _refused(v.validate_replicate_request, proposal, "acknowledge", "expected acknowledge")
    proposal.acknowledge = True
    proposal.proposal.begin = 30
    _refused(v.validate_replicate_request, proposal, "proposal.end", "begin <= end")
    proposal.proposal.begin = 10
    proposal.registers.labels.add(name="b", value="")
    _refused(v.validate_replicate_request, proposal, "registers.labels[0].name", "length")
    proposal.ClearField("registers")  # Absent registers read as empty.
    v.validate_replicate_request(proposal)
    proposal.content = b"x"
    _refused(v.validate_replicate_request, proposal, "content", "unexpected content with proposal")
    proposal.content = b""
    proposal.content_delta = 3
    _refused(v.validate_replicate_request, proposal, "content_delta", "unexpected content_delta")
    proposal.content_delta = 0
    proposal.deprecated_journal = "other/journal"
    _refused(v.validate_replicate_request, proposal, "deprecated_journal", "mismatch")
    proposal.deprecated_journal = "a/journal"
    v.validate_replicate_request(proposal)

    _refused(
        v.validate_replicate_request, pb.ReplicateRequest(), "", "expected content or proposal"
    )
    content = pb.ReplicateRequest(content=b"abc", content_delta=0)
    v.validate_replicate_request(content)
    mutations: list[tuple[str, Callable[[Any], object]]] = [
        ("content_delta", _set("content_delta", -1)),
        ("header", lambda r: r.header.CopyFrom(_header())),
        ("registers", _present("registers")),
        ("acknowledge", _set("acknowledge", True)),
        ("deprecated_journal", _set("deprecated_journal", "a/journal")),
    ]
    for field, mutate in mutations:
        bad = pb.ReplicateRequest(content=b"abc")
        mutate(bad)
        _refused(v.validate_replicate_request, bad, field, field)


def test_list_request() -> None:
    req = pb.ListRequest(selector=L.LabelSelector.parse("prefix=a/, name:prefix=b").to_proto())
    v.validate_list_request(req)
    req = pb.ListRequest(selector=L.LabelSelector.parse("x-label, prefix!=a/b").to_proto())
    _refused(v.validate_list_request, req, "selector.exclude.labels[0].value", "trailing '/'")
    req = pb.ListRequest()
    req.selector.include.labels.add(name="zz", value="1")
    req.selector.include.labels.add(name="aa", value="1")
    _refused(v.validate_list_request, req, "selector.include.labels[1]", "sorted order")
    vc.validate_shard_list_request(cpb.ListRequest(selector=pb.LabelSelector()))


def test_apply_request() -> None:
    req = pb.ApplyRequest(
        changes=[
            pb.ApplyRequest.Change(upsert=_journal_spec(), expect_mod_revision=0),
            pb.ApplyRequest.Change(delete="other/journal", expect_mod_revision=-1),
        ]
    )
    v.validate_apply_request(req)
    req.changes[0].upsert.fragment.length = 1
    _refused(v.validate_apply_request, req, "changes[0].upsert.fragment.length", "invalid length")
    req.changes[0].upsert.fragment.length = 1024
    req.changes[0].expect_mod_revision = -2
    _refused(v.validate_apply_request, req, "changes[0].expect_mod_revision", ">= 0 or -1")
    req.changes[0].expect_mod_revision = 0
    req.changes[1].expect_mod_revision = 0
    _refused(v.validate_apply_request, req, "changes[1].expect_mod_revision", "> 0 or -1")
    req.changes[1].expect_mod_revision = 7
    req.changes[1].delete = "bad journal"
    _refused(v.validate_apply_request, req, "changes[1].delete", "not a valid token")
    req.changes[1].delete = ""
    _refused(v.validate_apply_request, req, "changes[1]", "neither upsert nor delete")
    req.changes[0].delete = "a/journal"
    _refused(v.validate_apply_request, req, "changes[0]", "both upsert and delete")


def test_fragments_request() -> None:
    req = pb.FragmentsRequest(journal="a/journal", begin_mod_time=10, end_mod_time=20)
    v.validate_fragments_request(req)
    for mutate, field, rule in [
        (_set("end_mod_time", 5), "end_mod_time", "(5 must be after 10)"),
        (_set("next_page_token", -1), "next_page_token", "must be >= 0"),
        (_set("page_limit", 10001), "page_limit", "must be >= 0 and <= 10000"),
        (_set("page_limit", -1), "page_limit", "invalid page_limit (-1;"),
        (_present("signatureTTL"), "signatureTTL", "must be > 0s"),
        (_set("journal", ""), "journal", "invalid length"),
    ]:
        bad = pb.FragmentsRequest()
        bad.CopyFrom(req)
        mutate(bad)
        _refused(v.validate_fragments_request, bad, field, rule)
    req.signatureTTL.seconds = 60
    v.validate_fragments_request(req)


def test_fragment_store_health_request() -> None:
    req = pb.FragmentStoreHealthRequest(
        fragment_store="s3://bucket/p/", check_delete=True, check_delete_prefix="probe/"
    )
    v.validate_fragment_store_health_request(req)
    for store, prefix, delete, field, rule in [
        ("s3://bucket/p", "", False, "fragment_store", "doesn't end in '/'"),
        ("s3://bucket/p/", "x/", False, "check_delete_prefix", "cannot be set when"),
        ("s3://bucket/p/", "x", True, "check_delete_prefix", "must end in '/'"),
        ("s3://bucket/p/", "../", True, "check_delete_prefix", "cannot traverse"),
        ("s3://bucket/p/", "../x/", True, "check_delete_prefix", "cannot traverse"),
        ("s3://bucket/p/", "a//", True, "check_delete_prefix", "clean path"),
    ]:
        bad = pb.FragmentStoreHealthRequest(
            fragment_store=store, check_delete=delete, check_delete_prefix=prefix
        )
        _refused(v.validate_fragment_store_health_request, bad, field, rule)


# --- Shards (Gazette: TestShardValidationCases, TestShardSpecValidationCases). ---


@pytest.mark.parametrize(
    ("shard_id", "rule"),
    [
        ("a-valid-shard", None),
        ("not-$%|-a-token", "not a valid token"),
        ("", "invalid length (0; expected 4 <="),
        ("zz", "invalid length (2; expected 4 <="),
    ],
)
def test_shard_ids(shard_id: str, rule: str | None) -> None:
    if rule is None:
        vc.validate_shard_id(shard_id)
        return
    with pytest.raises(ValidationError, match=re.escape(rule)):
        vc.validate_shard_id(shard_id, "id")


def test_shard_spec_sequence() -> None:
    spec = cpb.ShardSpec(
        id="bad id",
        sources=[
            cpb.ShardSpec.Source(journal="journal 2"),
            cpb.ShardSpec.Source(journal="journal/1", min_offset=-1),
        ],
        recovery_log_prefix="bad prefix",
        hint_prefix="not empty",
        hint_backups=-1,
        min_txn_duration=_seconds(-1),
        labels=pb.LabelSet(labels=[pb.Label(name="bad label", value="value")]),
    )

    def fails(field: str, rule: str) -> None:
        _refused(vc.validate_shard_spec, spec, field, rule)

    fails("id", "not a valid token (bad id)")
    spec.id = "a-shard-id"
    fails("recovery_log_prefix", "not a valid token (bad prefix/a-shard-id)")
    spec.recovery_log_prefix = ""
    fails("hint_prefix", "invalid non-empty hint_prefix with empty recovery_log_prefix (not empty)")
    spec.hint_prefix, spec.recovery_log_prefix = "", "recovery/logs"
    fails("hint_prefix", "hint_prefix is not an absolute, clean, non-directory path ()")
    for bad in ("relative/path", "/rooted/dir/", "/rooted//path"):
        spec.hint_prefix = bad
        fails("hint_prefix", f"non-directory path ({bad})")
    spec.hint_prefix = "/rooted/path"
    fails("hint_backups", "invalid hint_backups (-1; expected >= 0)")
    spec.hint_backups = 2
    fails("min_txn_duration", "invalid duration (-1s; expected duration >= 0s)")
    spec.min_txn_duration.seconds = 0
    fails("max_txn_duration", "invalid max_txn_duration (0s; expected > 0)")
    spec.max_txn_duration.nanos = 1
    fails("labels.labels[0].name", "not a valid token (bad label)")
    spec.labels.CopyFrom(LabelSet.of(L.INSTANCE, "a", L.INSTANCE, "b").to_proto())
    fails("labels.labels[1]", "expected single-value label has multiple values")
    spec.labels.CopyFrom(LabelSet.of("id", "").to_proto())
    fails("labels", 'labels cannot include label "id"')
    spec.labels.CopyFrom(LabelSet.of(L.INSTANCE, "an-instance", L.MANAGED_BY, "a-tool").to_proto())
    fails("sources[0].journal", "not a valid token (journal 2)")
    spec.sources[0].journal = "journal/2"
    fails("sources[1].min_offset", "invalid min_offset (-1; expected >= 0)")
    spec.sources[1].min_offset = 1024
    fails("sources[1].journal", "(index 1; journal/1 <= journal/2)")
    spec.sources[0].CopyFrom(cpb.ShardSpec.Source(journal="journal/1", min_offset=1024))
    spec.sources[1].CopyFrom(cpb.ShardSpec.Source(journal="journal/2"))
    vc.validate_shard_spec(spec)
    del spec.sources[:]  # As in Gazette, a shard may have no sources.
    vc.validate_shard_spec(spec)


def _shard_spec() -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id="shard-000",
        sources=[cpb.ShardSpec.Source(journal="a/journal")],
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints",
        max_txn_duration=_seconds(1),
    )


def test_shard_apply_request() -> None:
    hints = rpb.FSMHints(
        log="recovery/logs/shard-000",
        live_nodes=[
            rpb.FnodeSegments(
                fnode=1,
                segments=[rpb.Segment(author=1, first_seq_no=1, last_seq_no=2, last_offset=10)],
            )
        ],
    )
    req = cpb.ApplyRequest(
        changes=[
            cpb.ApplyRequest.Change(upsert=_shard_spec(), primary_hints=hints),
            cpb.ApplyRequest.Change(delete="other-shard", expect_mod_revision=3),
        ]
    )
    vc.validate_shard_apply_request(req)
    seg = req.changes[0].primary_hints.live_nodes[0].segments[0]
    for field, value, rule in [
        ("author", 0, "author is zero"),
        ("first_seq_no", 0, "first_seq_no <= 0"),
        ("first_offset", -1, "first_offset < 0"),
        ("last_seq_no", 0, "last_seq_no < first_seq_no"),
        ("last_offset", -1, "last_offset <= first_offset"),
        ("log", "recovery/logs/shard-000", "duplicates hints log"),
    ]:
        old = getattr(seg, field)
        setattr(seg, field, value)
        _refused(
            vc.validate_shard_apply_request,
            req,
            f"changes[0].primary_hints.live_nodes[0].segments[0].{field}",
            rule,
        )
        setattr(seg, field, old)
    req.changes[0].upsert.max_txn_duration.seconds = 0
    _refused(vc.validate_shard_apply_request, req, "changes[0].upsert.max_txn_duration", "> 0")
    req.changes[0].upsert.max_txn_duration.seconds = 1
    req.changes[1].primary_hints.CopyFrom(hints)
    _refused(vc.validate_shard_apply_request, req, "changes[1].primary_hints", "only with an upsert")
    req.changes[1].ClearField("primary_hints")
    req.changes[1].delete = "x"
    _refused(vc.validate_shard_apply_request, req, "changes[1].delete", "invalid length")
    req.changes[1].delete = "other-shard"
    req.changes[1].expect_mod_revision = 0
    _refused(vc.validate_shard_apply_request, req, "changes[1].expect_mod_revision", "> 0 or -1")


def test_stat_request_and_offsets() -> None:
    req = cpb.StatRequest(shard="shard-000", read_through={"a/journal": 10})
    vc.validate_stat_request(req)
    req.read_through["b/journal"] = -1
    _refused(vc.validate_stat_request, req, "read_through['b/journal']", "invalid offset (-1;")
    del req.read_through["b/journal"]
    req.read_through["/bad"] = 1
    _refused(vc.validate_stat_request, req, "read_through['/bad']", "cannot begin with '/'")


def test_label_selector_message() -> None:
    sel = pb.LabelSelector()
    sel.include.labels.add(name="inc", value="a/", prefix=True)
    v.validate_label_selector(sel)
    sel.exclude.labels.add(name="x", value="1")
    _refused(v.validate_label_selector, sel, "exclude.labels[0].name", "invalid length")


@pytest.mark.parametrize(
    ("seconds", "nanos", "lo", "hi", "rule"),
    [
        (1, 0, None, None, None),
        (-1, -5, None, None, None),
        (1, -1, None, None, "disagree"),
        (0, 1_000_000_000, None, None, "disagree"),
        (315_576_000_001, 0, None, None, "out of range"),
        (0, 5, 10, None, "invalid duration (5e-09s; expected duration >= 1e-08s)"),
        (2, 0, None, 1_000_000_000, "invalid duration (2s; expected duration <= 1s)"),
    ],
)
def test_durations(
    seconds: int, nanos: int, lo: int | None, hi: int | None, rule: str | None
) -> None:
    d = _seconds(seconds, nanos)
    if rule is None:
        assert v.validate_duration(d, "d", min_ns=lo, max_ns=hi) == seconds * 10**9 + nanos
        return
    with pytest.raises(ValidationError) as info:
        v.validate_duration(d, "d", min_ns=lo, max_ns=hi)
    assert info.value.field == "d" and rule in info.value.rule

"""Journal spec spaces: YAML hierarchies <-> flat JournalSpecs, with Gazette's semantics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.durations import HOUR, MINUTE, SECOND, ns_to_pb
from gazette.journalspace import (
    FlatEntry,
    Node,
    SpecSpaceError,
    _extract_tree,
    _shared_prefix,
    flatten,
    from_list_response,
    hoist,
    nest,
    parse_yaml,
    spec_from_dict,
    spec_to_dict,
    to_yaml,
    validate,
)
from gazette.protocol import protocol_pb2 as pb

O_RDONLY = pb.JournalSpec.O_RDONLY
O_WRONLY = pb.JournalSpec.O_WRONLY
O_RDWR = pb.JournalSpec.O_RDWR


def labels(*nv: str) -> pb.LabelSet:
    assert len(nv) % 2 == 0
    return pb.LabelSet(
        labels=[pb.Label(name=n, value=v) for n, v in zip(nv[::2], nv[1::2], strict=True)]
    )


def spec(name: str, **kw: object) -> pb.JournalSpec:
    return pb.JournalSpec(name=name, **kw)  # type: ignore[arg-type]


def names(entries: list[FlatEntry]) -> list[str]:
    return [e.spec.name for e in entries]


# --- The fixture of Gazette's own round-trip test: parsed, flattened, re-hoisted byte-exactly.

GO_FIXTURE = """\
name: foo/
replication: 3
labels:
- name: a-name
  value: a-val
fragment:
  length: 1234
  compression_codec: SNAPPY
  stores:
  - s3://a-bucket/
  - gcs://another-bucket/
  refresh_interval: 1m0s
  retention: 1h0m0s
  flush_interval: 2m0s
  path_postfix_template: foo={{ .Spool.Begin }}
flags: O_RDWR
max_append_rate: 11223344
children:
- delete: true
  name: foo/bar
- name: foo/baz/1
- name: foo/baz/2
  labels:
  - name: other-name
    value: ""
  revision: 1234
"""


def _fixture_fragment() -> pb.JournalSpec.Fragment:
    return pb.JournalSpec.Fragment(
        length=1234,
        compression_codec=pb.SNAPPY,
        stores=["s3://a-bucket/", "gcs://another-bucket/"],
        refresh_interval=ns_to_pb(MINUTE),
        retention=ns_to_pb(HOUR),
        flush_interval=ns_to_pb(2 * MINUTE),
        path_postfix_template="foo={{ .Spool.Begin }}",
    )


def test_go_fixture_flattens_and_hoists_back_byte_exactly() -> None:
    tree = parse_yaml(GO_FIXTURE)
    common = dict(
        replication=3, fragment=_fixture_fragment(), flags=O_RDWR, max_append_rate=11223344
    )
    assert flatten(tree) == [
        FlatEntry(spec("foo/bar", labels=labels("a-name", "a-val"), **common), delete=True),
        FlatEntry(spec("foo/baz/1", labels=labels("a-name", "a-val"), **common)),
        FlatEntry(
            spec("foo/baz/2", labels=labels("a-name", "a-val", "other-name", ""), **common),
            revision=1234,
        ),
    ]
    hoist(tree)
    assert to_yaml(tree) == GO_FIXTURE


def test_nest_regroups_the_fixture_by_path_components() -> None:
    entries = flatten(parse_yaml(GO_FIXTURE))
    root = nest(entries)
    assert [c.name for c in root.children] == ["foo/bar", "foo/baz/"]
    assert [c.name for c in root.children[1].children] == ["foo/baz/1", "foo/baz/2"]
    assert flatten(root) == entries
    assert flatten(parse_yaml(to_yaml(root))) == entries


# --- The tutorial's YAML.

TUTORIAL_JOURNAL = """\
name: example/journal
replication: 1
labels:
- name: app.gazette.dev/message-type
  value: TestMessage
- name: app.gazette.dev/region
  value: local
- name: app.gazette.dev/tag
  value: demo
- name: content-type
  value: application/x-ndjson
fragment:
  length: 131072
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1m0s
  retention: 1h0m0s
  flush_interval: 1m0s
revision: 3
"""


def test_tutorial_single_journal_round_trips_as_gazctl_prints_it() -> None:
    tree = parse_yaml(TUTORIAL_JOURNAL)
    assert not tree.is_dir and tree.revision == 3
    [entry] = flatten(tree)
    assert entry.revision == 3 and not entry.delete
    s = entry.spec
    assert s.name == "example/journal" and s.replication == 1
    assert [(label.name, label.value) for label in s.labels.labels][-1] == (
        "content-type",
        "application/x-ndjson",
    )
    assert s.fragment.length == 131072 and s.fragment.compression_codec == pb.SNAPPY
    assert list(s.fragment.stores) == ["file:///"]
    assert s.fragment.retention.seconds == 3600 and s.fragment.flush_interval.seconds == 60
    # gazctl journals list -o yaml of this one journal prints exactly the tutorial's text.
    assert (
        to_yaml(
            from_list_response(
                pb.ListResponse(journals=[pb.ListResponse.Journal(spec=s, mod_revision=3)])
            )
        )
        == TUTORIAL_JOURNAL
    )


TUTORIAL_FOOBAR = """\
name: foobar/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
- name: my-label
fragment:
  length: 4096
  compression_codec: GZIP
  stores:
  - file:///
  refresh_interval: 1m0s
  flush_interval: 1m0s
children:
  - name: foobar/part-000
  - name: foobar/part-001
  - name: foobar/part-002
"""


def test_tutorial_foobar_hierarchy_flattens_with_inherited_fields() -> None:
    entries = flatten(parse_yaml(TUTORIAL_FOOBAR))
    assert names(entries) == ["foobar/part-000", "foobar/part-001", "foobar/part-002"]
    want_fragment = pb.JournalSpec.Fragment(
        length=4096,
        compression_codec=pb.GZIP,
        stores=["file:///"],
        refresh_interval=ns_to_pb(MINUTE),
        flush_interval=ns_to_pb(MINUTE),
    )
    for e in entries:
        assert e.revision == 0 and not e.delete
        assert e.spec == spec(
            e.spec.name,
            replication=1,
            labels=labels("content-type", "application/x-ndjson", "my-label", ""),
            fragment=want_fragment,
        )
        assert not e.spec.fragment.HasField("retention")  # Unset stays unset.
    # Listing them back hoists everything shared into the directory.
    again = nest(entries)
    assert again.name == "foobar/" and again.spec.replication == 1
    assert all(c.spec == spec(c.name) for c in again.children)
    assert flatten(parse_yaml(to_yaml(again))) == entries


def test_commented_hierarchy_with_nested_directories() -> None:
    text = """\
# Our journals.
name: examples/
replication: 3
labels:
  - name: example-journals     # Label without a value.
fragment:
  length: 268435456
  retention: 720h0m0s
  path_postfix_template: date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}
children:
  - name: examples/rides/
    labels:
      - name:  content-type
        value: text/csv
    fragment:
      refresh_interval:  5s
    children:
      - name: examples/rides/part-000
      - name: examples/rides/part-001
        replication: 1
        labels:
          - {name: content-type, value: application/x-ndjson}
  - name: examples/sums
"""
    by_name = {e.spec.name: e.spec for e in flatten(parse_yaml(text))}
    assert sorted(by_name) == [
        "examples/rides/part-000",
        "examples/rides/part-001",
        "examples/sums",
    ]
    p0, p1, sums = (by_name[n] for n in sorted(by_name))
    assert p0.replication == 3 and p1.replication == 1 and sums.replication == 3
    # Labels stay sorted by name; a child's values for a name replace its parent's.
    assert [(x.name, x.value) for x in p0.labels.labels] == [
        ("content-type", "text/csv"),
        ("example-journals", ""),
    ]
    assert [(x.name, x.value) for x in p1.labels.labels] == [
        ("content-type", "application/x-ndjson"),
        ("example-journals", ""),
    ]
    assert [(x.name, x.value) for x in sums.labels.labels] == [("example-journals", "")]
    assert p0.fragment.refresh_interval.seconds == 5 and not sums.fragment.HasField(
        "refresh_interval"
    )
    assert p0.fragment.retention.seconds == 720 * 3600 == sums.fragment.retention.seconds
    assert sums.fragment.path_postfix_template.endswith('"2006-01-02" }}')


# --- Gazette's push-down, extraction, hoisting and prefix cases.


@pytest.mark.parametrize("root", ["", "shared-root/"])
def test_push_down_inherits_and_overrides(root: str) -> None:
    r = root
    tree = Node(
        spec(r, replication=1),
        children=[
            Node(
                spec(r + "aaa/", flags=O_RDWR),
                children=[Node(spec(r + "aaa/111", flags=O_RDONLY)), Node(spec(r + "aaa/222"))],
            ),
            Node(
                spec(r + "bbb/"),
                children=[
                    Node(
                        spec(r + "bbb/333/", replication=2),
                        children=[
                            Node(
                                spec(r + "bbb/333/a/"),
                                delete=True,
                                children=[
                                    Node(spec(r + "bbb/333/a/x")),
                                    Node(spec(r + "bbb/333/a/y"), delete=False),
                                ],
                            ),
                            Node(spec(r + "bbb/333/z")),
                        ],
                    ),
                    Node(spec(r + "bbb/444", replication=3, flags=O_WRONLY)),
                ],
            ),
        ],
    )
    assert flatten(tree) == [
        FlatEntry(spec(r + "aaa/111", replication=1, flags=O_RDONLY)),
        FlatEntry(spec(r + "aaa/222", replication=1, flags=O_RDWR)),
        FlatEntry(spec(r + "bbb/333/a/x", replication=2), delete=True),
        FlatEntry(spec(r + "bbb/333/a/y", replication=2), delete=False),
        FlatEntry(spec(r + "bbb/333/z", replication=2)),
        FlatEntry(spec(r + "bbb/444", replication=3, flags=O_WRONLY)),
    ]


def _shape(node: Node) -> object:
    return node.name if not node.children else (node.name, [_shape(c) for c in node.children])


def test_tree_extraction_groups_only_where_two_or_more_share_a_prefix() -> None:
    ns = [
        "root/aaa/000",
        "root/aaa/111/foo/i",
        "root/aaa/111/foo/j",
        "root/aaa/222",
        "root/bbb/333/a/x",
        "root/bbb/333/a/y",
        "root/bbb/333/z",
        "root/bbb/444",
    ]
    root = nest(FlatEntry(spec(n)) for n in reversed(ns))  # Input order does not matter.
    assert _shape(root) == (
        "root/",
        [
            (
                "root/aaa/",
                [
                    "root/aaa/000",
                    ("root/aaa/111/foo/", ["root/aaa/111/foo/i", "root/aaa/111/foo/j"]),
                    "root/aaa/222",
                ],
            ),
            (
                "root/bbb/",
                [
                    (
                        "root/bbb/333/",
                        [
                            ("root/bbb/333/a/", ["root/bbb/333/a/x", "root/bbb/333/a/y"]),
                            "root/bbb/333/z",
                        ],
                    ),
                    "root/bbb/444",
                ],
            ),
        ],
    )


def _greedy_extract(names: list[str]) -> object:
    """Gazette's quadratic construction: wrap the longest run sharing the longest prefix."""
    nodes: list[object] = list(names)

    def name_of(n: object) -> str:
        return n if isinstance(n, str) else n[0]  # type: ignore[index]

    while len(nodes) > 1:
        beg, end, best = 0, 0, -1
        for i in range(1, len(nodes)):
            n = _shared_prefix(name_of(nodes[i]), name_of(nodes[i - 1]))
            if n > best:
                beg, end, best = i - 1, i + 1, n
            elif n == best and i == end:
                end = i + 1
        nodes[beg:end] = [(name_of(nodes[beg])[:best], nodes[beg:end])]
    return nodes[0]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "a-", "b.c"]), min_size=1, max_size=5).map("/".join),
        min_size=1,
        max_size=16,
        unique=True,
    )
)
def test_tree_extraction_matches_gazettes_greedy_construction(ns: list[str]) -> None:
    ns.sort()
    assert _shape(_extract_tree([Node(spec(n)) for n in ns])) == _greedy_extract(ns)


def test_journals_without_a_common_prefix_hang_from_an_unnamed_root() -> None:
    root = nest([FlatEntry(spec("bbb/one")), FlatEntry(spec("aaa/two"))])
    assert root.name == "" and [c.name for c in root.children] == ["aaa/two", "bbb/one"]
    assert to_yaml(root) == "children:\n- name: aaa/two\n- name: bbb/one\n"


def test_hoisting_moves_shared_values_up_and_clears_them_below() -> None:
    tree = Node(
        spec("node/"),
        children=[
            Node(
                spec("node/aaa", replication=2, flags=O_RDONLY, labels=labels("name-1", "val-1")),
                delete=True,
            ),
            Node(
                spec(
                    "node/bbb",
                    replication=2,
                    flags=O_RDONLY,
                    labels=labels("name-1", "val-1", "name-2", "val-2"),
                ),
                delete=True,
            ),
        ],
    )
    hoist(tree)
    assert tree == Node(
        spec("node/", replication=2, flags=O_RDONLY, labels=labels("name-1", "val-1")),
        delete=True,
        children=[Node(spec("node/aaa")), Node(spec("node/bbb", labels=labels("name-2", "val-2")))],
    )


def test_suspend_is_never_hoisted() -> None:
    suspended = pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.FULL, offset=10)
    entries = [
        FlatEntry(spec("a/one", replication=1, suspend=suspended)),
        FlatEntry(spec("a/two", replication=1, suspend=suspended)),
    ]
    root = nest(entries)
    assert not root.spec.HasField("suspend")
    assert all(c.spec.HasField("suspend") for c in root.children)
    assert "suspend:\n    level: FULL\n    offset: 10\n" in to_yaml(root)
    assert flatten(parse_yaml(to_yaml(root))) == entries


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ("foo/bar", "foo/baz", 4),
        ("foo/bar/baz", "foo/bar/bing", 8),
        ("foo/bar/baz/1", "foo/bar/baz/2", 12),
        ("foo/bar/baz/match", "foo/bar/baz/match", 12),  # Whole components only.
        ("foo/bar/", "foo/baz/", 4),
        ("foo/bar/", "foo/bar/", 8),
        ("miss/", "match/", 0),
    ],
)
def test_shared_prefix_is_measured_in_whole_components(a: str, b: str, n: int) -> None:
    assert _shared_prefix(a, b) == n == _shared_prefix(b, a)


def test_delete_is_tri_state_and_inherited() -> None:
    text = """\
name: a/
delete: true
children:
- name: a/one
- name: a/two
  delete: false
"""
    assert [(e.spec.name, e.delete) for e in flatten(parse_yaml(text))] == [
        ("a/one", True),
        ("a/two", False),
    ]


# --- Validation (Gazette's rules) and malformed input.


def test_validation_cases_in_gazettes_order() -> None:
    node = Node(spec("dir/"), revision=1)
    with pytest.raises(SpecSpaceError, match=r"node 'dir/': revision: unexpected revision \(1\)"):
        validate(node)
    node.revision = 0
    with pytest.raises(SpecSpaceError, match="node 'dir/': children: a directory expects one"):
        validate(node)
    node.children = [Node(spec("foo")), Node(spec("bar"))]
    with pytest.raises(SpecSpaceError) as info:
        validate(node)
    assert info.value.field == "children[0].name"
    assert "expected parent name to prefix child (dir/ vs foo)" in str(info.value)
    node.children = [Node(spec("dir/foo")), Node(spec("dir/bar"))]
    with pytest.raises(SpecSpaceError, match=r"ordered by name \(dir/foo vs dir/bar\)"):
        validate(node)
    node.children.reverse()
    validate(node)

    node.spec.name = "invalid name"
    node.revision = 123
    with pytest.raises(SpecSpaceError, match=r"node 'invalid name': name: not a valid token"):
        validate(node)
    node.spec.name = "item"
    with pytest.raises(SpecSpaceError, match=r"node 'item': children: only directories"):
        validate(node)
    node.children = []
    validate(node)


BAD_INPUTS = [
    # (yaml, where, field, fragment of the detail)
    ("name: a/b\nreplicaton: 3\n", "node 'a/b'", "replicaton", "unknown field"),
    (
        "name: a/\nchildren:\n- name: a/b\n  fragment:\n    lenght: 1\n",
        "node 'a/b'",
        "fragment.lenght",
        "unknown field",
    ),
    (
        "name: a/\nchildren:\n- name: b/c\n",
        "node 'a/'",
        "children[0].name",
        "expected parent name to prefix child (a/ vs b/c)",
    ),
    (
        "name: aa/b\nchildren:\n- name: aa/b/c\n",
        "node 'aa/b'",
        "children",
        "name ends in '/'",
    ),
    (
        "name: a/\nchildren:\n- name: a/b/\n",
        "node 'a/b/'",
        "children",
        "one or more children",
    ),
    (
        "name: aaa/b\nrevision: 3\nchildren: []\nfragment: {retention: 5x}\n",
        "node 'aaa/b'",
        "fragment.retention",
        "unknown unit 'x'",
    ),
    (
        "name: aaa/b\nfragment: {retention: 3600}\n",
        "node 'aaa/b'",
        "fragment.retention",
        "expected a duration such as '1m0s'",
    ),
    (
        "name: aaa/b\nfragment: {compression_codec: LZ4}\n",
        "node 'aaa/b'",
        "fragment.compression_codec",
        "'LZ4' is not a valid CompressionCodec",
    ),
    (
        "name: aaa/b\nflags: O_APPEND\n",
        "node 'aaa/b'",
        "flags",
        "'O_APPEND' is not a valid JournalSpec.Flag",
    ),
    ("name: aaa/b\nreplication: three\n", "node 'aaa/b'", "replication", "expected an integer"),
    ("name: aaa/b\nreplication: 3000000000\n", "node 'aaa/b'", "replication", "out of range"),
    ("name: aaa/b\ndelete: maybe\n", "node 'aaa/b'", "delete", "expected true or false"),
    (
        "name: a/\nrevision: 7\nchildren:\n- name: a/bc\n",
        "node 'a/'",
        "revision",
        "unexpected revision (7)",
    ),
    (
        "name: a/\nsuspend: {level: FULL}\nchildren:\n- name: a/bc\n",
        "node 'a/'",
        "suspend",
        "only on journals",
    ),
    (
        "name: aaa/b\nsuspend: {level: ASLEEP}\n",
        "node 'aaa/b'",
        "suspend.level",
        "not a valid Suspend.Level",
    ),
    (
        "name: aaa/b\nlabels:\n- name: x\n  value: 1\n- name: x\n  value: '1'\n",
        "node 'aaa/b'",
        "labels",
        "duplicate label x='1'",
    ),
    ("name: aaa/b\nlabels:\n- value: v\n", "node 'aaa/b'", "labels[0].name", "missing label name"),
    (
        "name: aaa/b\nlabels:\n- name: x\n  prefix: true\n",
        "node 'aaa/b'",
        "labels[0].prefix",
        "unknown field",
    ),
    ("name: aaa/b\nlabels: {x: y}\n", "node 'aaa/b'", "labels", "expected a list"),
    (
        "name: a/\nchildren:\n- name: a/cc\n- name: a/bb\n",
        "node 'a/'",
        "children[1].name",
        "ordered by name (a/cc vs a/bb)",
    ),
    ("name: a//b\n", "node 'a//b'", "name", "must be a clean path"),
    ("name: /abc\n", "node '/abc'", "name", "cannot begin with '/'"),
    ("name: ab\n", "node 'ab'", "name", "invalid length (2; expected 4 <= length <= 512)"),
    (
        "name: a/\nchildren:\n- replication: 3\n",
        "node 'a/'",
        "children[0].name",
        "expected parent name to prefix child (a/ vs )",
    ),
    ("name: a/\nchildren:\n- [1]\n", "node 'a/': children[0]", "node", "expected a mapping"),
    ("name: aaa/b\nname: aaa/c\n", "document", None, "duplicate key 'name'"),
    ("name: aaa/b\n---\nname: aaa/c\n", "document", None, "single document"),
    ("", "document", None, "empty document"),
    ("- name: aaa/b\n", "root node", "node", "expected a mapping"),
]


@pytest.mark.parametrize(("text", "where", "fld", "detail"), BAD_INPUTS)
def test_bad_inputs_name_the_node_and_field(
    text: str, where: str, fld: str | None, detail: str
) -> None:
    with pytest.raises(SpecSpaceError) as info:
        flatten(parse_yaml(text))
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.where, err.field) == (where, fld), str(err)
    assert detail in err.detail
    assert str(err).startswith(where)


def test_duplicate_journals_are_rejected() -> None:
    tree = Node(
        spec(""),
        children=[
            Node(spec("a/"), children=[Node(spec("a/b/c"))]),
            Node(spec("a/b/"), children=[Node(spec("a/b/c"))]),
        ],
    )
    with pytest.raises(SpecSpaceError, match="node 'a/b/c': journal appears more than once"):
        flatten(tree)
    with pytest.raises(SpecSpaceError, match="more than once"):
        nest([FlatEntry(spec("a/b/c")), FlatEntry(spec("a/b/c"))])
    with pytest.raises(SpecSpaceError, match="name: not a valid token"):
        nest([FlatEntry(spec("a b/c"))])


# --- Scalars are read as Go's yaml.v2 reads them into typed fields.


def test_string_fields_keep_their_source_text() -> None:
    text = """\
name: aaa/b
labels:
- name: flag
  value: yes
- name: num
  value: 1.50
- name: day
  value: 2024-01-02
- name: nothing
  value: ~
flags: 4
suspend: {level: 2, offset: 0x10}
"""
    [e] = flatten(parse_yaml(text))
    assert [(x.name, x.value) for x in e.spec.labels.labels] == [
        ("day", "2024-01-02"),
        ("flag", "yes"),
        ("nothing", ""),
        ("num", "1.50"),
    ]
    assert e.spec.flags == O_RDWR
    assert e.spec.suspend.level == pb.JournalSpec.Suspend.FULL and e.spec.suspend.offset == 16
    out = to_yaml(nest([e]))
    assert 'value: "yes"' in out and 'value: "1.50"' in out and "flags: O_RDWR" in out
    assert flatten(parse_yaml(out)) == [e]


def test_unnamed_flags_print_as_integers() -> None:
    e = FlatEntry(spec("aaa/b", flags=O_RDONLY | O_WRONLY))
    assert to_yaml(nest([e])) == "name: aaa/b\nflags: 3\n"
    assert flatten(parse_yaml(to_yaml(nest([e])))) == [e]


def test_spec_dict_has_gazettes_field_order() -> None:
    s = spec(
        "aaa/b",
        replication=2,
        labels=labels("k", "v"),
        fragment=pb.JournalSpec.Fragment(length=1, retention=ns_to_pb(90 * SECOND)),
        flags=O_RDWR,
        max_append_rate=5,
        suspend=pb.JournalSpec.Suspend(),
    )
    d = spec_to_dict(s)
    assert list(d) == [
        "name",
        "replication",
        "labels",
        "fragment",
        "flags",
        "max_append_rate",
        "suspend",
    ]
    assert d["fragment"] == {"length": 1, "retention": "1m30s"}
    assert d["suspend"] == {}  # Present but empty, as Go prints a non-nil pointer.
    assert spec_from_dict(d) == s
    with pytest.raises(SpecSpaceError, match="spec: children: unknown field"):
        spec_from_dict({"name": "aaa/b", "children": []})


# --- Properties: nesting and YAML are lossless.

_PARTS = st.sampled_from(["aa", "bb", "cc", "x=1", "y%2", "päth", "p-0", "p.1"])
_NAMES = st.lists(_PARTS, min_size=1, max_size=4).map("/".join).filter(lambda n: len(n) >= 4)
_LABELS = st.lists(
    st.tuples(st.sampled_from(["app", "env", "tier"]), st.sampled_from(["", "a", "yes", "1.50"])),
    unique=True,
    max_size=3,
).map(sorted)
_DURATIONS = st.sampled_from([0, 1, MINUTE, HOUR, 90 * SECOND])


@st.composite
def _specs(draw: st.DrawFn, name: str) -> pb.JournalSpec:
    s = pb.JournalSpec(name=name)
    s.replication = draw(st.sampled_from([0, 1, 3]))
    if ls := draw(_LABELS):
        s.labels.labels.extend(pb.Label(name=n, value=v) for n, v in ls)
    if length := draw(st.sampled_from([0, 1024, 4096])):
        s.fragment.length = length
    if codec := draw(st.sampled_from([pb.INVALID, pb.NONE, pb.GZIP, pb.SNAPPY])):
        s.fragment.compression_codec = codec
    if stores := draw(st.sampled_from([[], ["file:///"], ["s3://b/?p=1&q=2", "gs://c/"]])):
        s.fragment.stores.extend(stores)
    for key in ("refresh_interval", "retention", "flush_interval"):
        if ns := draw(_DURATIONS):
            getattr(s.fragment, key).CopyFrom(ns_to_pb(ns))
    if tpl := draw(st.sampled_from(["", 'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'])):
        s.fragment.path_postfix_template = tpl
    s.flags = draw(st.sampled_from([0, O_RDONLY, O_RDWR, 6]))
    s.max_append_rate = draw(st.sampled_from([0, 1 << 20]))
    if draw(st.booleans()):
        s.suspend.SetInParent()
        s.suspend.level = draw(st.sampled_from([0, 1, 2]))  # type: ignore[assignment]
        s.suspend.offset = draw(st.sampled_from([0, 1234]))
    return s


@st.composite
def _entries(draw: st.DrawFn) -> list[FlatEntry]:
    ns = draw(st.lists(_NAMES, min_size=1, max_size=12, unique=True))
    return [
        FlatEntry(
            draw(_specs(n)),
            revision=draw(st.sampled_from([0, 1, 77, -1])),
            delete=draw(st.booleans()),
            comment=draw(st.sampled_from(["", "a note: with colon"])),
        )
        for n in ns
    ]


@settings(max_examples=150, deadline=None)
@given(_entries())
def test_nest_then_flatten_is_lossless(entries: list[FlatEntry]) -> None:
    want = sorted(entries, key=lambda e: e.spec.name)
    root = nest(entries)
    assert flatten(root) == want
    text = to_yaml(root)
    reparsed = parse_yaml(text)
    assert reparsed == root
    assert flatten(reparsed) == want
    hoist(reparsed)  # Idempotent on an already-hoisted tree.
    assert reparsed == root


@settings(max_examples=100, deadline=None)
@given(_entries())
def test_spec_dicts_round_trip(entries: list[FlatEntry]) -> None:
    for e in entries:
        assert spec_from_dict(spec_to_dict(e.spec)) == e.spec

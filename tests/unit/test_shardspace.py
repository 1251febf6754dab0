"""Shard spec spaces: ``common`` + ``shards`` YAML <-> flat ShardSpecs, as gazctl uses them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.consumer.shardspace import (
    FlatShard,
    ShardEntry,
    ShardSet,
    SpecSpaceError,
    flatten,
    from_list_response,
    nest,
    parse_yaml,
    shard_spec_from_dict,
    shard_spec_to_dict,
    to_yaml,
)
from gazette.durations import MILLISECOND, MINUTE, SECOND, ns_to_pb
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb


def labels(*nv: str) -> pb.LabelSet:
    return pb.LabelSet(
        labels=[pb.Label(name=n, value=v) for n, v in zip(nv[::2], nv[1::2], strict=True)]
    )


def source(journal: str, min_offset: int = 0) -> pc.ShardSpec.Source:
    return pc.ShardSpec.Source(journal=journal, min_offset=min_offset)


# The fixture of Gazette's own round-trip test.
GO_FIXTURE = """\
common:
  recovery_log_prefix: recovery/logs
  hint_prefix: /hints
  hint_backups: 2
  max_txn_duration: 1s
  min_txn_duration: 1ms
  hot_standbys: 1
  labels:
  - name: name-1
    value: val-1
  disable_wait_for_ack: true
shards:
- comment: This is a comment
  delete: true
  id: shard-A
  sources:
  - journal: journal/A
  labels:
  - name: name-2
    value: val-2
  revision: 123
- id: shard-B
  sources:
  - journal: journal/B
  disable: true
  labels:
  - name: name-3
    value: val-3
  revision: 456
"""


def flat_fixture() -> list[FlatShard]:
    shared = dict(
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints",
        hint_backups=2,
        max_txn_duration=ns_to_pb(SECOND),
        min_txn_duration=ns_to_pb(MILLISECOND),
        hot_standbys=1,
        disable_wait_for_ack=True,
    )
    return [
        FlatShard(
            pc.ShardSpec(
                id="shard-A",
                sources=[source("journal/A")],
                labels=labels("name-1", "val-1", "name-2", "val-2"),
                **shared,  # type: ignore[arg-type]
            ),
            revision=123,
            delete=True,
            comment="This is a comment",
        ),
        FlatShard(
            pc.ShardSpec(
                id="shard-B",
                sources=[source("journal/B")],
                disable=True,
                labels=labels("name-1", "val-1", "name-3", "val-3"),
                **shared,  # type: ignore[arg-type]
            ),
            revision=456,
        ),
    ]


def test_go_fixture_flattens_and_hoists_back_byte_exactly() -> None:
    assert flatten(parse_yaml(GO_FIXTURE)) == flat_fixture()
    assert to_yaml(nest(flat_fixture())) == GO_FIXTURE


def test_hoisting_keeps_differences_on_the_shards() -> None:
    s = nest(flat_fixture())
    assert s.common == pc.ShardSpec(
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints",
        hint_backups=2,
        max_txn_duration=ns_to_pb(SECOND),
        min_txn_duration=ns_to_pb(MILLISECOND),
        hot_standbys=1,
        labels=labels("name-1", "val-1"),
        disable_wait_for_ack=True,
    )
    assert s.shards == [
        ShardEntry(
            pc.ShardSpec(
                id="shard-A", sources=[source("journal/A")], labels=labels("name-2", "val-2")
            ),
            delete=True,
            revision=123,
            comment="This is a comment",
        ),
        ShardEntry(
            pc.ShardSpec(
                id="shard-B",
                sources=[source("journal/B")],
                disable=True,
                labels=labels("name-3", "val-3"),
            ),
            revision=456,
        ),
    ]


TUTORIAL = """\
common:
  max_txn_duration: 1s
  labels:
  - name: store
    value: postgres
shards:
- id: cycles-part-000
  sources:
  - journal: examples/bike-share/rides/part-000
  revision: 77
- id: cycles-part-001
  sources:
  - journal: examples/bike-share/rides/part-001
  revision: 77
"""


def test_tutorial_listing_round_trips() -> None:
    flat = flatten(parse_yaml(TUTORIAL))
    assert [(f.spec.id, f.revision, f.delete) for f in flat] == [
        ("cycles-part-000", 77, False),
        ("cycles-part-001", 77, False),
    ]
    for f in flat:
        assert f.spec.max_txn_duration.seconds == 1
        assert [(x.name, x.value) for x in f.spec.labels.labels] == [("store", "postgres")]
    resp = pc.ListResponse(
        shards=[pc.ListResponse.Shard(spec=f.spec, mod_revision=f.revision) for f in flat]
    )
    assert to_yaml(from_list_response(resp)) == TUTORIAL


def test_shard_values_override_common_and_labels_merge_per_name() -> None:
    text = """\
common:
  max_txn_duration: 1m
  hot_standbys: 1
  labels:
  - {name: store, value: sqlite}
  - {name: tier, value: gold}
shards:
- id: shard-b
  hot_standbys: 2
  labels:
  - {name: store, value: postgres}
  - {name: store, value: rocks}
- id: shard-a
  delete: false
  sources:
  - {journal: a/b/c, min_offset: 1024}
"""
    b, a = flatten(parse_yaml(text))  # Document order is kept.
    assert (b.spec.id, b.spec.hot_standbys, a.spec.hot_standbys) == ("shard-b", 2, 1)
    assert [(x.name, x.value) for x in b.spec.labels.labels] == [
        ("store", "postgres"),
        ("store", "rocks"),
        ("tier", "gold"),
    ]
    assert [(x.name, x.value) for x in a.spec.labels.labels] == [
        ("store", "sqlite"),
        ("tier", "gold"),
    ]
    assert a.spec.sources == [source("a/b/c", 1024)] and not b.spec.sources
    assert a.spec.max_txn_duration.seconds == 60 == b.spec.max_txn_duration.seconds
    assert not a.delete
    # Nesting sorts by id.
    assert [s.spec.id for s in nest([b, a]).shards] == ["shard-a", "shard-b"]


def test_single_shard_hoists_everything_but_its_id() -> None:
    one = FlatShard(pc.ShardSpec(id="only-one", hint_backups=3, disable=True), revision=5)
    s = nest([one])
    assert s.shards == [ShardEntry(pc.ShardSpec(id="only-one"), revision=5)]
    assert to_yaml(s) == (
        "common:\n  hint_backups: 3\n  disable: true\nshards:\n- id: only-one\n  revision: 5\n"
    )
    assert flatten(parse_yaml(to_yaml(s))) == [one]


def test_empty_set() -> None:
    assert to_yaml(nest([])) == "{}\n"
    assert flatten(parse_yaml("{}\n")) == []
    assert flatten(ShardSet()) == []


BAD_INPUTS = [
    # (yaml, where, field, fragment of the detail)
    (
        "shards:\n- id: shard-a\n  hot_standby: 1\n",
        "shard 'shard-a'",
        "hot_standby",
        "unknown field",
    ),
    ("common:\n  id: x\n", "common", "id", "cannot name a shard"),
    ("common:\n  recovery_log: x\n", "common", "recovery_log", "unknown field"),
    ("common:\n  max_txn_duration: 1 minute\n", "common", "max_txn_duration", "unknown unit"),
    ("shard: []\n", "document", "shard", "unknown field"),
    ("shards:\n- hint_backups: 2\n", "shards[0]", "id", "missing shard id"),
    ("shards:\n- id: aaaa\n- id: aaaa\n", "shard 'aaaa'", "id", "more than once"),
    (
        "shards:\n- id: aaaa\n  sources:\n  - journal: j/k\n    offset: 5\n",
        "shard 'aaaa'",
        "sources[0].offset",
        "unknown field",
    ),
    (
        "shards:\n- id: aaaa\n  min_txn_duration: 5\n",
        "shard 'aaaa'",
        "min_txn_duration",
        "expected a duration",
    ),
    ("shards:\n- id: aaaa\n  hot_standbys: -1\n", "shard 'aaaa'", "hot_standbys", "out of range"),
    ("shards:\n- id: aaaa\n  disable: 1\n", "shard 'aaaa'", "disable", "expected true or false"),
    (
        "shards:\n- id: aaaa\n  labels:\n  - name: ''\n",
        "shard 'aaaa'",
        "labels[0].name",
        "missing label name",
    ),
    ("shards: {id: aaaa}\n", "document", "shards", "expected a list"),
    ("common: {}\ncommon: {}\n", "document", None, "duplicate key 'common'"),
    ("", "document", None, "empty document"),
]


@pytest.mark.parametrize(("text", "where", "fld", "detail"), BAD_INPUTS)
def test_bad_inputs_name_the_shard_and_field(
    text: str, where: str, fld: str | None, detail: str
) -> None:
    with pytest.raises(SpecSpaceError) as info:
        flatten(parse_yaml(text))
    err = info.value
    assert (err.where, err.field) == (where, fld), str(err)
    assert detail in err.detail


def test_flatten_and_nest_reject_missing_and_duplicate_ids() -> None:
    with pytest.raises(SpecSpaceError, match="missing shard id"):
        flatten(ShardSet(shards=[ShardEntry(pc.ShardSpec(hint_backups=1))]))
    with pytest.raises(SpecSpaceError, match="more than once"):
        flatten(ShardSet(shards=[ShardEntry(pc.ShardSpec(id="aaaa"))] * 2))
    with pytest.raises(SpecSpaceError, match="more than once"):
        nest([FlatShard(pc.ShardSpec(id="aaaa"))] * 2)


def test_spec_dict_field_order() -> None:
    spec = pc.ShardSpec(
        id="aaaa",
        sources=[source("j/one", 7)],
        recovery_log_prefix="r",
        hint_prefix="/h",
        hint_backups=1,
        max_txn_duration=ns_to_pb(MINUTE),
        min_txn_duration=ns_to_pb(1),
        disable=True,
        hot_standbys=1,
        labels=labels("k", "v"),
        disable_wait_for_ack=True,
        ring_buffer_size=8,
        read_channel_size=9,
    )
    d = shard_spec_to_dict(spec)
    assert list(d) == [
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
    ]
    assert d["min_txn_duration"] == "1ns" and d["sources"] == [
        {"journal": "j/one", "min_offset": 7}
    ]
    assert shard_spec_from_dict(d) == spec


# --- Properties.

_LABELS = st.lists(
    st.tuples(st.sampled_from(["app", "store"]), st.sampled_from(["", "x", "yes", "2.0"])),
    unique=True,
    max_size=3,
).map(sorted)


@st.composite
def _spec(draw: st.DrawFn, shard_id: str) -> pc.ShardSpec:
    s = pc.ShardSpec(id=shard_id)
    for journal in draw(st.sampled_from([[], ["a/j"], ["a/j", "b/k"]])):
        s.sources.add(journal=journal, min_offset=draw(st.sampled_from([0, 99])))
    s.recovery_log_prefix = draw(st.sampled_from(["", "recovery/logs"]))
    s.hint_prefix = draw(st.sampled_from(["", "/hints"]))
    s.hint_backups = draw(st.sampled_from([0, 2]))
    for key in ("max_txn_duration", "min_txn_duration"):
        if ns := draw(st.sampled_from([0, 1, MILLISECOND, SECOND, MINUTE])):
            getattr(s, key).CopyFrom(ns_to_pb(ns))
    s.disable = draw(st.booleans())
    s.hot_standbys = draw(st.sampled_from([0, 1]))
    if ls := draw(_LABELS):
        s.labels.labels.extend(pb.Label(name=n, value=v) for n, v in ls)
    s.disable_wait_for_ack = draw(st.booleans())
    s.ring_buffer_size = draw(st.sampled_from([0, 256]))
    s.read_channel_size = draw(st.sampled_from([0, 4096]))
    return s


@st.composite
def _flat(draw: st.DrawFn) -> list[FlatShard]:
    ids = draw(
        st.lists(st.from_regex(r"[a-z][a-z0-9-]{3,8}", fullmatch=True), unique=True, max_size=8)
    )
    return [
        FlatShard(
            draw(_spec(i)),
            revision=draw(st.sampled_from([0, 5, -1])),
            delete=draw(st.booleans()),
            comment=draw(st.sampled_from(["", "note"])),
        )
        for i in ids
    ]


@settings(max_examples=150, deadline=None)
@given(_flat())
def test_nest_then_flatten_is_lossless(entries: list[FlatShard]) -> None:
    want = sorted(entries, key=lambda e: e.spec.id)
    s = nest(entries)
    assert flatten(s) == want
    again = parse_yaml(to_yaml(s))
    assert again == s
    assert flatten(again) == want

"""Label sets, selectors and their parser.

Tables marked "Gazette" restate the cases of Gazette's
broker/protocol/label_extensions_test.go (same inputs, same outcomes), with
field paths in this project's snake_case form.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.protocol import labels as L
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.errors import ValidationError
from gazette.protocol.labels import (
    Label,
    LabelSelector,
    LabelSet,
    SelectorError,
    validate_label,
    validate_label_set,
    validate_single_value_labels,
    with_meta_labels,
    with_shard_meta_labels,
)


def test_well_known_label_constants() -> None:
    assert L.CONTENT_TYPE == "content-type"
    assert L.CONTENT_TYPE_JSON_LINES == "application/x-ndjson"
    assert L.CONTENT_TYPE_PROTO_FIXED == "application/x-protobuf-fixed"
    assert L.CONTENT_TYPE_CSV == "text/csv"
    assert L.CONTENT_TYPE_RECOVERY_LOG == "application/x-gazette-recoverylog"
    assert L.MESSAGE_TYPE == "app.gazette.dev/message-type"
    assert L.MESSAGE_SUB_TYPE == "app.gazette.dev/message-subtype"
    assert L.REGION == "app.gazette.dev/region"
    assert L.TAG == "app.gazette.dev/tag"
    assert L.MANAGED_BY == "app.gazette.dev/managed-by"
    assert L.INSTANCE == "app.gazette.dev/instance"
    assert L.TAG not in L.SINGLE_VALUE_LABELS
    assert L.SINGLE_VALUE_LABELS == {
        L.CONTENT_TYPE,
        L.INSTANCE,
        L.MANAGED_BY,
        L.MESSAGE_SUB_TYPE,
        L.MESSAGE_TYPE,
        L.REGION,
    }


# --- Validation of labels (Gazette: TestLabelValidationCases). ---


@pytest.mark.parametrize(
    ("name", "value", "field", "rule"),
    [
        ("a-label", "a-value", None, None),
        ("a/label", "a%20value", None, None),
        ("a|label", "a-value", "name", "not a valid token (a|label)"),
        ("a-label", "a|value", "value", "not a valid token (a|value)"),
        ("a", "a-value", "name", "invalid length (1; expected 2 <= length <= 64)"),
        ("a" * 65, "a-value", "name", "invalid length (65; expected 2 <= length <= 64)"),
        ("a-label", "", None, None),
        ("a-label", "a" * 1025, "value", "invalid length (1025; expected 0 <= length <= 1024)"),
        ("a-label:prefix", "a-value", "name", "not a valid token (a-label:prefix)"),
        # Beyond Gazette's table: Unicode letters and numbers are token characters, and
        # lengths count UTF-8 bytes.
        ("ärger-٣", "ünïcode", None, None),
        ("é" * 33, "v", "name", "invalid length (66; expected 2 <= length <= 64)"),
        ("a label", "v", "name", "not a valid token (a label)"),
        ("a#label", "v", "name", "not a valid token (a#label)"),
    ],
)
def test_label_validation(name: str, value: str, field: str | None, rule: str | None) -> None:
    if field is None:
        validate_label(Label(name, value))
        validate_label(pb.Label(name=name, value=value))
        return
    with pytest.raises(ValidationError) as info:
        validate_label(Label(name, value))
    assert info.value.field == field
    assert info.value.rule == rule
    assert str(info.value) == f"{field}: {rule}"


def test_single_value_labels() -> None:
    validate_single_value_labels(LabelSet.of("aaa", "bar", "aaa", "baz", L.CONTENT_TYPE, "a/type"))
    with pytest.raises(ValidationError) as info:
        validate_single_value_labels(
            LabelSet.of("aaa", "bar", L.CONTENT_TYPE, "a/type", L.CONTENT_TYPE, "other/type")
        )
    assert info.value.field == "labels[2]"
    assert "label content-type value other/type" in info.value.rule
    with pytest.raises(ValidationError) as info:
        validate_single_value_labels(LabelSet.of(L.INSTANCE, "a", L.INSTANCE, "b", "other", "c"))
    assert info.value.field == "labels[1]"


def test_set_validation_sequence() -> None:
    # Gazette: TestSetValidationCases, fixing one fault after another.
    labels = [
        pb.Label(name="bad label", value="111"),
        pb.Label(name="aaa", value="444"),
        pb.Label(name="aaa", value="333"),
        pb.Label(name="aaa", value="222"),
        pb.Label(name="ccc", value=""),
        pb.Label(name="ccc", value=""),
        pb.Label(name="ccc", value="555"),
        pb.Label(name="ddd", value="666", prefix=True),
    ]
    msg = pb.LabelSet(labels=labels)

    def fails(field: str, rule_part: str) -> None:
        with pytest.raises(ValidationError) as info:
            validate_label_set(msg)
        assert info.value.field == field
        assert rule_part in info.value.rule

    fails("labels[0].name", "not a valid token (bad label)")
    msg.labels[0].name = "bbb"
    fails("labels[1]", "labels not in unique, sorted order (index 1; label name aaa <= bbb)")
    msg.labels[0].CopyFrom(pb.Label(name="aaa", value="222"))
    msg.labels[3].CopyFrom(pb.Label(name="bbb", value="111"))
    fails("labels[2]", "(index 2; label aaa value 333 <= 444)")
    msg.labels[1].value, msg.labels[2].value = "333", "444"
    fails("labels[5]", "(index 5; label ccc value  <= )")
    msg.labels[5].value = "444"
    fails("labels[5]", "label has empty & non-empty values (index 5; label ccc value 444)")
    msg.labels[4].value = "44"
    fails("labels[7].prefix", "prefix may not be set outside of a label selector")
    msg.labels[7].prefix = False
    validate_label_set(msg)
    # The same labels, normalised into a LabelSet, are equal to the message's.
    assert LabelSet.from_proto(msg).to_proto() == msg


# --- LabelSet behaviour. ---


def test_label_set_is_sorted_deduplicated_and_hashable() -> None:
    a = LabelSet([("b", "2"), ("a", "1"), ("b", "1"), ("a", "1")])
    assert [tuple(lb) for lb in a] == [("a", "1", False), ("b", "1", False), ("b", "2", False)]
    b = LabelSet.from_mapping({"b": ["2", "1"], "a": "1"})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != LabelSet.of("a", "1")
    assert LabelSet.from_proto(a.to_proto()) == a
    assert "b" in a and "c" not in a


def test_equality_with_prefix_labels() -> None:
    # Gazette: TestEqualityCases.
    lhs = LabelSet.of("one", "1", "three", "3")
    rhs = LabelSet.of("one", "1", "two:prefix", "pre/")
    assert lhs != rhs
    rhs = rhs.add("three", "3")
    assert lhs != rhs
    lhs = lhs.add("two:prefix", "pre/")
    assert lhs == rhs
    assert lhs == LabelSet(
        [Label("one", "1"), Label("three", "3"), Label("two", "pre/", prefix=True)]
    )
    assert lhs != rhs.add("four", "4")
    assert lhs != None  # noqa: E711


def test_assign() -> None:
    lhs = LabelSet.of("name", "value")
    assert lhs.assign(None) == LabelSet()
    other = LabelSet.of("one", "", "two", "")
    assert lhs.assign(other) == other


@pytest.mark.parametrize(
    ("name", "values", "value"),
    [
        ("aa", (), None),
        ("aaa", ("222", "333", "444"), "222"),
        ("bbb", (), None),
        ("ccc", ("",), ""),
        ("ddd", (), None),
        ("DDDD", ("111",), "111"),
        ("eee", (), None),
        ("ff", ("555",), "555"),
    ],
)
def test_values_of(name: str, values: tuple[str, ...], value: str | None) -> None:
    # Gazette: TestValuesOfCases (ValueOf gives None rather than "" when absent).
    labels = LabelSet.of(
        "DDDD", "111", "aaa", "222", "aaa", "333", "aaa", "444", "ccc", "", "ff", "555"
    )
    labels.validate()
    assert labels.values_of(name) == values
    assert labels.value_of(name) == value


def test_add_set_remove() -> None:
    # Gazette: TestSetAddAndRemove.
    s = LabelSet()
    for name, value in [("bb", "3"), ("aa", "0"), ("bb", "1"), ("aa", "2"), ("bb", "3")]:
        s = s.add(name, value)
    s = s.add("bb", "4")
    assert s == LabelSet.of("aa", "0", "aa", "2", "bb", "1", "bb", "3", "bb", "4")
    s = s.set("bb:prefix", "5").set("cc", "6").set("00", "6")
    assert s == LabelSet.of("00", "6", "aa", "0", "aa", "2", "bb:prefix", "5", "cc", "6")
    s = s.set("00", "7").set("aa", "8")
    assert s == LabelSet.of("00", "7", "aa", "8", "bb:prefix", "5", "cc", "6")
    s = s.add("bb", "9").add("00", "00").remove("bb").remove("bb")
    assert s == LabelSet.of("00", "00", "00", "7", "aa", "8", "cc", "6")
    s = s.remove("0").remove("00")
    assert s == LabelSet.of("aa", "8", "cc", "6")
    assert s.remove("dd").remove("cc").remove("aa") == LabelSet()


def test_union_prefers_left_values() -> None:
    # Gazette: TestUnion.
    lhs = LabelSet.of("bbb", "val-1", "bbb", "val-2", "ccc", "val-3")
    rhs = LabelSet.of("aaa", "val-4", "aaa", "val-5", "bbb", "val-6", "ddd", "val-7")
    assert lhs.union(rhs) == LabelSet.of(
        "aaa",
        "val-4",
        "aaa",
        "val-5",
        "bbb",
        "val-1",
        "bbb",
        "val-2",
        "ccc",
        "val-3",
        "ddd",
        "val-7",
    )


_JOIN_LHS = LabelSet.of(
    "aaa",
    "val",
    "bbb",
    "val-1",
    "ccc",
    "val-1",
    "ccc",
    "val-2",
    "ddd",
    "val-1",
    "ddd",
    "val-2",
    "eee",
    "val",
    "ggg",
    "val",
)
_JOIN_RHS = LabelSet.of(
    "aaa",
    "val",
    "bbb",
    "val-2",
    "ccc",
    "val-1",
    "ddd",
    "val-1",
    "ddd",
    "val-2",
    "fff",
    "val",
    "ggg",
    "val",
)


def test_intersect_and_subtract() -> None:
    # Gazette: TestIntersection and TestSubtraction.
    assert _JOIN_LHS.intersect(_JOIN_RHS) == LabelSet.of(
        "aaa", "val", "ddd", "val-1", "ddd", "val-2", "ggg", "val"
    )
    assert _JOIN_LHS.subtract(_JOIN_RHS) == LabelSet.of(
        "bbb", "val-1", "ccc", "val-1", "ccc", "val-2", "eee", "val"
    )


# --- Selector validation and matching. ---


def test_selector_validation_names_include_or_exclude() -> None:
    # Gazette: TestSelectorValidationCases.
    sel = LabelSelector(
        LabelSet([Label("include", "a-value"), Label("prefix-thing", "prefix/", True)]),
        LabelSet.of("exclude", "other-value"),
    )
    sel.validate()
    bad = LabelSelector(LabelSet.of("bad label", "a-value"), sel.exclude)
    with pytest.raises(ValidationError) as info:
        bad.validate()
    assert str(info.value) == "include.labels[0].name: not a valid token (bad label)"
    bad = LabelSelector(sel.include, LabelSet.of("bad label", "x"))
    with pytest.raises(ValidationError) as info:
        bad.validate()
    assert info.value.field == "exclude.labels[0].name"


_MATCH_SEL = LabelSelector(
    include=LabelSet.of("inc-1:prefix", "a-val/", "inc-2", "", "inc-3", "val-1", "inc-3", "val-2"),
    exclude=LabelSet.of("exc-1", "", "exc-2", "val-3", "exc-2", "val-4"),
)


@pytest.mark.parametrize(
    ("pairs", "expect"),
    [
        # Gazette: TestSelectorMatchingCases.
        ((), False),
        (("foo", "bar", "inc-1", "a-val/a/1", "inc-2", "any", "inc-3", "val-1"), True),
        (("foo", "bar", "inc-1", "a-val/b/2", "inc-2", "foo", "inc-3", "val-1"), True),
        (("foo", "bar", "inc-1", "a-val/c/3", "inc-2", "any", "inc-3", "val-2"), True),
        (("foo", "bar", "inc-1", "bad-val/4", "inc-2", "any", "inc-3", "val-1"), False),
        (("foo", "bar", "inc-1", "a-val/5", "inc-3", "val-1"), False),
        (("foo", "bar", "inc-1", "a-val/6", "inc-2", "any", "inc-3", "val-other"), False),
        (("exc-1", "any", "inc-1", "a-val/a/7", "inc-2", "any", "inc-3", "val-1"), False),
        (("exc-2", "val-4", "inc-1", "a-val/8", "inc-2", "any", "inc-3", "val-1"), False),
        (("exc-2", "val-ok", "inc-1", "a-val/9/9", "inc-2", "any", "inc-3", "val-1"), True),
    ],
)
def test_selector_matching(pairs: tuple[str, ...], expect: bool) -> None:
    assert _MATCH_SEL.matches(LabelSet.of(*pairs)) is expect


def test_exclude_only_selector() -> None:
    sel = LabelSelector(exclude=_MATCH_SEL.exclude)
    assert sel.matches(LabelSet())
    assert sel.matches(LabelSet.of("foo", "bar"))
    assert sel.matches(LabelSet.of("exc-2", "val-ok", "foo", "bar"))
    assert not sel.matches(LabelSet.of("exc-2", "val-3", "foo", "bar"))
    assert not sel.matches(LabelSet.of("exc-1", "any", "foo", "bar"))


def test_meta_labels() -> None:
    labels = with_meta_labels(LabelSet.of("hello", "world"), "path/to/my/journal")
    assert labels == LabelSet.of(
        "hello",
        "world",
        "name",
        "path/to/my/journal",
        "prefix",
        "path/",
        "prefix",
        "path/to/",
        "prefix",
        "path/to/my/",
    )
    assert with_meta_labels(LabelSet(), "flat") == LabelSet.of("name", "flat")
    assert with_shard_meta_labels(LabelSet.of("a", "b"), "shard-1") == LabelSet.of(
        "a", "b", "id", "shard-1"
    )
    sel = LabelSelector.parse("prefix=path/to/")
    assert sel.matches(labels)
    assert not LabelSelector.parse("prefix=path/t").matches(labels)  # Only '/'-terminated.
    assert not LabelSelector.parse("prefix=path/to/my/journal/").matches(labels)
    assert LabelSelector.parse("name:prefix=path/to/m").matches(labels)
    assert sel.expand_prefix_meta() == LabelSelector.parse("name:prefix=path/to/")


# The broker tutorial's journals: example/journal, and three partitions which
# inherit their parent foobar/'s labels.
_TUTORIAL = {
    "example/journal": LabelSet.of(
        L.MESSAGE_TYPE,
        "TestMessage",
        L.REGION,
        "local",
        L.TAG,
        "demo",
        L.CONTENT_TYPE,
        L.CONTENT_TYPE_JSON_LINES,
    ),
    **{
        f"foobar/part-00{i}": LabelSet.of(L.CONTENT_TYPE, L.CONTENT_TYPE_JSON_LINES, "my-label", "")
        for i in range(3)
    },
}


@pytest.mark.parametrize(
    ("selector", "expect"),
    [
        ("prefix=example/", ["example/journal"]),
        ("prefix=foobar/", ["foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("app.gazette.dev/message-type=TestMessage", ["example/journal"]),
        ("my-label", ["foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("name in (example/journal, foobar/part-001)", ["example/journal", "foobar/part-001"]),
        ("prefix=foobar/, name not in (foobar/part-001)", ["foobar/part-000", "foobar/part-002"]),
    ],
)
def test_broker_tutorial_selectors(selector: str, expect: list[str]) -> None:
    sel = LabelSelector.parse(selector)
    for s in (sel, sel.expand_prefix_meta()):
        got = [n for n, ls in sorted(_TUTORIAL.items()) if s.matches(with_meta_labels(ls, n))]
        assert got == expect


# --- Parsing and formatting. ---


@pytest.mark.parametrize(
    ("text", "include", "exclude"),
    [
        # Gazette: TestSelectorParsingCases.
        ("foo = bar", ("foo", "bar"), ()),
        ("foo:prefix =bar", ("foo:prefix", "bar"), ()),
        ("foo != bar", (), ("foo", "bar")),
        ("foo ", ("foo", ""), ()),
        (" !foo", (), ("foo", "")),
        (" foo in (bing, baz,bar)", ("foo", "bar", "foo", "baz", "foo", "bing"), ()),
        (" foo not in ( pear, apple )", (), ("foo", "apple", "foo", "pear")),
        (
            "foo==bar, baz !=bing ,apple:prefix in (fruit, banana)",
            ("apple:prefix", "banana", "apple:prefix", "fruit", "foo", "bar"),
            ("baz", "bing"),
        ),
        (
            "!foo,baz,bing:prefix not in (thing-one, thing-2),!bar,",
            ("baz", ""),
            ("bar", "", "bing:prefix", "thing-2", "bing:prefix", "thing-one", "foo", ""),
        ),
        (
            "foo = ba=ar, baz=bi=ngo,exc!=who=ops",
            ("foo", "ba=ar", "baz", "bi=ngo"),
            ("exc", "who=ops"),
        ),
        (
            "foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
            ("foo", "bi=ng", "foo", "ba=ar"),
            ("exc", "who=ops", "exc", "oth=er"),
        ),
        # Beyond Gazette's table.
        ("", (), ()),
        ("foo in ( )", ("foo", ""), ()),
        ("foo in (a,)", ("foo", "a"), ()),
        ("foo notin(a)", (), ("foo", "a")),
        ("foo = =x", ("foo", "=x"), ()),
        ("foo===x", ("foo", "=x"), ()),
        ("! foo", (), ("foo", "")),
    ],
)
def test_parse(text: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> None:
    sel = LabelSelector.parse(text)
    assert sel == LabelSelector(LabelSet.of(*include), LabelSet.of(*exclude))
    assert LabelSelector.parse(sel.format()) == sel
    assert LabelSelector.from_proto(sel.to_proto()) == sel


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        # Gazette's error cases: it reports the unmatched remainder; we report where.
        ("apple,banana err in (bar)", 13, '"=", "!=", " in (", " not in (", ","'),
        ("apple,banana in (bar,err baz)", 25, '"," or ")"'),
        ("ban=ana in (bar)", 8, '"," or end of selector'),
        # Further malformed selectors.
        ("a in (b", 0, "a label name"),
        ("foo in (bar", 11, '")"'),
        ("foo in ()", 8, "a set value"),
        ("foo in bar", 7, '"("'),
        ("foo not (a)", 8, '"in"'),
        (" ", 1, "a label name"),
        ("foo,", 4, None),
        ("foo,,bar", 4, "a label name"),
        ("foo  ,bar", 4, '"=", "!="'),
        ("foo  in (a)", 4, '"=", "!="'),
        ("foo=a  ,b", 6, '"," or end of selector'),
        ("foo in (a  ,b)", 10, '"," or ")"'),
        ("foo=b|r", 5, '"," or end of selector'),
        ("!foo=bar", 4, '"," or end of selector'),
        ("foo:prefixx", 10, '"=", "!="'),
    ],
)
def test_parse_errors_name_position(text: str, position: int, expected: str | None) -> None:
    if expected is None:  # A trailing comma is accepted, as by Gazette.
        LabelSelector.parse(text)
        return
    with pytest.raises(SelectorError) as info:
        LabelSelector.parse(text)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.position == position
    assert expected in err.expected
    assert f'selector "{text}": at position {position}' in str(err)


@pytest.mark.parametrize(
    ("text", "rule_part"),
    [
        # Gazette: "Expect Validate is called".
        ("foo, foo in (bar)", "include.labels[1]: label has empty & non-empty values"),
        ("foo:prefix=a,foo=a", "include.labels[1]: labels not in unique, sorted order"),
        ("foo=" + "v" * 1025, "include.labels[0].value: invalid length (1025"),
        ("x" * 65, "include.labels[0].name: invalid length (65"),
    ],
)
def test_parse_validates(text: str, rule_part: str) -> None:
    with pytest.raises(SelectorError) as info:
        LabelSelector.parse(text)
    assert info.value.position is None
    assert rule_part in str(info.value)


def test_format_is_canonical() -> None:
    sel = LabelSelector.parse("zz=1, aa in (c, b), !mm, qq!=x, aa:prefix=p/, rr notin (2,1)")
    assert sel.format() == "aa in (b,c),aa:prefix=p/,zz=1,!mm,qq!=x,rr notin (1,2)"
    assert str(sel) == sel.format()
    # A value starting with '=' keeps its meaning through format.
    assert LabelSelector(LabelSet.of("foo", "=x")).format() == "foo in (=x)"
    assert LabelSelector(exclude=LabelSet.of("foo", "=x")).format() == "foo!==x"


# --- Properties. ---

_TOKEN_ALPHABET = "abcXYZ019-_+/.é"
_names = st.text(_TOKEN_ALPHABET, min_size=2, max_size=8)
_values = st.text(_TOKEN_ALPHABET + "=%", min_size=1, max_size=6)


@st.composite
def _label_sets(draw: st.DrawFn) -> LabelSet:
    out: list[Label] = []
    for name in draw(st.lists(_names, max_size=4, unique=True)):
        prefix = draw(st.booleans())
        if draw(st.booleans()):
            out.append(Label(name, "", prefix))
        else:
            for value in draw(st.lists(_values, min_size=1, max_size=3, unique=True)):
                out.append(Label(name, value, prefix))
    return LabelSet(out)


_selectors = st.builds(LabelSelector, _label_sets(), _label_sets())


@settings(max_examples=300, deadline=None)
@given(_selectors)
def test_parse_inverts_format(sel: LabelSelector) -> None:
    sel.validate()
    text = sel.format()
    assert LabelSelector.parse(text) == sel
    assert LabelSelector.parse(text).format() == text  # Canonical text is a fixed point.


@settings(max_examples=300, deadline=None)
@given(st.text(" ,!=()abin:prefixot/", max_size=24))
def test_parse_never_fails_unexpectedly(text: str) -> None:
    try:
        sel = LabelSelector.parse(text)
    except SelectorError as err:
        assert err.position is None or 0 <= err.position <= len(text)
    else:
        assert LabelSelector.parse(sel.format()) == sel


_journal_names = st.lists(st.sampled_from(["a", "b", "cc"]), min_size=1, max_size=4).map("/".join)


@settings(max_examples=200, deadline=None)
@given(_journal_names, st.lists(_journal_names, max_size=3), st.booleans())
def test_prefix_meta_label_equals_name_prefix_match(
    name: str, prefixes: list[str], exclude: bool
) -> None:
    # Both forms Gazette has used for `prefix=` select the same journals.
    values = LabelSet((L.META_PREFIX, p + "/") for p in prefixes)
    sel = LabelSelector(exclude=values) if exclude else LabelSelector(include=values)
    labels = with_meta_labels(LabelSet.of("x-label", "y"), name)
    expect = any(name.startswith(p + "/") for p in prefixes)
    if not prefixes:
        expect = True  # An empty selector selects everything.
    elif exclude:
        expect = not expect
    assert sel.matches(labels) is expect
    assert sel.expand_prefix_meta().matches(labels) is expect

"""Framing tests. Byte fixtures of the fixed framing and the JSON marshal/decode cases
follow Gazette's message/fixed_framing_test.go and json_framing_test.go; the hypothesis
tests check that batch splitting agrees with a line-by-line / frame-by-frame reading."""

from __future__ import annotations

import csv
import datetime
import io
import itertools
import json

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gazette.message import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    FIXED_FRAME_WORD,
    CSVFraming,
    CSVRecord,
    DesyncError,
    FixedFraming,
    FramingError,
    JSONFraming,
    JSONMessage,
    MessageDecodeError,
    UnknownContentTypeError,
    build_uuid,
    framing_for_content_type,
    new_producer_id,
)
from gazette.message.framing import StdlibJSONFraming
from gazette.message.typed import TypedMessage
from gazette.protocol import protocol_pb2 as pb

FIXTURE = bytes([0x66, 0x33, 0x93, 0x36, 0x14, 0, 0, 0]) + b"test message content"


def test_framing_by_content_type() -> None:
    assert isinstance(framing_for_content_type(CONTENT_TYPE_JSON_LINES), JSONFraming)
    assert isinstance(framing_for_content_type(CONTENT_TYPE_PROTO_FIXED), FixedFraming)
    assert isinstance(framing_for_content_type(CONTENT_TYPE_CSV), CSVFraming)
    with pytest.raises(UnknownContentTypeError, match="x-gazette-recoverylog"):
        framing_for_content_type("application/x-gazette-recoverylog")


# -- JSON ---------------------------------------------------------------------------------


def test_json_marshal_fixtures() -> None:
    f = JSONFraming()
    assert f.marshal({"A": 42, "B": "the answer"}) == b'{"A":42,"B":"the answer"}\n'
    assert f.marshal_many([{"A": 42, "B": "the answer"}, {"Bar": 63}]) == (
        b'{"A":42,"B":"the answer"}\n{"Bar":63}\n'
    )
    assert f.marshal_many([]) == b""
    # Messages may supply their JSON value; a newline in content stays escaped.
    assert f.marshal(JSONMessage({"s": "two\nlines"})) == b'{"s":"two\\nlines"}\n'


def test_json_marshal_error() -> None:
    with pytest.raises(FramingError, match="cannot encode"):
        JSONFraming().marshal({"unencodable": object()})


def test_json_decode_fixture_and_partial_tail() -> None:
    f = JSONFraming()
    buf = b'{"A":42,"B":"test message content"}\n{"A":4'
    d = f.decode(buf)
    assert d.values == [{"A": 42, "B": "test message content"}]
    assert d.ends == [36] and d.consumed == 36 and d.errors == 0
    # No complete line: nothing consumed (the reader waits for more, or reports EOF).
    assert f.decode(b'{"A":42').consumed == 0


def test_json_decode_error_consumes_exactly_its_frame() -> None:
    f = JSONFraming()
    buf = b'{"A":42,"B":"missing quote but including newline}\n{"ok":1}\nextra'
    d = f.decode(buf)
    assert isinstance(d.values[0], MessageDecodeError)
    assert d.values[1] == {"ok": 1}
    assert d.errors == 1
    assert buf[d.consumed :] == b"extra"


def test_json_rejects_a_document_spanning_lines() -> None:
    d = JSONFraming().decode(b'[1,\n2]\n{"a":1}\n')
    assert [type(v) for v in d.values[:2]] == [MessageDecodeError, MessageDecodeError]
    assert d.values[2] == {"a": 1}
    assert d.ends == [4, 7, 15]


def test_json_tolerates_surrounding_whitespace_and_non_ascii() -> None:
    buf = ' {"é":"ü"} \n{"x":"✓"}\n'.encode()
    d = JSONFraming().decode(buf)
    assert d.values == [{"é": "ü"}, {"x": "✓"}]
    assert d.ends == [len(' {"é":"ü"} \n'.encode()), len(buf)]


def test_json_invalid_utf8_is_isolated() -> None:
    d = JSONFraming().decode(b'{"a":"\xff"}\n{"b":2}\n')
    assert isinstance(d.values[0], MessageDecodeError)
    assert d.values[1] == {"b": 2}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
lines = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(v, indent=1).encode()),  # Spans lines: invalid.
    st.binary(max_size=12).filter(lambda b: b"\n" not in b),  # Mostly invalid.
)


@given(st.lists(lines, max_size=8), st.binary(max_size=10).filter(lambda b: b"\n" not in b))
def test_json_decode_agrees_with_line_by_line(docs: list[bytes], tail: bytes) -> None:
    buf = b"".join(d + b"\n" for d in docs) + tail
    d = JSONFraming().decode(buf)
    expect_lines = buf[: buf.rfind(b"\n") + 1].split(b"\n")[:-1] if b"\n" in buf else []
    assert len(d.values) == len(expect_lines)
    pos = 0
    for line, value, end in zip(expect_lines, d.values, d.ends, strict=True):
        pos += len(line) + 1
        assert end == pos
        try:
            expect = json.loads(line.decode())  # Strict UTF-8 (no BOM, UTF-16...).
        except ValueError:
            assert isinstance(value, MessageDecodeError)
        else:
            assert value == expect
    assert d.consumed == pos
    assert d.errors == sum(isinstance(v, MessageDecodeError) for v in d.values)


# Fragments that are not JSON documents alone but could pass for parts of one array: what
# JSONFraming's one-call parse must never mistake for lines (see JSONFraming._decode_array).
fragments = st.lists(
    st.sampled_from(
        ["[1", "2]", "[[1", "2]]],[3", "2],null,3", "{\"a\":[{}", "{}]},{\"x\":1}", "{\"a\":1",
         "\"k\":2}", "1,2", "null", "true", "false", ",", " ", "", "{}", "[]", "\"s\"", "1]",
         "[{\"a\":1", "2}]},{\"\":3", "NaN", "1 2", "}", "]"]
    ),
    min_size=1,
    max_size=4,
).map(lambda parts: "".join(parts).encode())


@given(st.lists(st.one_of(lines, fragments), max_size=10))
def test_json_decode_never_merges_lines(docs: list[bytes]) -> None:
    buf = b"".join(d + b"\n" for d in docs)
    d = JSONFraming().decode(buf)
    expect_lines = buf.split(b"\n")[:-1]  # Some docs span lines.
    assert len(d.values) == len(expect_lines)
    for line, value in zip(expect_lines, d.values, strict=True):
        try:
            expect = json.loads(line.decode())
        except ValueError:
            assert isinstance(value, MessageDecodeError)
        else:
            assert json.dumps(value) == json.dumps(expect)


@pytest.mark.parametrize(
    "docs",
    [
        # Each pair parses as one array of the right length with its sentinels at the odd
        # positions, were the sentinel's token allowed in the lines or the joiners nested.
        [b"[1", b"2],null,3"],
        [b"[[1", b"2]]],[3"],
        [b'[{"a":1', b'2}]},{"":3'],
        [b'{"a":[{}', b'{}]},{"x":1}'],
        [b"[1", b"2],true,3", b"null"],
        [b"[1", b"2],false,3", b"null", b"true"],
    ],
)
def test_json_decode_rejects_lines_that_only_parse_together(docs: list[bytes]) -> None:
    d = JSONFraming().decode(b"".join(x + b"\n" for x in docs))
    assert [isinstance(v, MessageDecodeError) for v in d.values[:2]] == [True, True]
    assert d.values[2:] == [json.loads(x) for x in docs[2:]]


def test_json_decode_same_values_whichever_sentinel() -> None:
    # Lines holding each sentinel token in turn, and all of them (parsed value by value).
    for docs in (
        [b'{"a":1}', b'{"b":"x"}'],
        [b'{"a":null}', b"[1]"],
        [b'{"a":null,"b":true}', b'"f"'],
        [b'{"a":null,"b":true,"c":false}', b"2"],
        [b'{"s":"null true false"}', b' {"t":[]} ', b"0"],
    ):
        buf = b"".join(x + b"\n" for x in docs)
        d = JSONFraming().decode(buf)
        assert d.values == [json.loads(x) for x in docs]
        assert d.errors == 0 and d.consumed == len(buf)
        assert d.ends == list(itertools.accumulate(len(x) + 1 for x in docs))


# -- fixed --------------------------------------------------------------------------------


def test_fixed_marshal_fixtures() -> None:
    f = FixedFraming()
    assert f.marshal(b"test message content") == FIXTURE
    assert (
        f.marshal_many([b"test message content", b"foo message"])
        == FIXTURE + bytes([0x66, 0x33, 0x93, 0x36, 0x0B, 0, 0, 0]) + b"foo message"
    )
    # Protobuf messages marshal through SerializeToString.
    spec = pb.JournalSpec(name="a/journal")
    frame = f.marshal(spec)
    assert frame[:4] == FIXED_FRAME_WORD
    assert pb.JournalSpec.FromString(f.decode(frame).values[0]) == spec


def test_fixed_marshal_error() -> None:
    with pytest.raises(FramingError, match="SerializeToString"):
        FixedFraming().marshal(object())


def test_fixed_decode_fixture_stops_at_frame_boundary() -> None:
    d = FixedFraming().decode(FIXTURE + b"extra")
    assert d.values == [b"test message content"]
    assert d.consumed == len(FIXTURE)


def test_fixed_trailing_newline() -> None:
    f = FixedFraming()
    d = f.decode(FIXTURE + b"\n")
    assert d.consumed == len(FIXTURE)  # The newline may yet begin junk: wait.
    assert f.decode(b"\n", final=True).consumed == 1  # At the end it is tolerated.


def test_fixed_desync_detection() -> None:
    d = FixedFraming().decode(b"foobar" + FIXTURE)
    assert isinstance(d.values[0], DesyncError)
    assert d.values[0].skipped == 6
    assert d.values[1] == b"test message content"
    assert d.ends == [6, 6 + len(FIXTURE)] and d.errors == 1


def test_fixed_incomplete_buffers() -> None:
    f = FixedFraming()
    assert f.decode(b"").consumed == 0
    assert f.decode(FIXTURE[:7]).consumed == 0  # Part of a header.
    assert f.decode(FIXTURE[:8]).consumed == 0  # A header, no payload.
    # Junk with no magic word in sight: all but the last 3 bytes (a possible word prefix)
    # are skipped.
    d = f.decode(b"0123456789")
    assert isinstance(d.values[0], DesyncError) and d.values[0].skipped == 7
    assert d.consumed == 7


@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40).map(lambda b: ("frame", b)),
            st.binary(min_size=1, max_size=12)
            .filter(lambda b: FIXED_FRAME_WORD[:1] not in b)
            .map(lambda b: ("junk", b)),
        ),
        max_size=8,
    )
)
def test_fixed_resyncs_after_junk(parts: list[tuple[str, bytes]]) -> None:
    f = FixedFraming()
    buf = b"".join(f.marshal(p) if kind == "frame" else p for kind, p in parts)
    d = f.decode(buf, final=True)
    frames = [v for v in d.values if isinstance(v, bytes)]
    # Every frame is recovered (junk never holds a magic word's first byte), and every
    # junk byte is reported skipped.
    assert frames == [p for kind, p in parts if kind == "frame"]
    skipped = sum(v.skipped for v in d.values if isinstance(v, DesyncError))
    junk = sum(len(p) for kind, p in parts if kind == "junk")
    # Junk is skipped or left unconsumed, except that a lone trailing newline is consumed
    # silently (Gazette tolerates it, for Hadoop streaming).
    slack = junk - skipped - (len(buf) - d.consumed)
    assert slack == 0 or (slack == 1 and buf.endswith(b"\n") and d.consumed == len(buf))


# -- CSV ----------------------------------------------------------------------------------


def test_csv_round_trip_with_quotes_and_newlines() -> None:
    f = CSVFraming()
    u = str(build_uuid(new_producer_id(), 160, 0))
    records = [[u, "plain", "x"], [u, 'with "quotes"', "a,b"], [u, "two\nlines", ""]]
    buf = f.marshal_many(records)
    d = f.decode(buf)
    assert d.values == records
    assert d.consumed == len(buf)
    assert all(str(CSVRecord.from_csv(r).get_uuid()) == u for r in d.values)


def test_csv_partial_record_waits() -> None:
    f = CSVFraming()
    d = f.decode(b'a,"open\nquote')
    assert d.consumed == 0
    d = f.decode(b'a,b\nc,"open\n')
    assert d.values == [["a", "b"]] and d.consumed == 4


def test_csv_empty_line_is_an_error() -> None:
    d = CSVFraming().decode(b"a,b\n\nc,d\n")
    assert d.values[0] == ["a", "b"] and d.values[2] == ["c", "d"]
    assert isinstance(d.values[1], MessageDecodeError) and d.errors == 1


csv_fields = st.text(alphabet=st.characters(blacklist_categories=["Cs"]))


@given(
    st.lists(
        st.lists(csv_fields, min_size=1, max_size=4).filter(lambda r: r != [""]),
        max_size=6,
    )
)
def test_csv_decode_agrees_with_marshal(records: list[list[str]]) -> None:
    f = CSVFraming()
    buf = f.marshal_many(records)
    d = f.decode(buf)
    assert d.values == records
    assert d.consumed == len(buf)


# -- JSON: the msgspec codec against the standard library's ---------------------------------

floats = st.floats() | st.sampled_from(
    [1e16, 1e-5, 1.2e-5, 1e-4, 9.999e-5, 1e15, 9999999999999998.0, 1e-7, 5e-324, -0.0,
     1.7976931348623157e308, float("nan"), float("inf"), -float("inf"), 0.1, 123.0])
# Any text, lone surrogates, DEL, controls and characters beyond the BMP included.
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ['a"b', "a\\b", '\\"', "\\", "\x7f", "\u2028", "<>&", "é", "😀", "\ud800", "1e5", "null",
     "0.00001", "\\\\\"x"])
py_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
    | floats | texts,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(texts | st.integers() | st.booleans() | st.none(), inner, max_size=4)
    ),
    max_leaves=12,
)


def _encoded(framing: JSONFraming, value: object) -> bytes | str:
    try:
        return framing.marshal(value)
    except FramingError as err:
        return f"FramingError: {err}"


EDGE_VALUES = [
    "\x7f", "\u2028", "<>&", "é", "😀", "\ud800", "\x00\x1f\b\f\n\r\t", 'a"b', "a\\b", "\\\"",
    1e16, 1e-5, 1.2e-5, 1e-4, 1e-7, 1e15, -0.0, 5e-324, float("nan"), float("inf"),
    -float("inf"), 2**64, -(2**70), {"k": None}, {"": [1e-5]}, {True: 1, None: 2, 3: 4},
    {"s": "1e5 0.00001 null"}, (1, 2.5), ["a\"", 1e16], ["a\\", float("nan")], {"UUID": "1e3f0a9c-89ab-11ee-8000-0242ac120002"},
]


@pytest.mark.parametrize("value", EDGE_VALUES, ids=repr)
def test_json_marshal_edge_values_equal_the_stdlib_encoders(value: object) -> None:
    old = StdlibJSONFraming()
    assert JSONFraming().marshal(value) == old.marshal(value)
    assert JSONFraming().marshal_many([value, {"a": 1}]) == old.marshal_many([value, {"a": 1}])


@given(py_values)
def test_json_marshal_bytes_equal_the_stdlib_encoders(value: object) -> None:
    # Byte for byte what the standard library's encoder writes (ensure_ascii, repr floats,
    # NaN and Infinity tokens, key order, compact separators), or the same error.
    new, old = _encoded(JSONFraming(), value), _encoded(StdlibJSONFraming(), value)
    assert new == old


@given(st.lists(py_values, max_size=6))
def test_json_marshal_many_bytes_equal_the_stdlib_encoders(values: list[object]) -> None:
    new, old = JSONFraming(), StdlibJSONFraming()
    try:
        expect: bytes | None = old.marshal_many(values)
    except FramingError:
        expect = None
    if expect is None:
        with pytest.raises(FramingError):
            new.marshal_many(values)
    else:
        assert new.marshal_many(values) == expect
        assert new.marshal_many([JSONMessage(v) if isinstance(v, dict) else v
                                 for v in values]) == expect


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN and -0.0 told from 0.0 (what ``==`` alone would blur)."""
    if isinstance(a, float) and isinstance(b, float):
        return (a != a and b != b) or (a == b and str(a) == str(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@given(st.lists(py_values, max_size=6))
def test_json_decode_of_the_stdlib_encoding_is_json_loads(values: list[object]) -> None:
    old = StdlibJSONFraming()
    lines = []
    for v in values:
        try:
            lines.append(old.marshal(v))
        except FramingError:
            pass
    buf = b"".join(lines)
    d = JSONFraming().decode(buf)
    assert d.errors == 0 and d.consumed == len(buf)
    expect = [json.loads(line) for line in lines]
    assert len(d.values) == len(expect)
    assert all(map(_same, d.values, expect)), (d.values, expect)
    assert all(map(_same, d.values, StdlibJSONFraming().decode(buf).values))
    assert all(_same(JSONFraming().unmarshal(line), e) for line, e in zip(lines, expect, strict=True))


# Lines of JSON-like tokens, many invalid in ways a parser may get wrong (leading zeros, lone
# signs and points, out-of-range numbers, NaN, bad escapes, odd whitespace, a BOM).
tokens = st.lists(
    st.sampled_from(
        ["0", "01", "-", "-0", "1.", ".5", "+1", "1e", "1E+2", "1e-400", "1e400", "-1e400",
         "123456789012345678901234567890", "2.5e-5", "NaN", "Infinity", "-Infinity", "nul",
         "null", "true", "false", '"', '"a"', '"\\u00e9"', '"\\ud800"', '"\\udc00\\ud800"',
         '"\\u12"', '"\\x"', '"\\/"', "\\", "\t", " ", "\r", "\x0b", "\x0c", "\x00", "\x7f",
         "\xa0", "\ufeff", ",", ":", "[", "]", "{", "}", '"k":', "é"]
    ),
    max_size=7,
).map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass"))


@given(st.lists(tokens | st.binary(max_size=6).filter(lambda b: b"\n" not in b), max_size=8))
def test_json_decode_accepts_exactly_what_json_loads_does(docs: list[bytes]) -> None:
    buf = b"".join(d + b"\n" for d in docs)
    d = JSONFraming().decode(buf)
    assert len(d.values) == len(docs)
    for line, value in zip(docs, d.values, strict=True):
        try:
            expect = json.loads(line.decode())
        except (ValueError, RecursionError):
            assert isinstance(value, MessageDecodeError)
            with pytest.raises(MessageDecodeError):
                JSONFraming().unmarshal(line)
        else:
            assert _same(value, expect), (line, value, expect)
            assert _same(JSONFraming().unmarshal(line), expect)


def test_json_deliberate_differences_from_the_stdlib_encoder() -> None:
    """What the msgspec path encodes differently, stated in the framing's docstring: values
    of types the standard library refuses, which msgspec encodes (here as it does); and
    float dict keys written with an exponent, or not finite (msgspec's spelling)."""
    new, old = JSONFraming(), StdlibJSONFraming()
    when = datetime.date(2026, 1, 2)
    assert new.marshal({"d": when}) == b'{"d":"2026-01-02"}\n'
    with pytest.raises(FramingError, match="not JSON serializable"):
        old.marshal({"d": when})
    assert new.marshal({1e16: 1}) == b'{"1e16":1}\n'
    assert old.marshal({1e16: 1}) == b'{"1e+16":1}\n'
    # Float keys spelled alike by both are kept exactly.
    assert new.marshal({1.5: 1, 2: 2}) == old.marshal({1.5: 1, 2: 2}) == b'{"1.5":1,"2":2}\n'


def test_json_encoder_falls_back_per_message_in_a_batch() -> None:
    new = JSONFraming()
    msgs = [{"a": 1}, {"é": float("nan")}, {True: None}, {"b": "x\\\"y"}]
    assert new.marshal_many(msgs) == (
        b'{"a":1}\n{"\\u00e9":NaN}\n{"true":null}\n{"b":"x\\\\\\"y"}\n')
    assert new.marshal_many(msgs) == StdlibJSONFraming().marshal_many(msgs)
    with pytest.raises(FramingError, match="cannot encode dict as JSON"):
        new.marshal_many([{"a": 1}, {"b": object()}])


def _csv_reference_marshal(records: list[list[str]]) -> bytes:
    """The record-at-a-time encoding (a "\\r\\n" writer, each terminator cut to "\\n")."""
    out = []
    for r in records:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\r\n").writerow(r)
        out.append(buf.getvalue()[:-2] + "\n")
    return "".join(out).encode()


csv_any_fields = st.text(st.sampled_from('ab,"\r\n é\x00\t'), max_size=5)


@given(st.lists(st.lists(csv_any_fields, max_size=4), max_size=6))
def test_csv_marshal_many_equals_record_at_a_time(records: list[list[str]]) -> None:
    expect = _csv_reference_marshal(records)
    assert CSVFraming().marshal_many(records) == expect
    assert CSVFraming().marshal_many(iter(records)) == expect
    assert b"".join(CSVFraming().marshal(r) for r in records) == expect


@given(st.lists(st.binary(max_size=10).filter(lambda b: b"\n" not in b) |
                st.text(st.sampled_from('ab,"\r é\x00'), max_size=8).map(str.encode), max_size=8),
       st.binary(max_size=6))
@example([b'a,"b', b'c"', b"d"], b"")
@example([b'"a\rb"', b"a\rb", b"c\r"], b"")
def test_csv_decode_agrees_with_frame_by_frame(lines: list[bytes], tail: bytes) -> None:
    # The one-call path (no quotes, no "\r") against unpack + unmarshal of each frame.
    f = CSVFraming()
    buf = b"".join(line + b"\n" for line in lines) + tail
    d = f.decode(buf)
    u = f.unpack(buf)
    assert d.ends == u.ends and d.consumed == u.consumed
    assert len(d.values) == len(u.frames)
    for frame, value in zip(u.frames, d.values, strict=True):
        assert isinstance(frame, bytes)
        try:
            expect: object = f.unmarshal(frame)
        except MessageDecodeError:
            assert isinstance(value, MessageDecodeError)
        else:
            assert value == expect
    assert d.errors == sum(isinstance(v, MessageDecodeError) for v in d.values)


class _Point(TypedMessage):
    key: str
    n: int


def test_typed_decode_never_merges_lines() -> None:
    # The first two lines make one valid document only together, and the third holds two:
    # parsed as elements of one array they would still count three.
    docs = [b'{"key":"a"', b'"n":1}', b'{"key":"b","n":2},{"key":"c","n":3}', b'{"key":"d","n":4}']
    d = _Point.json_framing().decode(b"".join(x + b"\n" for x in docs))
    assert [isinstance(v, MessageDecodeError) for v in d.values] == [True, True, True, False]
    assert d.values[3] == _Point(key="d", n=4) and d.errors == 3


def test_typed_decode_isolates_invalid_utf8_and_deep_nesting() -> None:
    f = _Point.json_framing()
    bad = [b'{"key":"\xff","n":1}', b'{"key":"a","n":' + b"[" * 5000 + b"]" * 5000 + b"}"]
    d = f.decode(b"".join(x + b"\n" for x in [*bad, b'{"key":"b","n":2}']))
    assert [isinstance(v, MessageDecodeError) for v in d.values] == [True, True, False]
    assert d.errors == 2
    for line in bad:
        with pytest.raises(MessageDecodeError, match="invalid _Point message"):
            f.unmarshal(line)


@given(st.lists(st.binary(max_size=20) | st.binary(max_size=8).map(bytearray), max_size=6))
def test_fixed_marshal_many_is_the_frames_joined(payloads: list[bytes]) -> None:
    f = FixedFraming()
    assert f.marshal_many(payloads) == b"".join(f.marshal(p) for p in payloads)
    assert f.marshal_many(iter(payloads)) == f.marshal_many(payloads)
    with pytest.raises(FramingError, match="SerializeToString"):
        f.marshal_many([*payloads, object()])


@given(floats)
def test_msgspec_packs_every_float_as_a_float64(value: float) -> None:
    # JSONFraming tells a value holds no float by the absence of this byte (0xCB).
    packed = msgspec.msgpack.encode([value, {"k": (value,)}])
    assert packed.count(b"\xcb") >= 2 and packed[1:2] == b"\xcb"


@pytest.mark.parametrize(
    "line", [b"\xef\xbb\xbf1", b"1\x00", b'"\xed\xa0\x80"', b'\xff\xfe{\x00}\x00', b'{"a":"\xff"}'])
def test_json_lines_are_strict_utf8(line: bytes) -> None:
    # json.loads would take these as bytes (a BOM, UTF-16, an encoded surrogate...), Go's
    # decoder would not, and neither does the framing, whatever the other lines.
    for buf in (line + b'\n{"ok":1}\n', line + b'\n"\xff"\n'):
        d = JSONFraming().decode(buf)
        assert isinstance(d.values[0], MessageDecodeError) and d.errors == 2 - (b"ok" in buf)
    with pytest.raises(MessageDecodeError, match="invalid JSON message"):
        JSONFraming().unmarshal(line)

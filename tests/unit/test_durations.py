"""Go duration strings: parsing and printing exactly as Go's time package does."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import given
from hypothesis import strategies as st

from gazette.durations import (
    HOUR,
    MICROSECOND,
    MILLISECOND,
    MINUTE,
    NANOSECOND,
    SECOND,
    duration_from_pb,
    duration_to_pb,
    format_duration,
    format_duration_ns,
    ns_from_pb,
    ns_to_pb,
    parse_duration,
    parse_duration_ns,
)

MAX = (1 << 63) - 1
MIN = -(1 << 63)

PARSE_CASES = [
    ("0", 0),
    ("5s", 5 * SECOND),
    ("30s", 30 * SECOND),
    ("1478s", 1478 * SECOND),
    ("-5s", -5 * SECOND),
    ("+5s", 5 * SECOND),
    ("-0", 0),
    ("+0", 0),
    ("5.0s", 5 * SECOND),
    ("5.6s", 5 * SECOND + 600 * MILLISECOND),
    ("5.s", 5 * SECOND),
    (".5s", 500 * MILLISECOND),
    ("1.0s", SECOND),
    ("1.00s", SECOND),
    ("1.004s", SECOND + 4 * MILLISECOND),
    ("1.0040s", SECOND + 4 * MILLISECOND),
    ("100.00100s", 100 * SECOND + MILLISECOND),
    ("10ns", 10 * NANOSECOND),
    ("11us", 11 * MICROSECOND),
    ("12\u00b5s", 12 * MICROSECOND),
    ("12\u03bcs", 12 * MICROSECOND),
    ("13ms", 13 * MILLISECOND),
    ("14s", 14 * SECOND),
    ("15m", 15 * MINUTE),
    ("16h", 16 * HOUR),
    ("3h30m", 3 * HOUR + 30 * MINUTE),
    ("10.5s4m", 4 * MINUTE + 10 * SECOND + 500 * MILLISECOND),
    ("-2m3.4s", -(2 * MINUTE + 3 * SECOND + 400 * MILLISECOND)),
    ("1h2m3s4ms5us6ns", HOUR + 2 * MINUTE + 3 * SECOND + 4 * MILLISECOND + 5 * MICROSECOND + 6),
    ("39h9m14.425s", 39 * HOUR + 9 * MINUTE + 14 * SECOND + 425 * MILLISECOND),
    ("52763797000ns", 52763797000),
    ("0.3333333333333333333h", 20 * MINUTE),
    ("9007199254740993ns", (1 << 53) + 1),
    ("9223372036854775807ns", MAX),
    ("9223372036854775.807us", MAX),
    ("9223372036s854ms775us807ns", MAX),
    ("-9223372036854775808ns", MIN),
    ("-9223372036854775.808us", MIN),
    ("-9223372036s854ms775us808ns", MIN),
    ("-2562047h47m16.854775808s", MIN),
    ("0.100000000000000000000h", 6 * MINUTE),
    ("0.830103483285477580700h", 49 * MINUTE + 48 * SECOND + 372539827),
    # The spellings Gazette's YAML uses.
    ("1m0s", MINUTE),
    ("1h0m0s", HOUR),
    ("720h0m0s", 720 * HOUR),
    ("500ms", 500 * MILLISECOND),
    ("0s", 0),
]


@pytest.mark.parametrize(("text", "ns"), PARSE_CASES)
def test_parse_matches_go(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


BAD_CASES = [
    ("", "no number"),
    ("3", "missing unit"),
    ("-", "no number"),
    ("s", "expected a number"),
    (".", "'.' without digits"),
    ("-.", "'.' without digits"),
    (".s", "'.' without digits"),
    ("+.s", "'.' without digits"),
    ("1d", "unknown unit 'd'"),
    ("1h 30m", "unknown unit 'h '"),
    ("\x85\x85", "expected a number"),
    ("9223372036854775808ns", "overflows"),
    ("9223372036854775.808us", "overflows"),
    ("9223372036854ms775us808ns", "overflows"),
    ("-9223372036854775809ns", "overflows"),
    ("１s", "expected a number"),  # Only ASCII digits count, as in Go.
]


@pytest.mark.parametrize(("text", "reason"), BAD_CASES)
def test_parse_rejects_with_the_text_named(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ns(text)
    assert f"invalid duration {text!r}" in str(info.value)
    assert reason in str(info.value)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="expected a string"):
        parse_duration_ns(60)  # type: ignore[arg-type]


FORMAT_CASES = [
    ("0s", 0),
    ("1ns", 1),
    ("1.1\u00b5s", 1100),
    ("2.2ms", 2200 * MICROSECOND),
    ("3.3s", 3300 * MILLISECOND),
    ("4m5s", 4 * MINUTE + 5 * SECOND),
    ("4m5.001s", 4 * MINUTE + 5001 * MILLISECOND),
    ("5h6m7.001s", 5 * HOUR + 6 * MINUTE + 7001 * MILLISECOND),
    ("8m0.000000001s", 8 * MINUTE + 1),
    ("2562047h47m16.854775807s", MAX),
    ("-2562047h47m16.854775808s", MIN),
    ("1m0s", MINUTE),
    ("1h0m0s", HOUR),
    ("500ms", 500 * MILLISECOND),
    ("-1.5s", -1500 * MILLISECOND),
    ("999ns", 999),
    ("1\u00b5s", 1000),
]


@pytest.mark.parametrize(("text", "ns"), FORMAT_CASES)
def test_format_matches_go(text: str, ns: int) -> None:
    assert format_duration_ns(ns) == text


def test_format_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="int64"):
        format_duration_ns(MAX + 1)


@given(st.integers(min_value=MIN, max_value=MAX))
def test_ns_round_trip(ns: int) -> None:
    assert parse_duration_ns(format_duration_ns(ns)) == ns


_TD = st.timedeltas(
    min_value=timedelta(microseconds=MIN // 1000 + 1), max_value=timedelta(microseconds=MAX // 1000)
)


@given(_TD)
def test_timedelta_round_trip(td: timedelta) -> None:
    assert parse_duration(format_duration(td)) == td
    assert duration_from_pb(duration_to_pb(td)) == td


_UNITS = {
    "ns": 1,
    "us": MICROSECOND,
    "µs": MICROSECOND,
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}


@given(
    st.sampled_from(["", "+", "-"]),
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(_UNITS))), min_size=1),
)
def test_concatenated_terms_sum(sign: str, terms: list[tuple[int, str]]) -> None:
    text = sign + "".join(f"{v}{u}" for v, u in terms)
    total = sum(v * _UNITS[u] for v, u in terms)
    if total > (1 << 63) - 1:  # beyond Go's Duration: refused, as Go refuses it
        with pytest.raises(ValueError, match="overflows"):
            parse_duration_ns(text)
        return
    assert parse_duration_ns(text) == (-total if sign == "-" else total)


def test_timedelta_refuses_to_drop_nanoseconds() -> None:
    with pytest.raises(ValueError, match="microsecond resolution"):
        parse_duration("1500ns")
    assert parse_duration("1500us") == timedelta(microseconds=1500)
    with pytest.raises(ValueError, match="microsecond resolution"):
        duration_from_pb(Duration(nanos=1))


@given(st.integers(min_value=MIN, max_value=MAX))
def test_pb_nanoseconds_round_trip(ns: int) -> None:
    d = ns_to_pb(ns)
    assert ns_from_pb(d) == ns
    assert (d.seconds >= 0 and d.nanos >= 0) or (d.seconds <= 0 and d.nanos <= 0)


def test_pb_helpers_use_seconds_and_nanos() -> None:
    assert duration_to_pb(timedelta(minutes=1, microseconds=5)) == Duration(seconds=60, nanos=5000)
    assert format_duration_ns(ns_from_pb(Duration(seconds=3600))) == "1h0m0s"

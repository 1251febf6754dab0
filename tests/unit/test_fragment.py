"""Fragments: content names and paths (Gazette's examples), sums, CoverSet rules."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.fragment import (
    ZERO_SUM,
    ContentNameError,
    CoverSet,
    Fragment,
    parse_content_name,
    sum_from_proto,
    sum_to_proto,
)
from gazette.fragment.codecs import Codec
from gazette.protocol import protocol_pb2 as pb

CC = pb.CompressionCodec
MAX_INT64 = (1 << 63) - 1
SUM = bytes.fromhex("0102030405060708090a0b0c0d0e0f1011121314")
NAME = "00000000499602d2-7fffffffffffffff-0102030405060708090a0b0c0d0e0f1011121314"


def test_content_name_examples() -> None:
    f = Fragment("a/journal", 1234567890, MAX_INT64, SUM, CC.GZIP)
    assert f.content_name() == NAME + ".gz"
    assert Fragment("a/journal", 1234567890, MAX_INT64, SUM, CC.SNAPPY).content_name() == (
        NAME + ".sz"
    )
    offload = Fragment("a/journal", 1234567890, MAX_INT64, SUM, CC.GZIP_OFFLOAD_DECOMPRESSION)
    assert offload.content_name() == NAME
    empty = Fragment("a/journal", 1234567890, 1234567890)
    assert empty.content_name() == (
        "00000000499602d2-00000000499602d2-0000000000000000000000000000000000000000.raw"
    )


def test_content_path_examples() -> None:
    f = Fragment("a/journal/name", 1234567890, MAX_INT64, SUM, CC.GZIP)
    assert f.content_path() == "a/journal/name/" + NAME + ".gz"
    f = Fragment("a/journal/name", 1234567890, MAX_INT64, SUM, CC.GZIP, path_postfix="a=1/b=2")
    assert f.content_path() == "a/journal/name/a=1/b=2/" + NAME + ".gz"


def test_parse_examples() -> None:
    assert parse_content_name("a/journal", NAME + ".gz") == Fragment(
        "a/journal", 1234567890, MAX_INT64, SUM, CC.GZIP
    )
    assert parse_content_name("a/journal", "a=b/two=3/" + NAME + ".gz") == Fragment(
        "a/journal", 1234567890, MAX_INT64, SUM, CC.GZIP, path_postfix="a=b/two=3"
    )
    assert parse_content_name("a/journal", NAME) == Fragment(
        "a/journal", 1234567890, MAX_INT64, SUM, CC.GZIP_OFFLOAD_DECOMPRESSION
    )
    assert parse_content_name(
        "a/journal", "00000000499602d2-00000000499602d2-" + "0" * 40 + ".raw"
    ) == Fragment("a/journal", 1234567890, 1234567890, ZERO_SUM, CC.NONE)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        (NAME + "-extra.gz", "wrong fragment name format"),
        ("00000000499602XX" + NAME[16:] + ".gz", "begin"),
        (NAME[:17] + "7fffffffffffffXX" + NAME[33:] + ".gz", "end"),
        (NAME[:-2] + "XX.gz", "sum"),
        (NAME[:-2] + ".gz", "invalid SHA1 sum length"),
        (NAME + ".lz4", "unrecognized compression extension"),
        ("+0000000499602d2" + NAME[16:] + ".gz", "begin"),
        ("0000000000000002-0000000000000001-" + "0" * 40 + ".raw", "begin <= end"),
        ("8000000000000000-8000000000000001-" + "0" * 40 + ".raw", "overflows"),
        ("../" + NAME, "postfix"),
    ],
)
def test_parse_errors(name: str, match: str) -> None:
    with pytest.raises(ContentNameError, match=match):
        parse_content_name("a/journal", name)


@settings(max_examples=200)
@given(
    begin=st.integers(0, MAX_INT64),
    length=st.integers(0, 1 << 40),
    digest=st.binary(min_size=20, max_size=20),
    codec=st.sampled_from(
        [CC.NONE, CC.GZIP, CC.ZSTANDARD, CC.SNAPPY, CC.GZIP_OFFLOAD_DECOMPRESSION]
    ),
    postfix=st.sampled_from(["", "a=1", "date=2024-01-02/hour=03"]),
)
def test_name_and_proto_round_trip(
    begin: int, length: int, digest: bytes, codec: Codec, postfix: str
) -> None:
    end = min(MAX_INT64, begin + length)
    f = Fragment("a/journal", begin, end, digest, codec, path_postfix=postfix)
    rel = f.content_path().removeprefix("a/journal/")
    assert parse_content_name("a/journal", rel) == f
    # Names sort as offsets do.
    assert f.content_name()[:34] == f"{begin:016x}-{end:016x}-"
    assert Fragment.from_proto(f.to_proto()) == f
    assert Fragment.from_proto(pb.Fragment.FromString(f.to_proto().SerializeToString())) == f


def test_sha1sum_parts_are_big_endian() -> None:
    # Gazette's fixture: SHA1("foobar").
    digest = hashlib.sha1(b"foobar").digest()
    s = sum_to_proto(digest)
    assert (s.part1, s.part2, s.part3) == (0x8843D7F92416211D, 0xE9EBB963FF4CE281, 0x25932878)
    assert sum_from_proto(s) == digest
    assert sum_from_proto(pb.SHA1Sum()) == ZERO_SUM
    with pytest.raises(ValueError):
        sum_to_proto(b"short")


def test_fragment_validates_and_ignores_file_in_equality() -> None:
    with pytest.raises(ValueError, match="begin <= end"):
        Fragment("j", 2, 1)
    with pytest.raises(ValueError, match="20 bytes"):
        Fragment("j", 1, 2, b"x")

    class F:
        def pread(self, offset: int, n: int) -> bytes:
            return b""

    f = Fragment("j", 1, 2)
    assert f.with_file(F()) == f and hash(f.with_file(F())) == hash(f)


def test_fragment_equality_hashing_pickling_and_repr_are_a_frozen_dataclass_s() -> None:
    import copy
    import os
    import pickle

    f = Fragment("a/j", 1, 5, SUM, CC.GZIP, "file:///root/", 1700000000, "x=1")
    fields = ("a/j", 1, 5, SUM, CC.GZIP, "file:///root/", 1700000000, "x=1")
    # Every field but the file takes part in equality and the hash.
    variants = [
        Fragment("a/k", 1, 5, SUM, CC.GZIP, "file:///root/", 1700000000, "x=1"),
        Fragment("a/j", 0, 5, SUM, CC.GZIP, "file:///root/", 1700000000, "x=1"),
        Fragment("a/j", 1, 6, SUM, CC.GZIP, "file:///root/", 1700000000, "x=1"),
        Fragment("a/j", 1, 5, ZERO_SUM, CC.GZIP, "file:///root/", 1700000000, "x=1"),
        Fragment("a/j", 1, 5, SUM, CC.SNAPPY, "file:///root/", 1700000000, "x=1"),
        Fragment("a/j", 1, 5, SUM, CC.GZIP, "file:///other/", 1700000000, "x=1"),
        Fragment("a/j", 1, 5, SUM, CC.GZIP, "file:///root/", 1700000001, "x=1"),
        Fragment("a/j", 1, 5, SUM, CC.GZIP, "file:///root/", 1700000000, "x=2"),
    ]
    for g in variants:
        assert g != f and not g == f, g
    same = Fragment(*fields)
    assert same == f and not same != f and hash(same) == hash(f) and {f: 1}[same] == 1
    assert f != fields and f != 1 and f.__eq__(fields) is NotImplemented
    for twin in (pickle.loads(pickle.dumps(f)), copy.copy(f), copy.deepcopy(f)):
        assert twin == f and twin.file is None and type(twin) is Fragment
    assert repr(f) == ("Fragment(journal='a/j', begin=1, end=5, sum=" + repr(SUM) + f", codec={int(CC.GZIP)}, "
                       "backing_store='file:///root/', mod_time=1700000000, path_postfix='x=1')")
    assert not hasattr(f, "__dict__")  # slotted: an index holds many
    with pytest.raises(TypeError):
        hash(CoverSet())  # mutable: unhashable
    if os.environ.get("GAZETTE_EXPECT_COMPILED", "") not in ("", "0"):
        # Compiled, the fields are read-only (Final); interpreted, mypy alone refuses it.
        with pytest.raises(AttributeError):
            f.end = 9  # type: ignore[misc]


# -- CoverSet (Gazette's cases).


def _add(s: CoverSet, begin: int, end: int) -> bool:
    return s.add(Fragment("", begin, end))


def _spans(s: CoverSet) -> list[tuple[int, int]]:
    return [(f.begin, f.end) for f in s]


@pytest.mark.parametrize(
    ("adds", "expect"),
    [
        ([(100, 200), (200, 300), (201, 301)], [(100, 200), (200, 300), (201, 301)]),
        ([(100, 200), (200, 300), (300, 400), (400, 500), (150, 500)], [(100, 200), (150, 500)]),
        ([(100, 200), (200, 300), (199, 300)], [(100, 200), (199, 300)]),
        ([(100, 200), (200, 300), (200, 301)], [(100, 200), (200, 301)]),
        (
            [(100, 200), (200, 300), (300, 400), (400, 500), (150, 450)],
            [(100, 200), (150, 450), (400, 500)],
        ),
        ([(100, 200), (200, 300), (300, 400), (150, 350)], [(100, 200), (150, 350), (300, 400)]),
        ([(100, 200), (300, 400), (200, 300)], [(100, 200), (200, 300), (300, 400)]),
        ([(100, 200), (300, 400), (201, 299)], [(100, 200), (201, 299), (300, 400)]),
        ([(100, 200), (200, 300), (300, 400), (100, 300)], [(100, 300), (300, 400)]),
        ([(100, 200), (200, 300), (300, 400), (99, 200)], [(99, 200), (200, 300), (300, 400)]),
        ([(200, 300), (300, 400), (199, 200)], [(199, 200), (200, 300), (300, 400)]),
        (
            [
                (100, 150), (149, 201), (200, 250), (250, 300), (299, 351), (350, 400),
                (200, 300), (300, 400), (100, 200),
            ],
            [(100, 200), (149, 201), (200, 300), (299, 351), (300, 400)],
        ),
    ],
)  # fmt: skip
def test_cover_set_add(adds: list[tuple[int, int]], expect: list[tuple[int, int]]) -> None:
    s = CoverSet()
    for b, e in adds:
        assert _add(s, b, e)
    assert _spans(s) == expect


def test_cover_set_add_no_action() -> None:
    s = CoverSet()
    for b, e in [(100, 200), (200, 300), (300, 400)]:
        assert _add(s, b, e)
    # Only adds which exactly replace an entry are accepted.
    assert not _add(s, 101, 200)
    assert not _add(s, 100, 199)
    assert _add(s, 100, 200)
    assert not _add(s, 201, 300)
    assert not _add(s, 200, 299)
    assert _add(s, 200, 300)
    assert not _add(s, 301, 400)
    assert _add(s, 300, 400)
    assert not _add(s, 250, 250)  # Empty fragments are ignored.
    assert _spans(s) == [(100, 200), (200, 300), (300, 400)]
    with pytest.raises(ValueError, match="journal"):
        s.add(Fragment("other", 1, 2))


def test_cover_set_offsets() -> None:
    s = CoverSet()
    assert (s.begin_offset, s.end_offset) == (0, 0)
    _add(s, 100, 150)
    assert (s.begin_offset, s.end_offset) == (100, 150)
    _add(s, 140, 250)
    assert (s.begin_offset, s.end_offset) == (100, 250)
    _add(s, 50, 100)
    assert (s.begin_offset, s.end_offset) == (50, 250)


def test_longest_overlapping_fragment() -> None:
    s = CoverSet()
    for b, e in [(100, 200), (149, 201), (200, 300), (299, 351), (300, 400), (500, 600)]:
        _add(s, b, e)
    cases = [
        (0, False, 0), (100, True, 0), (148, True, 0), (149, True, 1), (199, True, 1),
        (200, True, 2), (298, True, 2), (299, True, 3), (300, True, 4), (350, True, 4),
        (399, True, 4), (400, False, 5), (401, False, 5), (499, False, 5), (500, True, 5),
        (599, True, 5), (600, False, 6),
    ]  # fmt: skip
    for offset, found, ind in cases:
        assert s.longest_overlapping(offset) == (ind, found), offset


def test_cover_set_difference() -> None:
    a, b = CoverSet(), CoverSet()
    for s, e in [(100, 200), (150, 225), (225, 250), (250, 300), (301, 400)]:
        assert _add(b, s, e)
    for s, e in [
        (99, 105), (100, 110), (110, 120), (130, 210), (150, 225), (151, 300), (152, 301),
        (300, 350), (301, 360), (360, 401), (400, 450),
    ]:  # fmt: skip
        assert _add(a, s, e)
    assert _spans(a.difference(b)) == [(99, 105), (152, 301), (300, 350), (360, 401), (400, 450)]
    assert _spans(a.difference(CoverSet())) == _spans(a)


def test_cover_set_of_parsed_overlaps() -> None:
    s = CoverSet()
    for name in [
        "0000000000000000-00000000400a8d41",
        "00000000400a8d41-00000000595722d7",
        "00000000400a8d41-000000007a3fb5ee",
        "00000000400a8d41-000000007af92e59",
        "00000000595722d7-000000007af92fb4",
        "000000007a3fb5ee-000000007af92fb4",
        "000000007af92e59-000000007af92e59",
    ]:
        s.add(parse_content_name("a/journal", name + "-" + "0" * 40 + ".raw"))
    assert _spans(s) == [(0, 0x400A8D41), (0x400A8D41, 0x7AF92E59), (0x595722D7, 0x7AF92FB4)]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=25))
def test_cover_set_properties(spans: list[tuple[int, int]]) -> None:
    s = CoverSet()
    covered: set[int] = set()
    for b, n in spans:
        s.add(Fragment("", b, b + n))
        covered.update(range(b, b + n))
        fs = list(s)
        # Begins and ends strictly increase; no entry covers another.
        assert all(x.begin < y.begin and x.end < y.end for x, y in zip(fs, fs[1:], strict=False))
        # Coverage is exactly the union of everything added.
        assert {o for f in fs for o in range(f.begin, f.end)} == covered
    for offset in range(-1, 85):
        ind, found = s.longest_overlapping(offset)
        cover = [i for i, f in enumerate(s) if f.begin <= offset < f.end]
        assert found == bool(cover)
        if cover:
            assert ind == max(cover, key=lambda i: s[i].end)
        else:
            assert ind == sum(1 for f in s if f.end <= offset)

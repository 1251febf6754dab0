"""Mapping tests. The modulo and rendezvous fixtures are Gazette's regression fixtures
(message/routines_test.go): journal ``a/topic/part-NNN`` chosen for each key, so Python and
Go publishers place keys identically."""

from __future__ import annotations

import pytest

from gazette.message import (
    CONTENT_TYPE_JSON_LINES,
    EmptyListResponseError,
    fnv1a_32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from gazette.protocol import protocol_pb2 as pb


def partitions(count: int) -> pb.ListResponse:
    resp = pb.ListResponse()
    for i in range(count):
        spec = resp.journals.add().spec
        spec.name = f"a/topic/part-{i:03d}"
        spec.labels.labels.add(name="content-type", value=CONTENT_TYPE_JSON_LINES)
    return resp


def key(msg: str) -> bytes:
    return msg.encode()


def test_fnv1a_32_reference_vectors() -> None:
    # Published FNV-1a 32-bit test vectors (the offset basis, "a", "foobar").
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


def test_random_mapping_spreads() -> None:
    parts = partitions(100)
    mapping = random_mapping(lambda: parts)
    seen = set()
    for _ in range(101):
        journal, content_type = mapping("foobar")
        assert content_type == CONTENT_TYPE_JSON_LINES
        seen.add(journal)
    assert len(seen) > 1  # Fails with probability 1e-200.


MODULO_443 = {
    "It always": 119,
    "seems": 54,
    "impossible": 308,
    "until": 97,
    "it is done.": 179,
    "- Nelson Mandela": 437,
    "Shall I compare": 84,
    "thee to": 300,
    "a summer's day?": 214,
    "Thou art more": 135,
    "lovely and more": 118,
    "temperate - Shakespeare": 228,
}

RENDEZVOUS_400_AND_500 = {
    "It always": 21,
    "seems": 179,
    "impossible": 50,
    "until": 13,
    "it is done.": 337,
    "- Nelson Mandela": 29,
    "Shall I compare": 110,
    "thee to": 395,
    "a summer's day?": 192,
    "Thou art more": 394,
    "lovely and more": 344,
    "temperate - Shakespeare": 75,
}


def test_modulo_mapping_regression_fixtures() -> None:
    parts = partitions(443)  # A prime number of partitions.
    mapping = modulo_mapping(key, lambda: parts)
    for msg, expect in MODULO_443.items():
        assert mapping(msg) == (f"a/topic/part-{expect:03d}", CONTENT_TYPE_JSON_LINES)


@pytest.mark.parametrize("count", [400, 500])
def test_rendezvous_mapping_regression_fixtures(count: int) -> None:
    # Rendezvous hashing moves few keys when partitions change: these keys happen to map
    # identically over 400 and 500 partitions.
    parts = partitions(count)
    mapping = rendezvous_mapping(key, lambda: parts)
    for msg, expect in RENDEZVOUS_400_AND_500.items():
        assert mapping(msg) == (f"a/topic/part-{expect:03d}", CONTENT_TYPE_JSON_LINES)


def test_rendezvous_follows_a_new_listing() -> None:
    listings = [partitions(400), partitions(1)]
    mapping = rendezvous_mapping(key, lambda: listings[0])
    assert mapping("seems")[0] == "a/topic/part-179"
    listings.pop(0)  # The polled listing changed: the cached hashes must be rebuilt.
    assert mapping("seems")[0] == "a/topic/part-000"


@pytest.mark.parametrize(
    "make", [random_mapping, lambda p: modulo_mapping(key, p), lambda p: rendezvous_mapping(key, p)]
)
def test_empty_listing(make) -> None:  # type: ignore[no-untyped-def]
    mapping = make(lambda: pb.ListResponse())
    with pytest.raises(EmptyListResponseError, match="empty"):
        mapping("foo")


def test_missing_content_type_label_maps_to_empty() -> None:
    resp = pb.ListResponse()
    resp.journals.add().spec.name = "a/journal"
    assert modulo_mapping(key, lambda: resp)("x") == ("a/journal", "")


@pytest.mark.parametrize("make", [modulo_mapping, rendezvous_mapping])
def test_keyed_mappings_remember_keys_per_listing(make, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("gazette.message.mapping.MEMO_LIMIT", 8)
    listings = [partitions(443)]
    mapping = make(key, lambda: listings[-1])
    reference = make(key, lambda: listings[-1])
    words = [f"key-{i}" for i in range(40)]
    # Repeated keys map as the first time, past the memo's limit too.
    first = [mapping(w) for w in words]
    assert [mapping(w) for w in reversed(words)] == first[::-1]
    assert first == [make(key, lambda: listings[-1])(w) for w in words]
    # The same tuple object per journal.
    assert mapping("seems") is mapping("seems")
    # A new listing (a new object) forgets what the memo knew.
    listings.append(partitions(7))
    assert [mapping(w) for w in words] == [reference(w) for w in words]
    assert {mapping(w)[0] for w in words} <= {f"a/topic/part-{i:03d}" for i in range(7)}

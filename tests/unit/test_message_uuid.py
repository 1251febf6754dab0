"""UUID and Clock tests. Cases follow Gazette's message/uuid_test.go; byte-level vectors
follow the layout documented in gazette.message.uuid and are cross-checked against the
RFC 4122 field accessors of Python's uuid module."""

from __future__ import annotations

import uuid as std_uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Clock,
    Flags,
    ProducerID,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid,
)
from gazette.message.uuid import uuid_columns, uuid_columns_of_ints, uuid_text

NS = 1_000_000_000


def unix(sec: int, nsec: int) -> int:
    return sec * NS + nsec


def test_flag_values_match_gazette() -> None:
    assert (OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN) == (0, 1, 2)
    assert Flags.ACK_TXN is ACK_TXN


def test_producer_uniqueness_and_multicast_bit() -> None:
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(p) == 6 and p[0] & 0x01 for p in ids)


def test_producer_id_is_six_bytes() -> None:
    with pytest.raises(ValueError, match="6 bytes"):
        ProducerID(b"12345")


def test_clock() -> None:
    clock = Clock()
    # Each tick advances by one microsecond: 10 intervals of 100 ns, above 4 counter bits.
    assert clock.tick() == 160
    assert clock.tick() == 320

    clock.update(unix(12, 300))
    # The clock is precise to 100 ns.
    assert clock == Clock.from_time(unix(12, 399))
    assert clock.as_time() == unix(12, 300)
    assert clock < Clock.from_time(unix(12, 400))
    assert clock > Clock.from_time(unix(12, 299))

    clock.tick()
    assert clock.as_time() == unix(12, 1300)
    assert clock > Clock.from_time(unix(12, 1299))
    assert clock < Clock.from_time(unix(12, 1400))

    # An update never moves the clock back.
    clock.update(unix(11, 100))
    assert clock.as_time() == unix(12, 1300)

    # A later timestamp resets the sequence bits.
    clock.update(unix(12, 5000))
    assert clock == Clock.from_time(unix(12, 5000))
    assert clock.as_time() == unix(12, 5000)


def test_uuid_building() -> None:
    producer = ProducerID(bytes.fromhex("8badf00d4242"))
    clock = Clock()
    clock.update(unix(1567304621, 981273734))
    clock.tick()
    clock.tick()
    flags = 682  # 0b1010101010

    u = build_uuid(producer, clock.value, flags)
    assert get_clock(u) == clock.value
    assert get_producer_id(u) == producer
    assert get_flags(u) == flags

    # Compatible with RFC 4122 readers: version, variant, node and timestamp.
    assert u.version == 1
    assert u.variant == std_uuid.RFC_4122
    assert u.node.to_bytes(6, "big") == producer
    assert u.time == clock.value >> 4
    # After two one-microsecond ticks, the time reads 2000 ns later (rounded to 100 ns).
    ns100 = u.time - 0x01B21DD213814000  # UUID epoch to Unix epoch, in 100 ns.
    assert divmod(ns100 * 100, NS) == (1567304621, 981275700)

    # The exact bytes, per the documented layout: low, mid and (versioned) high timestamp
    # words, then variant | 4 counter bits | 10 flag bits, then the producer.
    # Timestamp 0x1e9cc5f83fc2f95, counter 0 (ticks step whole microseconds), flags 0x2aa.
    assert str(u) == "83fc2f95-cc5f-11e9-82aa-8badf00d4242"
    assert u == std_uuid.UUID(fields=(0x83FC2F95, 0xCC5F, 0x11E9, 0x82, 0xAA, 0x8BADF00D4242))


def test_sequence_counter_bits() -> None:
    # The 4 LSBs of the clock land in bits 2..5 of byte 8, below the variant bits.
    u = build_uuid(ProducerID(b"\x01" * 6), (5 << 4) | 0xF, 0)
    assert u.bytes[8] == 0x80 | (0xF << 2)
    assert get_clock(u) == (5 << 4) | 0xF


def test_flags_must_fit_ten_bits() -> None:
    with pytest.raises(ValueError, match="10 bits"):
        build_uuid(ProducerID(), 1, 0x400)


@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(0, (1 << 64) - 1),
    flags=st.integers(0, 0x3FF),
)
def test_round_trip(producer: bytes, clock: int, flags: int) -> None:
    u = build_uuid(producer, clock, flags)
    assert (get_producer_id(u), get_clock(u), get_flags(u)) == (producer, clock, flags)
    assert u.version == 1 and u.variant == std_uuid.RFC_4122
    assert parse_uuid(str(u)) == u
    assert std_uuid.UUID(str(u)) == u


@pytest.mark.parametrize(
    "text",
    [
        "e4f71ec1-cc50-11e9-aaaa-8badf00d424",  # Short.
        "e4f71ec1cc50-11e9-aaaa-8badf00d42425",  # Hyphen misplaced.
        "e4f71ec1-cc50-11e9-aaaa-8badf00d424g",  # Not hex.
        "e4f71ec1-cc50-11e9-aaaa-8badf00d42_2",  # int() would take '_'.
        "+4f71ec1-cc50-11e9-aaaa-8badf00d4242",  # ... and a sign.
        "e4f71ec1-cc50-11e9-aaaa-8badf00d424٣",  # ... and non-ASCII digits.
    ],
)
def test_parse_uuid_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="canonical"):
        parse_uuid(text)


@given(st.lists(st.integers(0, (1 << 128) - 1), max_size=40))
def test_uuid_columns_in_bulk(values: list[int]) -> None:
    # Gathered by strided slices and shifts over the whole batch, as computed one by one.
    raw = b"".join(v.to_bytes(16, "big") for v in values)
    columns = uuid_columns(raw)
    assert columns == uuid_columns_of_ints(values)
    uuids = [std_uuid.UUID(int=v) for v in values]
    assert columns.producers == [int.from_bytes(get_producer_id(u), "big") for u in uuids]
    assert columns.clocks == [get_clock(u) for u in uuids]
    assert columns.flags == [get_flags(u) for u in uuids]


def test_uuid_columns_extremes() -> None:
    values = [0, (1 << 128) - 1, build_uuid(b"\xff" * 6, (1 << 64) - 1, 0x3FF).int]
    raw = b"".join(v.to_bytes(16, "big") for v in values)
    assert uuid_columns(raw) == uuid_columns_of_ints(values)
    assert uuid_columns(raw).clocks[2] == (1 << 64) - 1


@given(st.integers(0, (1 << 128) - 1))
def test_uuid_text(value: int) -> None:
    assert uuid_text(value) == str(std_uuid.UUID(int=value))

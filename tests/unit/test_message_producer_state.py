"""Checkpoint conversion tests, after Gazette's consumer/protocol checkpoint_extensions_test.go
(round trip, and decoding a checkpoint fixture written by Gazette)."""

from __future__ import annotations

import pytest

from gazette.message import (
    MessageError,
    ProducerID,
    ProducerState,
    build_checkpoint,
    flatten_producer_states,
    flatten_read_through,
)
from gazette.protocol import consumer_pb2

STATES = [
    ProducerState("foo", ProducerID(bytes([1, 2, 3, 4, 5, 6])), last_ack=456, begin=789),
    ProducerState("bar", ProducerID(bytes.fromhex("aabbccddeeff")), last_ack=789, begin=101),
]


def test_round_trip() -> None:
    cp = build_checkpoint(
        {"foo": 111, "bar": 222}, STATES, {"baz": b"intent", "bing": b"other-intent"}
    )
    assert dict(cp.ack_intents) == {"baz": b"intent", "bing": b"other-intent"}
    assert cp.sources["foo"].read_through == 111
    entry = cp.sources["foo"].producers[0]
    assert (entry.id, entry.state.last_ack, entry.state.begin) == (
        bytes([1, 2, 3, 4, 5, 6]),
        456,
        789,
    )

    decoded = consumer_pb2.Checkpoint.FromString(cp.SerializeToString())
    assert sorted(flatten_producer_states(decoded), key=lambda s: s.journal) == sorted(
        STATES, key=lambda s: s.journal
    )
    assert flatten_read_through(decoded) == {"foo": 111, "bar": 222}


def test_decodes_gazette_checkpoint_fixture() -> None:
    # Bytes of a Checkpoint written by Gazette (an older encoding, a map of producer states,
    # that the current repeated-entries message still decodes).
    fixture = bytes(
        [
            0xA, 0x21, 0xA, 0x3, 0x62, 0x61, 0x72, 0x12, 0x1A, 0x8, 0xDE, 0x1, 0x12, 0x15, 0xA, 0x6,
            0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x12, 0xB, 0x9, 0x15, 0x3, 0x0, 0x0, 0x0, 0x0, 0x0,
            0x0, 0x10, 0x65, 0xA, 0x21, 0xA, 0x3, 0x66, 0x6F, 0x6F, 0x12, 0x1A, 0x8, 0x6F, 0x12, 0x16,
            0xA, 0x6, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x12, 0xC, 0x9, 0xC8, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0,
            0x0, 0x10, 0x95, 0x6, 0x12, 0xD, 0xA, 0x3, 0x62, 0x61, 0x7A, 0x12, 0x6, 0x69, 0x6E, 0x74,
            0x65, 0x6E, 0x74, 0x12, 0x14, 0xA, 0x4, 0x62, 0x69, 0x6E, 0x67, 0x12, 0xC, 0x6F, 0x74, 0x68,
            0x65, 0x72, 0x2D, 0x69, 0x6E, 0x74, 0x65, 0x6E, 0x74,
        ]
    )  # fmt: skip
    cp = consumer_pb2.Checkpoint.FromString(fixture)
    assert sorted(flatten_producer_states(cp), key=lambda s: s.journal) == [STATES[1], STATES[0]]
    assert flatten_read_through(cp) == {"foo": 111, "bar": 222}
    assert dict(cp.ack_intents) == {"baz": b"intent", "bing": b"other-intent"}


def test_restores_a_sequencer() -> None:
    from gazette.message import Sequencer

    seq = Sequencer(flatten_read_through(build_checkpoint({"foo": 111}, STATES[:1])), STATES[:1])
    assert seq.checkpoint() == ({"foo": 111}, STATES[:1])


def test_rejects_a_malformed_producer_id() -> None:
    cp = consumer_pb2.Checkpoint()
    cp.sources["foo"].producers.add(id=b"\x01\x02")
    with pytest.raises(MessageError, match="2 bytes"):
        flatten_producer_states(cp)

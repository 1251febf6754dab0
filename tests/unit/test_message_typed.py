"""Typed messages (msgspec Structs): encoded through the JSON framing, decoded straight from
journal bytes and validated, read committed with their UUIDs, interoperable with Go's
messages (the ``"UUID"`` key) and with JSONMessage readers of the same journal."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    Chunk,
    JSONFraming,
    JSONMessage,
    MessageDecodeError,
    MessageError,
    ReadCommittedIter,
    Sequencer,
    TypedMessage,
    build_uuid,
    get_flags,
)
from gazette.message.reading import batch_decoder, message_framing
from gazette.message.uuid import ProducerID

JOURNAL = "a/typed"
A = ProducerID(b"\x01\x00\x00\x00\x00\x0a")


class Ride(TypedMessage):
    station: str
    duration_s: float
    tags: list[str] = []


class Nested(TypedMessage):
    ride: Ride
    count: int
    note: str | None
    by_key: dict[str, int]


class Stamped(TypedMessage):
    at: datetime.datetime


class _Source:
    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks

    async def read(self) -> Chunk | None:
        return self.chunks.pop(0) if self.chunks else None


def _no_replay(journal: str, begin: int, end: int) -> _Source:
    raise AssertionError("no replay expected: the ring holds every message")


def _framing() -> Any:
    return message_framing(Ride, JSONFraming())


def test_a_typed_journal_is_read_through_the_types_own_framing() -> None:
    framing = _framing()
    assert type(framing).__name__ == "StructJSONFraming"
    assert message_framing(JSONMessage, JSONFraming()).__class__ is JSONFraming
    # A caller's own decoder keeps the generic framing (it expects plain JSON values).
    assert type(message_framing(Ride, JSONFraming(), decode=list)) is JSONFraming


def test_encoding_is_json_with_the_uuid_under_gos_key() -> None:
    ride = Ride(station="W 4th", duration_s=61.5, tags=["e"])
    ride.set_uuid(build_uuid(A, 7, CONTINUE_TXN))
    line = JSONFraming().marshal(ride)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc == {"station": "W 4th", "duration_s": 61.5, "tags": ["e"], "UUID": ride.uuid}
    assert ride.get_uuid() == build_uuid(A, 7, CONTINUE_TXN)
    assert ride.uuid_int == ride.get_uuid().int
    # The batch encoder writes the same bytes, one frame per message.
    assert JSONFraming().marshal_many([ride, ride]) == line * 2


def test_an_unset_uuid_is_the_zero_uuid_text_which_go_can_decode() -> None:
    doc = json.loads(JSONFraming().marshal(Ride(station="s", duration_s=1)))
    assert doc["UUID"] == "00000000-0000-0000-0000-000000000000"


def test_a_go_producers_line_decodes_and_a_jsonmessage_reader_reads_ours() -> None:
    uuid = build_uuid(A, 9, ACK_TXN)
    go_line = json.dumps({"UUID": str(uuid), "station": "x", "duration_s": 2}).encode() + b"\n"
    decoded = _framing().decode(go_line)
    assert decoded.errors == 0
    assert decoded.values == [Ride(station="x", duration_s=2.0, uuid=str(uuid))]
    # And the other way: a JSONMessage reader of a journal a typed producer wrote.
    ours = Ride(station="y", duration_s=3)
    ours.set_uuid(uuid)
    plain = JSONFraming().decode(JSONFraming().marshal(ours))
    assert JSONMessage.from_json_many(plain.values)[0].get_uuid() == uuid


def test_bad_lines_stand_as_errors_and_later_lines_still_decode() -> None:
    good = JSONFraming().marshal(Ride(station="a", duration_s=1))
    content = (good + b'{"station": 5, "duration_s": 1}\n' + good + b"{} {}\n" + b"not json\n"
               + b"\n" + good + b'{"station": "p"')  # the last frame is incomplete
    decoded = _framing().decode(content)
    kinds = ["ok" if isinstance(v, Ride) else "err" for v in decoded.values]
    assert kinds == ["ok", "err", "ok", "err", "err", "err", "ok"]
    assert decoded.errors == 4
    assert "$.station" in str(decoded.values[1])  # names the field
    assert decoded.consumed == len(content) - len(b'{"station": "p"')
    ends = [0, *decoded.ends]
    assert content[ends[5]:ends[6]] == b"\n"  # an empty line is its own (bad) frame


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=12), st.floats(allow_nan=False, allow_infinity=False),
                          st.lists(st.text(max_size=4), max_size=3)), max_size=20),
       st.lists(st.integers(0, 2000), max_size=6))
async def test_read_committed_round_trips_whatever_the_chunking(
    rows: list[tuple[str, float, list[str]]], cuts: list[int]
) -> None:
    msgs = [Ride(station=s, duration_s=d, tags=t) for s, d, t in rows]
    for i, m in enumerate(msgs):
        m.set_uuid(build_uuid(A, i + 1, CONTINUE_TXN if i + 1 < len(msgs) else ACK_TXN))
    content = JSONFraming().marshal_many(msgs)
    points = sorted({c for c in cuts if 0 < c < len(content)})
    chunks, prev = [], 0
    for p in [*points, len(content)]:
        chunks.append(Chunk(JOURNAL, prev, content[prev:p]))
        prev = p
    framing = _framing()
    it = ReadCommittedIter(_Source(chunks), framing, batch_decoder(Ride, framing),
                           Sequencer(ring_size=64), _no_replay)
    got: list[Ride] = []
    while batch := await it.next_batch():
        got.extend(e.message for e in batch)
    assert got == msgs
    assert all(type(m) is Ride for m in got)


def test_the_batch_decoder_takes_plain_json_values_too_and_validates_them() -> None:
    decode = batch_decoder(Ride, JSONFraming())
    batch = decode([{"station": "s", "duration_s": 1}])
    assert batch == [Ride(station="s", duration_s=1.0)]
    assert batch.uuids is not None and batch.uuids.flags == [0]  # type: ignore[attr-defined]
    with pytest.raises(MessageDecodeError, match="duration_s"):
        decode([{"station": "s"}])
    with pytest.raises(MessageDecodeError, match="UUID"):
        decode([{"station": "s", "duration_s": 1, "UUID": "not-a-uuid"}])


def test_an_acknowledgement_is_the_types_zero_value_and_decodes_as_the_type() -> None:
    n = Nested(ride=Ride(station="s", duration_s=2), count=3, note="n", by_key={"a": 1})
    ack = n.new_acknowledgement(JOURNAL)
    assert ack == Nested(ride=Ride(station="", duration_s=0.0), count=0, note=None, by_key={})
    ack.set_uuid(build_uuid(A, 5, ACK_TXN))
    framing = message_framing(Nested, JSONFraming())
    (back,) = framing.decode(framing.marshal(ack)).values
    assert back == ack and get_flags(back.get_uuid()) == ACK_TXN


def test_a_type_without_a_zero_value_names_the_field_when_acknowledged() -> None:
    msg = Stamped(at=datetime.datetime(2026, 1, 1))
    with pytest.raises(MessageError, match=r"Stamped\.at"):
        msg.new_acknowledgement(JOURNAL)


def test_a_frozen_message_is_stamped_by_the_publisher_path() -> None:
    class Frozen(TypedMessage, frozen=True):
        n: int

    m = Frozen(n=1)
    m.set_uuid_int(0x1234)
    assert m.uuid_int == 0x1234

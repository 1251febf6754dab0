"""JSONMessage decoding in batches: the bulk UUID checks of ``from_json_many`` accept and
reject exactly what a text-by-text parse does, and the UUID fields handed to the Sequencer
are those of each message."""

from __future__ import annotations

import re
import uuid as std_uuid
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.message import JSONMessage, MessageDecodeError, build_uuid
from gazette.message.message import MessageBatch
from gazette.message.uuid import uuid_columns_of_ints

CANONICAL = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

valid_texts = st.tuples(st.integers(0, (1 << 128) - 1), st.booleans()).map(
    lambda t: str(std_uuid.UUID(int=t[0])).upper() if t[1] else str(std_uuid.UUID(int=t[0]))
)


@st.composite
def damaged_texts(draw: st.DrawFn) -> str:
    text = draw(valid_texts)
    i = draw(st.integers(0, len(text)))
    c = draw(st.sampled_from(["-", "/", "g", " ", "_", "+", "٣", "\n", "", "00", "G", "é"]))
    how = draw(st.sampled_from(["replace", "insert", "delete"]))
    if how == "replace":
        return text[:i] + c + text[i + 1 :]
    if how == "insert":
        return text[:i] + c + text[i:]
    return text[:i] + text[i + 1 :]


uuid_values = st.one_of(
    valid_texts,
    valid_texts,
    damaged_texts(),
    st.none(),
    st.just("00000000-0000-0000-0000-000000000000"),
    st.integers(),
    st.lists(st.integers(), max_size=1),
)
MISSING = object()


@st.composite
def json_values(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["dict"] * 8 + ["other", "subclass"]))
    if kind == "other":
        return draw(st.sampled_from([[], "x", 1, None]))
    doc: dict[str, Any] = {"n": draw(st.integers(0, 9))}
    text = draw(st.one_of(uuid_values, st.just(MISSING)))
    if text is not MISSING:
        doc["UUID"] = text
    return OrderedDict(doc) if kind == "subclass" else doc


def reference(value: Any) -> int:
    """What a text-by-text decode makes of one value: its UUID integer, or raise."""
    if type(value) is not dict:
        raise MessageDecodeError("not an object")
    text = value.get("UUID")
    if text is None:
        return 0
    if type(text) is not str or not CANONICAL.fullmatch(text):
        raise MessageDecodeError("bad UUID")
    return int(text.replace("-", ""), 16)


@given(st.lists(json_values(), max_size=12))
def test_from_json_many_agrees_with_a_text_by_text_parse(values: list[Any]) -> None:
    try:
        expect = [reference(v) for v in values]
    except MessageDecodeError:
        with pytest.raises(MessageDecodeError):
            JSONMessage.from_json_many(values)
        return
    msgs = JSONMessage.from_json_many(iter(values))
    assert isinstance(msgs, MessageBatch)
    assert [m.doc for m in msgs] == values and all(
        m.doc is v for m, v in zip(msgs, values, strict=True)
    )
    assert [m.uuid_int for m in msgs] == expect
    if msgs.uuids is not None:
        assert msgs.uuids == uuid_columns_of_ints(expect)


V = "e4f71ec1-cc50-11e9-aaaa-8badf00d4242"


@pytest.mark.parametrize(
    "texts",
    [
        # 35 + 37 characters, dashes still every 37 of the joined texts, 64 hex digits.
        [V[:-1], "a" + V],
        # A dash for a digit in each: 62 hex digits (an even count).
        ["-" + V[1:], "-" + V[1:]],
        # A digit for the last dash, a dash for a digit: 64 hex digits, 8 dashes.
        [V[:23] + "a" + V[24:], "-" + V[1:]],
        [V[:8] + "a" + V[9:], V[:30] + "-" + V[31:]],
        [V, V + "/" + V],
        [V[:-2], V + "ab"],
    ],
)
def test_from_json_many_rejects_texts_that_only_add_up(texts: list[str]) -> None:
    """Bad texts whose flaws compensate over the batch (lengths, dash counts)."""
    values = [{"UUID": t} for t in texts]
    with pytest.raises(MessageDecodeError):
        reference(values[0]) if not CANONICAL.fullmatch(texts[0]) else reference(values[1])
    with pytest.raises(MessageDecodeError):
        JSONMessage.from_json_many(values)


def test_from_json_many_hands_over_uuid_fields() -> None:
    producer = b"\x01\x02\x03\x04\x05\x06"
    uuids = [build_uuid(producer, (1 << 60) + 16 * i + i % 16, i % 3) for i in range(50)]
    values: list[dict[str, Any]] = [{"UUID": str(u), "i": i} for i, u in enumerate(uuids)]
    values[7] = {"i": 7}  # No UUID: the zero UUID.
    msgs = JSONMessage.from_json_many(values)
    ints = [0 if i == 7 else u.int for i, u in enumerate(uuids)]
    assert msgs.uuids == uuid_columns_of_ints(ints)
    assert [m.uuid_int for m in msgs] == ints
    assert msgs[3].get_uuid() == uuids[3] and msgs[3]["i"] == 3


def test_from_json_many_errors_name_the_problem() -> None:
    good = str(build_uuid(b"\x01" * 6, 1 << 60, 0))
    with pytest.raises(MessageDecodeError, match="expected a JSON object, got list"):
        JSONMessage.from_json_many([{"UUID": good}, []])
    with pytest.raises(MessageDecodeError, match="got OrderedDict"):
        JSONMessage.from_json_many([OrderedDict(UUID=good)])
    with pytest.raises(MessageDecodeError, match="not a canonical UUID: 'x'"):
        JSONMessage.from_json_many([{"UUID": good}, {"UUID": "x"}])
    with pytest.raises(MessageDecodeError, match="not a canonical UUID: 12"):
        JSONMessage.from_json_many([{"UUID": 12}])


def test_set_uuid_keeps_text_and_integer_in_step() -> None:
    msg = JSONMessage.from_json_many([{"a": 1}])[0]
    assert msg.uuid_int == 0
    u = build_uuid(b"\xab" * 6, 12345 << 4, 2)
    msg.set_uuid(u)
    assert msg.doc == {"a": 1, "UUID": str(u)} and msg.uuid_int == u.int
    assert msg.get_uuid() == u
    assert JSONMessage(dict(msg.doc)).uuid_int == u.int

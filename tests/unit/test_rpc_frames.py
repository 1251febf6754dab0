"""The pure codecs of :mod:`gazette.rpc.frames`.

Cases: HTTP/2 frames and gRPC length-prefixed messages come out of their readers exactly as
they went in, however the byte stream is cut (hypothesis), and the readers refuse frames and
messages over their limits or flagged as compressed; padding and priority fields are
stripped; SETTINGS parse; ``grpc-timeout`` round-trips within its unit and refuses malformed
values; ``grpc-message`` percent-encoding round-trips any text; the header blocks we send
(trailers, request headers) decode with an independent HPACK decoder (the ``hpack``
library) to the expected fields and never touch its dynamic table.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import grpc
import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.rpc import frames as f

Frame = tuple[int, int, int, bytes]

frames_st = st.lists(
    st.tuples(
        st.integers(0, 255),                 # type (unknown types included)
        st.integers(0, 255),                 # flags
        st.integers(0, (1 << 31) - 1),       # stream id
        st.binary(max_size=300),
    ),
    max_size=12,
)


def cut(data: bytes, points: Sequence[int]) -> Iterator[bytes]:
    """``data`` in chunks cut at ``points`` (taken modulo its length; empty chunks too)."""
    at = 0
    for p in sorted(p % (len(data) + 1) for p in points):
        yield data[at:p]
        at = p
    yield data[at:]


def decode_block(block: bytes) -> list[tuple[str, str]]:
    """``block`` decoded by a fresh ``hpack`` decoder, which must be left without dynamic
    entries (we only send literals without indexing)."""
    decoder = hpack.Decoder()
    decoder.max_header_list_size = 4 << 20
    headers = [(str(k), str(v)) for k, v in decoder.decode(block)]
    assert not decoder.header_table.dynamic_entries
    return headers


# -- FrameReader --------------------------------------------------------------------------


@given(frames=frames_st, points=st.lists(st.integers(0, 1 << 16), max_size=20))
def test_frame_reader_yields_the_frames_fed_however_cut(frames: list[Frame], points: list[int]) -> None:
    data = b"".join(f.frame(t, fl, sid, payload) for t, fl, sid, payload in frames)
    reader = f.FrameReader(max_frame=300)
    got: list[tuple[int, int, int, memoryview]] = []
    for chunk in cut(data, points):
        got.extend(reader.feed(chunk))
    # The payloads are kept until the end: later feeds must not have changed them.
    assert [(t, fl, sid, bytes(p)) for t, fl, sid, p in got] == frames


@given(sid=st.integers(0, (1 << 31) - 1), payload=st.binary(max_size=40))
def test_frame_reader_ignores_the_reserved_stream_id_bit(sid: int, payload: bytes) -> None:
    data = f.frame(f.DATA, f.END_STREAM, sid | (1 << 31), payload)
    assert [(t, fl, s, bytes(p)) for t, fl, s, p in f.FrameReader().feed(data)] == [
        (f.DATA, f.END_STREAM, sid, payload)]


def test_frame_head_matches_frame() -> None:
    payload = bytes(range(200)) * 100
    assert f.frame_head(f.DATA, f.END_STREAM, 7, len(payload)) + payload == f.frame(f.DATA, f.END_STREAM, 7, payload)


@given(split=st.integers(0, 8))
def test_frame_reader_refuses_an_oversized_frame_on_its_head(split: int) -> None:
    reader = f.FrameReader(max_frame=100)
    assert list(reader.feed(f.frame(f.PING, 0, 0, b"x" * 100))) == [(f.PING, 0, 0, memoryview(b"x" * 100))]
    head = f.frame_head(f.DATA, 0, 1, 101)  # only the head: refused before any payload
    assert list(reader.feed(head[:split])) == []
    with pytest.raises(f.ProtocolError) as err:
        list(reader.feed(head[split:]))
    assert err.value.code == f.FRAME_SIZE_ERROR


def test_control_frames_parse_back() -> None:
    data = (f.window_update(3, 12345) + f.rst_stream(5, f.CANCEL)
            + f.goaway(9, f.ENHANCE_YOUR_CALM, b"calm") + f.settings_frame({f.SETTINGS_ENABLE_PUSH: 0}))
    got = list(f.FrameReader().feed(data))
    assert [(t, fl, sid) for t, fl, sid, _ in got] == [
        (f.WINDOW_UPDATE, 0, 3), (f.RST_STREAM, 0, 5), (f.GOAWAY, 0, 0), (f.SETTINGS, 0, 0)]
    assert f.u32(got[0][3]) == 12345
    assert f.u32(got[1][3]) == f.CANCEL
    assert (f.u32(got[2][3]), f.u32(got[2][3], 4), bytes(got[2][3][8:])) == (9, f.ENHANCE_YOUR_CALM, b"calm")
    assert f.parse_settings(got[3][3]) == [(f.SETTINGS_ENABLE_PUSH, 0)]


# -- MessageReader ------------------------------------------------------------------------


@given(messages=st.lists(st.binary(max_size=200), max_size=12),
       points=st.lists(st.integers(0, 1 << 16), max_size=20))
def test_message_reader_yields_the_messages_fed_however_cut(messages: list[bytes], points: list[int]) -> None:
    data = b"".join(f.message_prefix(len(m)) + m for m in messages)
    boundaries = {0}
    at = 0
    for m in messages:
        at += 5 + len(m)
        boundaries.add(at)
    reader = f.MessageReader(max_message=200)
    got: list[memoryview] = []
    fed = 0
    for chunk in cut(data, points):
        got.extend(reader.feed(memoryview(chunk)))
        fed += len(chunk)
        assert reader.partial == (fed not in boundaries), f"after {fed} of {len(data)} bytes"
    assert [bytes(m) for m in got] == messages
    assert not reader.partial


@given(split=st.integers(0, 4))
def test_message_reader_refuses_an_oversized_message_on_its_prefix(split: int) -> None:
    reader = f.MessageReader(max_message=10)
    assert [bytes(m) for m in reader.feed(memoryview(f.message_prefix(10) + b"0123456789"))] == [b"0123456789"]
    prefix = f.message_prefix(11)
    assert reader.feed(memoryview(prefix[:split])) == []
    with pytest.raises(f.ProtocolError):
        reader.feed(memoryview(prefix[split:]))


@given(split=st.integers(0, 4))
def test_message_reader_refuses_compressed_messages(split: int) -> None:
    reader = f.MessageReader(max_message=100)
    prefix = b"\x01" + f.message_prefix(3)[1:]
    assert reader.feed(memoryview(prefix[:split])) == []
    with pytest.raises(f.ProtocolError):
        reader.feed(memoryview(prefix[split:] + b"abc"))


# -- padding, settings ----------------------------------------------------------------------


@given(content=st.binary(max_size=100), pad=st.integers(0, 255), priority=st.binary(min_size=5, max_size=5))
def test_strip_padding(content: bytes, pad: int, priority: bytes) -> None:
    padding = b"\0" * pad
    view = memoryview
    assert bytes(f.strip_padding(0, view(content), priority=True)) == content
    assert bytes(f.strip_padding(f.PADDED, view(bytes([pad]) + content + padding), priority=False)) == content
    assert bytes(f.strip_padding(f.PADDED, view(bytes([pad]) + content + padding), priority=True)) == content
    assert bytes(f.strip_padding(f.PRIORITY_FLAG, view(priority + content), priority=True)) == content
    both = f.PADDED | f.PRIORITY_FLAG
    assert bytes(f.strip_padding(both, view(bytes([pad]) + priority + content + padding), priority=True)) == content
    # DATA frames have no priority fields: the flag means nothing there.
    assert bytes(f.strip_padding(f.PRIORITY_FLAG, view(priority + content), priority=False)) == priority + content


@given(pad=st.integers(1, 255), content=st.binary(max_size=100))
def test_strip_padding_refuses_padding_beyond_the_payload(pad: int, content: bytes) -> None:
    short = content[:pad - 1]  # fewer bytes than the padding claims
    with pytest.raises(f.ProtocolError):
        f.strip_padding(f.PADDED, memoryview(bytes([pad]) + short), priority=False)
    with pytest.raises(f.ProtocolError):
        f.strip_padding(f.PADDED | f.PRIORITY_FLAG, memoryview(bytes([pad]) + b"\0" * 5 + short), priority=True)


def test_strip_padding_refuses_missing_fields() -> None:
    with pytest.raises(f.ProtocolError):
        f.strip_padding(f.PADDED, memoryview(b""), priority=False)
    with pytest.raises(f.ProtocolError):
        f.strip_padding(f.PRIORITY_FLAG, memoryview(b"\0" * 4), priority=True)


@given(pairs=st.dictionaries(st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF), max_size=10))
def test_settings_round_trip(pairs: dict[int, int]) -> None:
    [(ftype, flags, sid, payload)] = list(f.FrameReader().feed(f.settings_frame(pairs)))
    assert (ftype, flags, sid) == (f.SETTINGS, 0, 0)
    assert f.parse_settings(payload) == list(pairs.items())


@given(n=st.integers(0, 40).filter(lambda n: n % 6 != 0))
def test_settings_of_a_bad_length_are_refused(n: int) -> None:
    with pytest.raises(f.ProtocolError) as err:
        f.parse_settings(memoryview(b"\0" * n))
    assert err.value.code == f.FRAME_SIZE_ERROR


# -- grpc-timeout ---------------------------------------------------------------------------

_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def timeout_value(seconds: float) -> str:
    [(name, value)] = decode_block(f.timeout_header(seconds))
    assert name == "grpc-timeout"
    assert re.fullmatch(r"[0-9]{1,8}[HMSmun]", value), value
    return value


@given(seconds=st.floats(min_value=0.0, max_value=99_999_999.0, allow_nan=False))
def test_timeout_round_trips_within_its_unit(seconds: float) -> None:
    value = timeout_value(seconds)
    unit = _UNITS[value[-1]]
    parsed = f.parse_timeout(value)
    assert parsed == int(value[:-1]) * unit
    # Rounded down to the unit (but never to zero), up to float error in the conversion.
    slack = 1e-9 * max(seconds, 1.0)
    assert parsed <= max(seconds, 1e-6) + slack
    assert seconds - parsed < unit + slack


@pytest.mark.parametrize(("seconds", "value"), [
    (0.0, "1u"), (-3.0, "1u"), (1e-9, "1u"), (0.5, "500000u"), (99.999999, "99999999u"),
    (100.0, "100000m"), (99_999.0, "99999000m"), (100_000.0, "100000S"), (1e12, "99999999S"),
])
def test_timeout_units(seconds: float, value: str) -> None:
    assert timeout_value(seconds) == value


@pytest.mark.parametrize(("value", "seconds"), [
    ("1H", 3600.0), ("2M", 120.0), ("3S", 3.0), ("4m", 4e-3), ("5u", 5e-6), ("6n", 6e-9),
    ("99999999S", 99_999_999.0), ("0S", 0.0),
])
def test_parse_timeout(value: str, seconds: float) -> None:
    assert f.parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [
    "", "S", "10", "10x", "10s", "-1S", "+1S", "1.5S", " 1S", "1S ", "1 S", "123456789S", "0x1S", "1e3m",
])
def test_parse_timeout_refuses_malformed_values(value: str) -> None:
    with pytest.raises(ValueError):
        f.parse_timeout(value)


@given(value=st.text(alphabet=st.characters(codec="ascii"), max_size=12))
def test_parse_timeout_accepts_exactly_the_grammar(value: str) -> None:
    if re.fullmatch(r"[0-9]{1,8}[HMSmun]", value):
        assert f.parse_timeout(value) == int(value[:-1]) * _UNITS[value[-1]]
    else:
        with pytest.raises(ValueError):
            f.parse_timeout(value)


@pytest.mark.parametrize("value", ["\uff11S", "\u0663m"])  # FULLWIDTH ONE, ARABIC-INDIC THREE
def test_parse_timeout_refuses_non_ascii_digits(value: str) -> None:
    with pytest.raises(ValueError):
        f.parse_timeout(value)


# -- grpc-message ---------------------------------------------------------------------------


@given(text=st.text())
def test_message_text_round_trips(text: str) -> None:
    encoded = f.encode_message_text(text)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded), encoded
    assert f.decode_message_text(encoded) == text
    # Printable ASCII but '%' passes through unchanged.
    if all(0x20 <= ord(c) <= 0x7E and c != "%" for c in text):
        assert encoded == text


def test_message_text_encodings() -> None:
    assert f.encode_message_text("100% ünï\n") == "100%25 %C3%BCn%C3%AF%0A"
    assert f.decode_message_text("bad %zz and %C3") == "bad %zz and \ufffd"


# -- header blocks --------------------------------------------------------------------------


@given(code=st.sampled_from(list(grpc.StatusCode)), details=st.text(max_size=300), with_headers=st.booleans())
def test_trailers_decode_with_hpack(code: grpc.StatusCode, details: str, with_headers: bool) -> None:
    headers = decode_block(f.trailers(code, details, with_headers))
    expect = [(":status", "200"), ("content-type", "application/grpc")] if with_headers else []
    expect.append(("grpc-status", str(code.value[0])))
    if details:
        expect.append(("grpc-message", f.encode_message_text(details)))
    assert headers == expect
    if details:
        assert f.decode_message_text(headers[-1][1]) == details


header_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=300)


@given(path=header_text, authority=header_text, user_agent=header_text)
def test_request_headers_decode_with_hpack(path: str, authority: str, user_agent: str) -> None:
    assert decode_block(f.request_headers(path, authority, user_agent)) == [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", user_agent)]


@settings(max_examples=20)
@given(n=st.integers(0, 1 << 20))
def test_long_literals_decode_with_hpack(n: int) -> None:
    value = "v" * n
    assert decode_block(f.literal("x-long", value)) == [("x-long", value)]
    assert decode_block(f.literal(4, value)) == [(":path", value)]


def test_status_code() -> None:
    for code in grpc.StatusCode:
        assert f.status_code(code.value[0]) is code
    assert f.status_code(17) is grpc.StatusCode.UNKNOWN
    assert f.status_code(1000) is grpc.StatusCode.UNKNOWN

"""Framings: how messages are laid out as bytes in a journal, selected by content-type.

A Framing turns messages into frames (:meth:`~Framing.marshal`) and splits a buffer of
journal content holding many frames back into them (:meth:`~Framing.unpack`,
:meth:`~Framing.decode`). Three are registered, as in Gazette:

* ``application/x-ndjson`` (:class:`JSONFraming`): one JSON document per line.
* ``application/x-protobuf-fixed`` (:class:`FixedFraming`): the magic word
  ``66 33 93 36``, a 4-byte little-endian payload length, then the payload.
* ``text/csv`` (:class:`CSVFraming`): one RFC 4180 record per frame (quoted fields may
  span lines), the message UUID in the first column.

Invariants:

* Splitting works on whole buffers with C-level scans (``bytes.split``/``find``, msgspec,
  the stdlib JSON scanner, ``struct.unpack_from``, the csv module), never byte by byte.
* JSON lines encode to exactly the bytes the standard library's encoder writes (compact
  separators, ``ensure_ascii``, ``repr`` floats, ``NaN``/``Infinity``, insertion order) and
  decode to exactly what ``json.loads(line.decode())`` returns for each line, or fail where
  it fails, with its message (a line is UTF-8: a byte order mark, UTF-16 or encoded
  surrogates make it invalid, as for Go's decoder); msgspec does the work and the stdlib redoes what msgspec would do otherwise.
  Two deliberate differences: a value of a type the stdlib refuses but msgspec encodes (a
  ``datetime``, ``UUID``, ``Decimal``, ``bytes``, ``set``, ``Enum``, dataclass or Struct) is
  encoded as msgspec encodes it rather than raising FramingError; and a dict key that is a
  float written with an exponent or not finite is spelled as msgspec spells it (``"1e16"``,
  not ``"1e+16"``; ``"nan"``, not ``"NaN"``).
* ``unpack``/``decode`` consume only whole frames: ``consumed`` is the end of the last
  frame (or skipped span) returned, and the caller keeps ``buffer[consumed:]`` for the next
  call. ``ends[i]`` is the offset just past frame ``i`` relative to the buffer start, and
  frame ``i`` begins where frame ``i - 1`` ended (or at 0).
* A span that is not a valid frame never stops the scan: it is returned in place of a
  frame as a :class:`~gazette.message.errors.FramingError` instance (``errors`` counts
  them), so frames after it are still delivered.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import json.scanner
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, count, repeat
from operator import add, is_
from typing import Any, Final, Protocol

from gazette._compiled import mypyc_attr

from .errors import DesyncError, FramingError, MessageDecodeError, UnknownContentTypeError
from .message import JSONMessage

__all__ = [
    "CONTENT_TYPE",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "CSVFraming",
    "Decoded",
    "FixedFraming",
    "Framing",
    "JSONFraming",
    "StdlibJSONFraming",
    "Unpacked",
    "framing_for_content_type",
    "register_framing",
]

#: The journal label naming the content-type of its messages.
CONTENT_TYPE: Final = "content-type"
CONTENT_TYPE_CSV: Final = "text/csv"
CONTENT_TYPE_JSON_LINES: Final = "application/x-ndjson"
CONTENT_TYPE_PROTO_FIXED: Final = "application/x-protobuf-fixed"

FIXED_FRAME_WORD: Final = b"\x66\x33\x93\x36"
FIXED_FRAME_HEADER_LENGTH: Final = 8


@dataclass(slots=True)
class Unpacked:
    """Whole frames split from the start of a buffer."""

    #: Each frame's payload (without header or delimiter), or the error standing in for a
    #: span that is not a frame.
    frames: list[bytes | FramingError] = field(default_factory=list)
    #: ``ends[i]`` is the offset just past frame ``i``, relative to the buffer start.
    ends: list[int] = field(default_factory=list)
    #: Bytes of the buffer covered by the returned frames.
    consumed: int = 0
    #: How many entries of ``frames`` are errors.
    errors: int = 0


@dataclass(slots=True)
class Decoded:
    """Whole frames split from the start of a buffer and decoded into raw values."""

    #: Each frame's raw value (a JSON value, payload bytes, or a CSV record), or the error
    #: standing in for a frame that does not decode.
    values: list[Any] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    consumed: int = 0
    errors: int = 0


class Framing(Protocol):
    """How messages are encoded within a journal of a given content-type."""

    @property
    def content_type(self) -> str:
        """The content-type this framing serves."""
        ...

    def marshal(self, msg: Any) -> bytes:
        """One complete frame of ``msg``."""
        ...

    def marshal_many(self, msgs: Iterable[Any]) -> bytes:
        """The concatenated frames of ``msgs``, built in one pass."""
        ...

    def unpack(self, buffer: bytes, final: bool = False) -> Unpacked:
        """Split the whole frames at the start of ``buffer``.

        With ``final`` the buffer is known to end the content, which lets a framing accept
        a trailer it tolerates (FixedFraming's lone newline).
        """
        ...

    def unmarshal(self, frame: bytes) -> Any:
        """The raw value of one frame payload; raises MessageDecodeError if invalid."""
        ...

    def decode(self, buffer: bytes, final: bool = False) -> Decoded:
        """Split and decode the whole frames at the start of ``buffer`` in one batch."""
        ...


# Sentinel tokens for JSONFraming._decode_array, with the (singleton) values they parse to,
# each after a letter of it that is rare in JSON text.
_SENTINELS: Final = (("l", "null", None), ("r", "true", True), ("f", "false", False))


def _sentinel_absent_from(text: str) -> tuple[str, Any] | None:
    for letter, token, value in _SENTINELS:
        # A letter of the token is searched first (memchr), the token itself only if that
        # letter is in the text.
        if letter not in text or token not in text:
            return token, value
    return None


def _accumulate_ends(lengths: Iterable[int], start: int = 0) -> list[int]:
    """Running ends of consecutive spans, each followed by a one-byte delimiter."""
    ends = list(itertools.accumulate(lengths, lambda acc, n: acc + n + 1, initial=start))
    del ends[0]
    return ends


def _stdlib_identical(out: bytes) -> bool:
    """Whether msgspec's JSON ``out`` (one document, or lines of them) is byte for byte
    what the stdlib encoder writes for the same values (False may be wrong, True never is).

    msgspec's output differs only in: non-ASCII characters and DEL, which it writes raw
    (``ensure_ascii`` escapes them); floats written with an exponent (``1e16``, ``1e-7``,
    where ``repr`` writes ``1e+16``, ``1e-07``) or below 1e-4 written without one
    (``0.00001``, ``repr``: ``1e-05``); NaN and infinities, written ``null`` (the stdlib:
    ``NaN``, ``Infinity``). Number tokens and ``null`` are looked for outside strings only
    (strings cut out at their quotes, once escapes are dropped), so a digit before an ``e``
    in a UUID's hex does not count. Dict keys made from floats are strings in the output
    and are not checked (the module docstring states the difference).

    String operations on the whole text (str's cost less per call than bytes' here).
    Measured, and slower: scanning the text for anything that could be such a float
    (``e``, optional ``-``, digits, then a delimiter) before cutting strings out, which
    searches for patterns starting with the commonest letter of JSON text.
    """
    text = out.decode()
    if not text.isascii() or "\x7f" in text:
        return False
    if "\\" in text:
        # Every backslash in JSON output starts an escape: drop escaped backslashes, then
        # escaped quotes, and the quotes left are the strings' own.
        text = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(text.split('"')[0::2])
    # Outside strings an "e" is in true, false, or a float's exponent.
    return ("null" not in outside and "0.0000" not in outside
            and "e" not in outside.replace("true", "").replace("false", ""))


#: The MessagePack type byte of a float64, which msgspec writes for every float.
_FLOAT64: Final = b"\xcb"


def _ascii_identical(out: bytes) -> bool:
    """:func:`_stdlib_identical` for the JSON of values holding no float: all that can then
    differ is a non-ASCII character or DEL."""
    text = out.decode()
    return text.isascii() and "\x7f" not in text


# Subclassed by StdlibJSONFraming here and typed.py's StructJSONFraming.
@mypyc_attr(allow_interpreted_subclasses=True)
class JSONFraming:
    """Newline-delimited JSON: each frame is one JSON document followed by ``\\n``.

    Encodes and decodes through msgspec's C code, producing and accepting exactly what the
    standard library's ``json`` does (compact separators, ``ensure_ascii``, ``repr`` floats,
    insertion key order): a value whose msgspec encoding may differ is encoded again by the
    stdlib encoder, and a line msgspec refuses is parsed again by ``json.loads`` (of the line
    read as UTF-8), which also words the error. :class:`StdlibJSONFraming` is the standard
    library alone (the reference the tests compare against).
    """

    content_type: Final = CONTENT_TYPE_JSON_LINES

    def __init__(self) -> None:
        self._encoder = json.JSONEncoder(separators=(",", ":"))
        self._encode = self._encoder.encode
        self._new_c_encoder()
        # The C scanner behind json.loads: parses one value starting at an index and
        # reports where it ended, which lets one call per message find both boundaries.
        self._scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
        # msgspec imported here, not with the module: gazette.message stays as cheap to
        # import as it was (msgspec costs ~27 ms, measured), until a JSON framing is made.
        import msgspec  # noqa: PLC0415

        #: What msgspec may raise encoding a value the stdlib encoder takes differently (a
        #: bool or None dict key, a str or float subclass, a lone surrogate, a cycle...).
        self._encode_errors = (TypeError, ValueError, OverflowError, RecursionError,
                               msgspec.EncodeError)
        #: What msgspec may raise decoding a line that json.loads may yet accept (NaN, a
        #: lone surrogate escape, a number out of a float's range...).
        self._decode_errors = (ValueError, RecursionError, msgspec.DecodeError)
        ms_encoder = msgspec.json.Encoder()
        self._ms_encode = ms_encoder.encode
        self._ms_encode_lines = ms_encoder.encode_lines
        self._ms_pack = msgspec.msgpack.Encoder().encode
        self._ms_decode = msgspec.json.Decoder().decode

    def marshal(self, msg: Any) -> bytes:
        # Once per message published: the common cases inlined.
        value: Any  # not the first binding's dict: compiled, a name keeps that type
        if type(msg) is JSONMessage:
            value = msg.doc
        else:
            json_line = getattr(msg, "json_line", None)
            if json_line is not None:
                return json_line()  # type: ignore[no-any-return]  # a TypedMessage: msgspec
            value = self._json_value(msg)
        # _line inlined (a call costs here).
        try:
            out = self._ms_encode(value)
            floats = self._ms_pack(value).find(_FLOAT64) >= 0
        except self._encode_errors:
            return self._stdlib_line(value, msg)
        if _stdlib_identical(out) if floats else _ascii_identical(out):
            return out + b"\n"
        return self._stdlib_line(value, msg)

    def _line(self, value: Any, msg: Any) -> bytes:
        """The frame of ``value`` (the JSON value of ``msg``).

        Whether ``value`` holds a float is told by its MessagePack encoding (in C, cheaper
        than cutting the strings out of the JSON, measured): without a float byte 0xCB it
        holds none (0xCB also occurs as a length or an integer's byte: then the full check
        runs, needlessly but rightly), and only the ASCII check is needed.
        """
        try:
            out = self._ms_encode(value)
            floats = self._ms_pack(value).find(_FLOAT64) >= 0
        except self._encode_errors:
            return self._stdlib_line(value, msg)
        if _stdlib_identical(out) if floats else _ascii_identical(out):
            return out + b"\n"
        return self._stdlib_line(value, msg)

    def marshal_many(self, msgs: Iterable[Any]) -> bytes:
        if type(msgs) is not list:
            msgs = list(msgs)
        if not msgs:
            return b""
        json_lines = getattr(type(msgs[0]), "json_lines", None)
        # Messages of one TypedMessage type are encoded in one msgspec call.
        if json_lines is not None and all(type(m) is type(msgs[0]) for m in msgs):
            return json_lines(msgs)  # type: ignore[no-any-return]
        value = self._json_value
        values = [m.doc if type(m) is JSONMessage else value(m) for m in msgs]
        # One call for the batch, one check of its bytes; if that fails, message by message
        # (each through msgspec or, where it must, the stdlib encoder).
        try:
            out = self._ms_encode_lines(values)
            floats = self._ms_pack(values).find(_FLOAT64) >= 0
        except self._encode_errors:
            pass
        else:
            if _stdlib_identical(out) if floats else _ascii_identical(out):
                return out
        return b"".join(list(map(self._line, values, msgs)))

    def unmarshal(self, frame: bytes) -> Any:
        try:
            return self._ms_decode(frame)
        except self._decode_errors:
            value = self._loads_utf8(frame)
        if isinstance(value, MessageDecodeError):
            raise value
        return value

    def decode(self, buffer: bytes, final: bool = False) -> Decoded:
        end = buffer.rfind(b"\n") + 1
        if end == 0:
            return Decoded()
        lines = buffer[: end - 1].split(b"\n")
        # ends[i] = (lengths of lines 0..i) + (i + 1) newlines.
        ends = list(map(add, accumulate(map(len, lines)), count(1)))
        # A line at a time (one msgspec call each: cheaper, measured, than one call over
        # the lines joined into an array), so no document can span lines.
        try:
            return Decoded(list(map(self._ms_decode, lines)), ends, end, 0)
        except self._decode_errors:
            pass
        values = list(map(self._decode_line, lines))
        errors = sum(isinstance(v, MessageDecodeError) for v in values)
        return Decoded(values, ends, end, errors)

    def _decode_line(self, line: bytes) -> Any:
        try:
            return self._ms_decode(line)
        except self._decode_errors:
            return self._loads_utf8(line)

    @staticmethod
    def _loads_utf8(line: bytes) -> Any:
        """``json.loads`` of the line read as UTF-8 (strictly: not as ``json.loads`` reads
        bytes, which would take a byte order mark, UTF-16 or UTF-32, or encoded surrogates),
        or the MessageDecodeError standing for it."""
        try:
            return json.loads(line.decode())
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError.
            return MessageDecodeError(f"invalid JSON message: {err}")

    # -- the standard library's codec: the reference, and the fallback ---------------------

    def _json_value(self, msg: Any) -> Any:
        to_json = getattr(msg, "to_json", None)
        return to_json() if to_json is not None else msg

    def _new_c_encoder(self) -> None:
        # JSONEncoder.encode builds the C encoder anew at every call, which costs about as
        # much as encoding a small message: build it once (with the encoder's settings). Its
        # cycle-detection markers may be left dirty by a failed call, so a failure rebuilds it.
        c_make = getattr(json.encoder, "c_make_encoder", None)
        e = self._encoder
        self._c_encode: Callable[[Any, int], Sequence[str]] | None = None if c_make is None \
            else c_make({}, e.default, json.encoder.encode_basestring_ascii, None,
                        e.key_separator, e.item_separator, e.sort_keys, e.skipkeys, e.allow_nan)

    def _stdlib_marshal(self, msg: Any) -> bytes:
        # Once per message published: the common cases inlined.
        value: Any  # not the first binding's dict: compiled, a name keeps that type
        if type(msg) is JSONMessage:
            value = msg.doc
        else:
            json_line = getattr(msg, "json_line", None)
            if json_line is not None:
                return json_line()  # type: ignore[no-any-return]  # a TypedMessage: msgspec
            value = self._json_value(msg)
        return self._stdlib_line(value, msg)

    def _stdlib_line(self, value: Any, msg: Any) -> bytes:
        c_encode = self._c_encode
        try:
            text = self._encode(value) if c_encode is None else "".join(c_encode(value, 0))
        except (TypeError, ValueError) as err:
            self._new_c_encoder()
            raise FramingError(f"cannot encode {type(msg).__name__} as JSON: {err}") from err
        return (text + "\n").encode()

    def _stdlib_marshal_many(self, msgs: Iterable[Any]) -> bytes:
        if type(msgs) is not list:
            msgs = list(msgs)
        if msgs:
            json_lines = getattr(type(msgs[0]), "json_lines", None)
            # Messages of one TypedMessage type are encoded in one msgspec call.
            if json_lines is not None and all(type(m) is type(msgs[0]) for m in msgs):
                return json_lines(msgs)  # type: ignore[no-any-return]
        c_encode, join, value = self._c_encode, "".join, self._json_value
        try:
            if c_encode is None:
                texts = [self._encode(value(m)) for m in msgs]
            else:
                texts = [
                    join(c_encode(m.doc if type(m) is JSONMessage else value(m), 0)) for m in msgs
                ]
        except (TypeError, ValueError) as err:
            self._new_c_encoder()
            raise FramingError(f"cannot encode message as JSON: {err}") from err
        if not texts:
            return b""
        texts.append("")
        return "\n".join(texts).encode()

    def unpack(self, buffer: bytes, final: bool = False) -> Unpacked:
        end = buffer.rfind(b"\n") + 1
        if end == 0:
            return Unpacked()
        frames: list[bytes | FramingError] = list(buffer[: end - 1].split(b"\n"))
        return Unpacked(frames, _accumulate_ends(map(len, frames)), end, 0)  # type: ignore[arg-type]

    def _stdlib_unmarshal(self, frame: bytes) -> Any:
        try:
            return json.loads(frame)
        except (ValueError, UnicodeDecodeError) as err:
            raise MessageDecodeError(f"invalid JSON message: {err}") from err

    def _stdlib_decode(self, buffer: bytes, final: bool = False) -> Decoded:
        end = buffer.rfind(b"\n") + 1
        if end == 0:
            return Decoded()
        whole = buffer if end == len(buffer) else buffer[:end]
        try:
            text = whole.decode()
        except UnicodeDecodeError:
            return self._decode_lines(whole)
        parsed = self._decode_array(text)
        if parsed is not None:
            lines = parsed[1]
            if text.isascii():
                lengths = map(len, lines)
            else:
                lengths = map(len, whole[:-1].split(b"\n"))
            # ends[i] = (lengths of lines 0..i) + (i + 1) newlines.
            return Decoded(parsed[0], list(map(add, accumulate(lengths), count(1))), end, 0)
        values: list[Any] = []
        char_ends: list[int] = []
        add_value, add_end = values.append, char_ends.append
        scan = self._scan
        pos, size, errors = 0, len(text), 0
        while pos < size:
            try:
                value, stop = scan(text, pos)
                if text[stop] != "\n":
                    raise StopIteration(stop)
                stop += 1
            except (StopIteration, ValueError, RecursionError):
                # Not a bare document followed by a newline: take the whole line the slow
                # way, which tolerates surrounding whitespace and names what is wrong.
                stop = text.find("\n", pos) + 1
                value = self._loads_line(text[pos:stop])
                errors += isinstance(value, MessageDecodeError)
            add_value(value)
            add_end(stop)
            pos = stop

        if len(values) != text.count("\n"):
            # A document spanned lines (JSON allows newlines between tokens), which a line
            # framing must not accept: redo this buffer line by line.
            return self._decode_lines(whole)
        if size == end:
            ends = char_ends  # ASCII: characters and bytes coincide.
        else:
            ends = _accumulate_ends(map(len, whole[:-1].split(b"\n")))
        return Decoded(values, ends, end, errors)

    def _decode_array(self, text: str) -> tuple[list[Any], list[str]] | None:
        """Every line of ``text`` (whole lines) parsed by one call of the C scanner, or None
        when that cannot be done exactly (the caller then scans value by value).

        The lines are parsed as one JSON array, each followed by a *sentinel*: the first of
        ``null``, ``true``, ``false`` that appears nowhere in ``text``, so every instance of
        its value in the result comes from a joiner. The result is taken only if it is
        ``[line0, S, line1, S, ..., lineN]`` with each ``S`` that very object: then all the
        joiners sit at the top level of the array, so each element between two of them is
        exactly one line parsed as one JSON document, as ``json.loads(line)`` would parse it
        (joiners include the newline, which no JSON string may hold, so none hides in a
        string). Anything else (a bad line, a document spanning lines, a line holding two)
        makes the parse fail or the shape differ.
        """
        found = _sentinel_absent_from(text)
        if found is None:
            return None
        token, sentinel = found
        lines = text[:-1].split("\n")
        joined = "[" + f",\n{token},".join(lines) + "]"
        try:
            array, stop = self._scan(joined, 0)
        except (StopIteration, ValueError, RecursionError):
            return None
        n = len(lines)
        if stop != len(joined) or type(array) is not list or len(array) != 2 * n - 1:
            return None
        if not all(map(is_, array[1::2], repeat(sentinel))):
            return None
        return array[0::2], lines

    @staticmethod
    def _loads_line(line: str | bytes) -> Any:
        try:
            return json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            return MessageDecodeError(f"invalid JSON message: {err}")

    def _decode_lines(self, whole: bytes) -> Decoded:
        lines = whole[:-1].split(b"\n")
        values = [self._loads_line(line) for line in lines]
        errors = sum(isinstance(v, MessageDecodeError) for v in values)
        return Decoded(values, _accumulate_ends(map(len, lines)), len(whole), errors)


class StdlibJSONFraming(JSONFraming):
    """JSONFraming through the standard library's ``json`` alone: the reference the msgspec
    path is tested against, and the "before" column of ``bench/message_bench.py``."""

    # Methods, not aliases of the base's: a compiled class's attributes are not its methods.
    def marshal(self, msg: Any) -> bytes:
        return self._stdlib_marshal(msg)

    def marshal_many(self, msgs: Iterable[Any]) -> bytes:
        return self._stdlib_marshal_many(msgs)

    def unmarshal(self, frame: bytes) -> Any:
        return self._stdlib_unmarshal(frame)

    def decode(self, buffer: bytes, final: bool = False) -> Decoded:
        return self._stdlib_decode(buffer, final)


class FixedFraming:
    """Length-prefixed binary frames (typically protobuf messages) with a magic word.

    Marshals messages having ``SerializeToString()`` (protobuf messages) or ``to_bytes()``,
    or raw ``bytes``. Raw values are payload ``bytes``.
    """

    content_type: Final = CONTENT_TYPE_PROTO_FIXED
    _header: Final = struct.Struct("<4sI")
    _length: Final = struct.Struct("<I")

    @staticmethod
    def _payload(msg: Any) -> bytes:
        if isinstance(msg, bytes | bytearray | memoryview):
            return bytes(msg)
        serialize = getattr(msg, "SerializeToString", None) or getattr(msg, "to_bytes", None)
        if serialize is None:
            raise FramingError(
                f"{type(msg).__name__} has neither SerializeToString() nor to_bytes()"
            )
        payload = serialize()
        if not isinstance(payload, bytes):
            raise FramingError(f"{type(msg).__name__} serialized to {type(payload).__name__}")
        return payload

    def marshal(self, msg: Any) -> bytes:
        payload = self._payload(msg)
        if len(payload) > 0xFFFFFFFF:
            raise FramingError(f"payload of {len(payload)} bytes exceeds a 32-bit length")
        return self._header.pack(FIXED_FRAME_WORD, len(payload)) + payload

    def marshal_many(self, msgs: Iterable[Any]) -> bytes:
        # Headers and payloads joined once (not each frame built by concatenation first).
        payload_of, pack, word = self._payload, self._header.pack, FIXED_FRAME_WORD
        parts: list[bytes] = []
        add = parts.append
        for msg in msgs:
            payload = payload_of(msg)
            if len(payload) > 0xFFFFFFFF:
                raise FramingError(f"payload of {len(payload)} bytes exceeds a 32-bit length")
            add(pack(word, len(payload)))
            add(payload)
        return b"".join(parts)

    def unpack(self, buffer: bytes, final: bool = False) -> Unpacked:
        out = Unpacked()
        frames, ends = out.frames, out.ends
        word, unpack_length = FIXED_FRAME_WORD, self._length.unpack_from
        pos, size = 0, len(buffer)
        while size - pos >= FIXED_FRAME_HEADER_LENGTH:
            if not buffer.startswith(word, pos):
                # Lost sync: skip to the next magic word. If there is none, keep the last
                # three bytes, which may begin a magic word completed by the next chunk.
                nxt = buffer.find(word, pos + 1)
                if nxt == -1:
                    nxt = max(pos + 1, size - 3)
                frames.append(
                    DesyncError(
                        f"detected de-synchronization: skipped {nxt - pos} bytes",
                        begin=pos,
                        skipped=nxt - pos,
                    )
                )
                ends.append(nxt)
                out.errors += 1
                pos = nxt
                continue
            (length,) = unpack_length(buffer, pos + 4)
            stop = pos + FIXED_FRAME_HEADER_LENGTH + length
            if stop > size:
                break
            frames.append(buffer[pos + FIXED_FRAME_HEADER_LENGTH : stop])
            ends.append(stop)
            pos = stop
        # A lone trailing newline at the very end is tolerated (it helped Hadoop streaming).
        if final and size - pos == 1 and buffer[pos] == 0x0A:
            pos = size
        out.consumed = pos
        return out

    def unmarshal(self, frame: bytes) -> bytes:
        return frame

    def decode(self, buffer: bytes, final: bool = False) -> Decoded:
        u = self.unpack(buffer, final)
        return Decoded(u.frames, u.ends, u.consumed, u.errors)


class CSVFraming:
    """CSV records (RFC 4180, ``\\n`` terminated), the message UUID in the first column.

    Marshals messages having ``to_csv()`` or sequences of strings. Raw values are records
    (``list[str]``).
    """

    content_type: Final = CONTENT_TYPE_CSV

    def marshal(self, msg: Any) -> bytes:
        return self.marshal_many((msg,))

    def marshal_many(self, msgs: Iterable[Any]) -> bytes:
        # The csv writer quotes fields holding a character of its line terminator, so a
        # "\r\n" writer quotes both '\r' and '\n'; each record's terminator is then cut
        # back to the "\n" Gazette writes.
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        if type(msgs) is not list:
            msgs = list(msgs)
        if not msgs:
            return b""
        # All records in one writer call. If the text holds no "\r" but the terminators',
        # each "\r\n" ends a record and becomes "\n"; else (a field holds a "\r") record by
        # record, which cuts each terminator off by position.
        record = self._record
        try:
            writer.writerows([record(m) for m in msgs])
        except csv.Error as err:
            raise FramingError(f"cannot encode message as CSV: {err}") from err
        text = out.getvalue()
        if text.count("\r") == len(msgs):
            return text.replace("\r\n", "\n").encode()
        records: list[str] = []
        try:
            for msg in msgs:
                out.seek(0)
                out.truncate()
                writer.writerow(self._record(msg))
                records.append(out.getvalue()[:-2])
        except csv.Error as err:  # pragma: no cover - writerows above raised it first
            raise FramingError(f"cannot encode message as CSV: {err}") from err
        records.append("")
        return "\n".join(records).encode()

    @staticmethod
    def _record(msg: Any) -> Sequence[str]:
        to_csv = getattr(msg, "to_csv", None)
        if to_csv is not None:
            record: Sequence[str] = to_csv()
            return record
        if isinstance(msg, list | tuple):
            return msg
        raise FramingError(f"{type(msg).__name__} has no to_csv() and is not a sequence")

    def unpack(self, buffer: bytes, final: bool = False) -> Unpacked:
        end = buffer.rfind(b"\n") + 1
        if end == 0:
            return Unpacked()
        lines = buffer[: end - 1].split(b"\n")
        if b'"' not in buffer[:end]:
            frames: list[bytes | FramingError] = [line + b"\n" for line in lines]
            return Unpacked(frames, _accumulate_ends(map(len, lines)), end, 0)
        # Quoted fields may hold newlines: a record continues while its quotes are unbalanced
        # (an escaped quote is two quotes, so parity still tells whether one is open).
        frames, ends = [], []
        pos, start, open_quote = 0, 0, False
        for line in lines:
            pos += len(line) + 1
            if line.count(b'"') & 1:
                open_quote = not open_quote
            if not open_quote:
                frames.append(buffer[start:pos])
                ends.append(pos)
                start = pos
        return Unpacked(frames, ends, start, 0)

    def unmarshal(self, frame: bytes) -> list[str]:
        try:
            rows = list(csv.reader([frame.decode()], strict=True))
        except (csv.Error, UnicodeDecodeError) as err:
            raise MessageDecodeError(f"invalid CSV record: {err}") from err
        if len(rows) != 1 or not rows[0]:
            raise MessageDecodeError(f"a CSV frame holds one record, found {len(rows)}")
        return rows[0]

    def decode(self, buffer: bytes, final: bool = False) -> Decoded:
        end = buffer.rfind(b"\n") + 1
        if end and b'"' not in buffer[:end] and b"\r" not in buffer[:end]:
            # No quotes and no "\r": each line is one record, and the csv reader, which
            # treats no other character specially, reads a line alike with or without its
            # "\n". So the whole span is decoded and read in one call each.
            whole = buffer[:end]
            try:
                text = whole.decode()
                lines = text[:-1].split("\n")
                rows: list[Any] = list(csv.reader(lines, strict=True))
            except (csv.Error, UnicodeDecodeError):
                pass
            else:
                if len(rows) == len(lines) and all(rows):
                    # Byte lengths: those of the text's lines if it is ASCII.
                    lengths = map(len, lines) if text.isascii() else \
                        map(len, whole[:-1].split(b"\n"))
                    return Decoded(rows, _accumulate_ends(lengths), end, 0)
        u = self.unpack(buffer, final)
        try:
            texts = [f.decode() for f in u.frames if isinstance(f, bytes)]
            rows = list(csv.reader(texts, strict=True))
            if len(rows) == len(u.frames) and all(rows):
                return Decoded(rows, u.ends, u.consumed, 0)
        except (csv.Error, UnicodeDecodeError):
            pass
        values: list[Any] = []
        errors = 0
        for frame in u.frames:
            try:
                if isinstance(frame, FramingError):
                    raise frame
                values.append(self.unmarshal(frame))
            except FramingError as err:
                values.append(err)
                errors += 1
        return Decoded(values, u.ends, u.consumed, errors)


_registry: dict[str, Callable[[], Framing]] = {}
_instances: dict[str, Framing] = {}


def register_framing(content_type: str, factory: Callable[[], Framing]) -> None:
    """Register (or replace) the Framing serving ``content_type``."""
    _registry[content_type] = factory
    _instances.pop(content_type, None)


def framing_for_content_type(content_type: str) -> Framing:
    """The Framing registered for ``content_type`` (instances are shared)."""
    framing = _instances.get(content_type)
    if framing is None:
        factory = _registry.get(content_type)
        if factory is None:
            raise UnknownContentTypeError(
                f"unrecognized {CONTENT_TYPE} ({content_type!r}); registered: "
                f"{', '.join(sorted(_registry))}"
            )
        framing = _instances[content_type] = factory()
    return framing


register_framing(CONTENT_TYPE_JSON_LINES, JSONFraming)
register_framing(CONTENT_TYPE_PROTO_FIXED, FixedFraming)
register_framing(CONTENT_TYPE_CSV, CSVFraming)

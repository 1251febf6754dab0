"""HTTP/2 frames and gRPC length-prefixed messages: the pure codecs of :mod:`gazette.rpc`.

Nothing here does I/O; the connection feeds bytes in and writes what comes out.

Invariants:

* :class:`FrameReader` yields exactly the frames of the byte stream it is fed, in order,
  however the stream is split into chunks; a frame's payload is a memoryview of immutable
  bytes, safe to keep. A frame longer than the reader's ``max_frame`` is a
  :class:`ProtocolError` (FRAME_SIZE_ERROR) before its payload is buffered.
* :class:`MessageReader` yields exactly the gRPC messages of the DATA payloads it is fed,
  however they are split; a message longer than ``max_message`` is refused on its prefix.
* Header blocks we *send* use only static-table references and literals "without indexing",
  so they never touch the peer's HPACK dynamic table and can be encoded once and reused.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import ClassVar
from urllib.parse import quote, unquote

import grpc

from gazette.errors import GazetteError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME_LIMIT = (1 << 24) - 1

_HEAD = struct.Struct(">HBBBI")  # length (24 bits, split 16 + 8), type, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_MSG_PREFIX = struct.Struct(">BI")


class ProtocolError(GazetteError):
    """The peer broke HTTP/2 or gRPC framing; the connection ends with ``code``."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class MessageRefused(ProtocolError):
    """A gRPC message the receiver will not take: its call (not the connection) ends with
    ``status``."""

    # ClassVar: a class attribute of the class, as each subclass's overrides it (compiled,
    # a plain annotation-less default would be an instance slot the subclasses never set).
    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL


class MessageTooLarge(MessageRefused):
    """A gRPC message longer than the receiver's maximum: the call ends RESOURCE_EXHAUSTED."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.RESOURCE_EXHAUSTED


class MessageCompressed(MessageRefused):
    """A compressed gRPC message: we agree no compression (``grpc-accept-encoding:
    identity``), so the call ends UNIMPLEMENTED, as gRPC's compression.md prescribes for "a
    message compressed by an algorithm that is not supported"."""

    status: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNIMPLEMENTED


def frame_head(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    return _HEAD.pack(length >> 8, length & 0xFF, ftype, flags, stream_id)


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) >> 8, len(payload) & 0xFF, ftype, flags, stream_id) + payload


def settings_frame(pairs: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in pairs.items()))


def parse_settings(payload: memoryview) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def u32(payload: memoryview, at: int = 0) -> int:
    return int(_U32.unpack_from(payload, at)[0])


def strip_padding(flags: int, payload: memoryview, priority: bool) -> memoryview:
    """The content of a DATA or HEADERS payload without padding (and priority fields)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if end < 1:
            raise ProtocolError("padded frame without a pad length")
        end -= payload[0]
        start = 1
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if end < start:
        raise ProtocolError("padding exceeds the frame's payload")
    return payload[start:end]


class FrameReader:
    """Splits a byte stream into frames ``(type, flags, stream_id, payload)``.

    Whole frames within one chunk are sliced from it without copying; a frame split over
    chunks is gathered in a list and joined once when it is complete.
    """

    __slots__ = ("max_frame", "_parts", "_have", "_need")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._parts: list[bytes | memoryview] = []
        self._have = 0
        self._need = 9

    def feed(self, data: bytes) -> Iterator[tuple[int, int, int, memoryview]]:
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            data = b"".join(self._parts)
            self._parts = []
            self._have = 0
        n = len(data)
        view = memoryview(data)
        pos = 0
        need = 9
        while n - pos >= 9:
            hi, lo, ftype, flags, sid = _HEAD.unpack_from(data, pos)
            length = (hi << 8) | lo
            if length > self.max_frame:
                raise ProtocolError(f"frame of {length} bytes exceeds the maximum of {self.max_frame}",
                                    FRAME_SIZE_ERROR)
            end = pos + 9 + length
            if end > n:
                need = 9 + length
                break
            yield ftype, flags, sid & 0x7FFFFFFF, view[pos + 9:end]
            pos = end
        if pos < n:
            rest = view[pos:]  # a view: a large frame's first chunk is copied once, by the join
            self._parts = [rest]
            self._have = len(rest)
            self._need = need
        else:
            self._need = 9


class MessageReader:
    """Assembles gRPC length-prefixed messages from DATA payloads.

    ``feed`` returns the messages completed by a payload (memoryviews, zero-copy when a
    message lies within one payload).
    """

    __slots__ = ("max_message", "_parts", "_have", "_need", "_body")

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self._parts: list[bytes | memoryview] = []
        self._have = 0
        self._need = 5
        self._body = False  # whether _need counts a message body (else the 5-byte prefix)

    @property
    def partial(self) -> bool:
        return self._have > 0 or self._body

    def feed(self, data: memoryview) -> list[memoryview]:
        out: list[memoryview] = []
        pos, n = 0, len(data)
        while pos < n:
            if self._parts or self._body:
                take = min(self._need - self._have, n - pos)
                self._parts.append(data[pos:pos + take])
                self._have += take
                pos += take
                if self._have < self._need:
                    break
                joined = b"".join(self._parts)
                self._parts = []
                self._have = 0
                if self._body:
                    out.append(memoryview(joined))
                    self._body = False
                    self._need = 5
                else:
                    self._start(joined, 0)
                    if self._need == 0:
                        out.append(memoryview(b""))
                        self._body = False
                        self._need = 5
                continue
            if n - pos < 5:
                self._parts.append(data[pos:])
                self._have = n - pos
                break
            length = self._start(data, pos)
            pos += 5
            if n - pos >= length:
                out.append(data[pos:pos + length])
                pos += length
                self._body = False
                self._need = 5
            elif length:
                # the body continues in later payloads
                self._parts.append(data[pos:])
                self._have = n - pos
                pos = n
        return out

    def _start(self, buf: bytes | memoryview, at: int) -> int:
        flag, length = _MSG_PREFIX.unpack_from(buf, at)
        if flag:
            if flag == 1:
                raise MessageCompressed("grpc: compressed messages are not supported (grpc-accept-encoding: identity)")
            # grpc-go: "grpc: received unexpected payload format" (INTERNAL).
            raise MessageRefused(f"grpc: unexpected payload format {flag}")
        if length > self.max_message:
            raise MessageTooLarge(f"gRPC message of {length} bytes exceeds the maximum of {self.max_message}")
        self._body = True
        self._need = length
        return int(length)


def message_prefix(length: int) -> bytes:
    return _MSG_PREFIX.pack(0, length)


# --- headers --------------------------------------------------------------------------

def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_str(value: bytes) -> bytes:
    return _hpack_int(len(value), 7, 0) + value


def literal(name: str | int, value: str | bytes) -> bytes:
    """A header field "literal without indexing" (RFC 7541 6.2.2); ``name`` an index of the
    static table or a literal name."""
    v = value.encode() if isinstance(value, str) else value
    if isinstance(name, int):
        return _hpack_int(name, 4, 0) + _hpack_str(v)
    return b"\x00" + _hpack_str(name.encode()) + _hpack_str(v)


STATUS_200 = b"\x88"           # :status 200, static index 8
METHOD_POST = b"\x83"          # :method POST, static index 3
SCHEME_HTTP = b"\x86"          # :scheme http, static index 6
_PATH, _AUTHORITY, _CONTENT_TYPE, _USER_AGENT = 4, 1, 31, 58
CONTENT_TYPE_GRPC = literal(_CONTENT_TYPE, "application/grpc")
TE_TRAILERS = literal("te", "trailers")

RESPONSE_HEADERS = STATUS_200 + CONTENT_TYPE_GRPC


def request_headers(path: str, authority: str, user_agent: str) -> bytes:
    return (METHOD_POST + SCHEME_HTTP + literal(_PATH, path) + literal(_AUTHORITY, authority)
            + CONTENT_TYPE_GRPC + TE_TRAILERS + literal(_USER_AGENT, user_agent))


def timeout_header(seconds: float) -> bytes:
    """``grpc-timeout`` for a deadline ``seconds`` away (at most 8 digits, as gRPC requires)."""
    micros = max(1, int(seconds * 1e6))
    if micros < 100_000_000:
        return literal("grpc-timeout", f"{micros}u")
    millis = micros // 1000
    if millis < 100_000_000:
        return literal("grpc-timeout", f"{millis}m")
    return literal("grpc-timeout", f"{min(micros // 1_000_000, 99_999_999)}S")


_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float:
    unit = _TIMEOUT_UNITS.get(value[-1:]) if value else None
    digits = value[:-1]
    if unit is None or not (digits.isascii() and digits.isdigit()) or len(digits) > 8:
        raise ValueError(f"malformed grpc-timeout {value!r}")
    return int(digits) * unit


def encode_message_text(details: str) -> str:
    """``grpc-message`` percent-encoding: printable ASCII but '%' passes through."""
    return quote(details, safe=" !\"#$&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`"
                                "abcdefghijklmnopqrstuvwxyz{|}~")


def decode_message_text(value: str) -> str:
    return unquote(value, errors="replace")


_STATUS_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def status_code(value: int) -> grpc.StatusCode:
    return _STATUS_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)


_OK_TRAILERS = literal("grpc-status", "0")


ACCEPT_IDENTITY = literal("grpc-accept-encoding", "identity")


def trailers(code: grpc.StatusCode, details: str, with_headers: bool, extra: bytes = b"") -> bytes:
    """A trailer block (or a trailers-only response when ``with_headers``), with ``extra``
    encoded fields."""
    block = (RESPONSE_HEADERS + extra) if with_headers else extra
    if code is grpc.StatusCode.OK and not details:
        return block + _OK_TRAILERS
    block += literal("grpc-status", str(code.value[0]))
    if details:
        block += literal("grpc-message", _message_text(details))
    return block


#: The longest grpc-message we send, encoded: gRPC suggests clients limit a response's
#: header lists to 8 KiB (grpc-core and grpc-java do), trailers included.
MAX_MESSAGE_TEXT = 4096


def _message_text(details: str) -> str:
    text = encode_message_text(details[:MAX_MESSAGE_TEXT])  # each character encodes to 1+
    if len(text) <= MAX_MESSAGE_TEXT:
        return text
    cut = text[:MAX_MESSAGE_TEXT]
    escape = cut.rfind("%", MAX_MESSAGE_TEXT - 2)
    return cut[:escape] if escape >= 0 else cut  # never half an escape


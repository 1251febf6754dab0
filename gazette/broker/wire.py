"""The broker's own wire encoding and decoding: zero-copy decoding of its hot streams (Append
and Replicate requests), and List pages built from the keyspace's raw specs.

Content is nearly every request of an append or a replication stream. Decoding it with
protobuf would copy the content to parse it and again on each access, so the servers register
these decoders instead (``gazette.server.grpc.add_service``) and the handlers work on views of
the received bytes.

Invariants:

* A fast path takes only the exact shapes every encoder writes (``content``, field 4, then
  optionally ``content_delta``, field 5); any other shape is parsed by protobuf, so every valid
  encoding is accepted and decodes to the same request.
* Views are never copied here; they stay valid as long as the received buffer does.
* An Append's first request (the one naming the journal) that is valid, small and without a
  proxy's header is decoded once per distinct encoding: every append that sends the same
  bytes (a writer's appends to one journal) gets the same message, which is read-only (as
  every chunk) and known valid (:func:`validated`). Any other first request is parsed and
  validated afresh.
* A List page built here decodes to the ListResponse protobuf would build from the same specs
  and routes (fields in number order; a zero revision omitted, as proto3 does).
"""

from __future__ import annotations

from typing import ClassVar

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.errors import ValidationError
from gazette.protocol.validate import validate_append_request

__all__ = [
    "AppendChunk",
    "Content",
    "ContentChunk",
    "decode_append_request",
    "decode_request",
    "encode_varint",
    "put_varint",
    "list_journal",
    "raw_request",
    "validated",
    "varint",
]


Content = tuple[memoryview, int]
"""A decoded content request: (content, content_delta)."""


def varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def encode_varint(n: int) -> bytes:
    """``n`` (non-negative) as a protobuf varint."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    put_varint(out, n)
    return bytes(out)


def put_varint(out: bytearray, n: int) -> None:
    """Appends ``n`` (non-negative) to ``out`` as a protobuf varint: a message built in one
    buffer (``append.encode_committed``) makes no ``bytes`` per field."""
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def list_journal(spec: bytes, mod_revision: int, route: bytes, create_revision: int) -> bytes:
    """One ``ListResponse.journals`` entry (field 3, length-delimited), from the serialized
    JournalSpec and Route: 50,000 journals build in a fraction of the time protobuf takes to
    copy each spec and route into a page."""
    parts = [b"\x0a", encode_varint(len(spec)), spec]
    if mod_revision:
        parts += (b"\x10", encode_varint(mod_revision))
    parts += (b"\x1a", encode_varint(len(route)), route)
    if create_revision:
        parts += (b"\x20", encode_varint(create_revision))
    entry = b"".join(parts)
    return b"".join((b"\x1a", encode_varint(len(entry)), entry))


def decode_request(data: bytes | memoryview | pb.ReplicateRequest) -> pb.ReplicateRequest | Content:
    """A received request: a content request as (view, delta), anything else as a message.

    The fast path takes exactly ``content`` (field 4) optionally followed by
    ``content_delta`` (field 5), as every encoder writes them; any other shape is parsed by
    protobuf, so every valid encoding is accepted.
    """
    if isinstance(data, pb.ReplicateRequest):
        return data
    if data[:1] == b"\x22":
        try:
            n, pos = varint(data, 1)
            end = pos + n
            if end <= len(data):
                delta = 0
                if end < len(data) and data[end] == 0x28:
                    delta, after = varint(data, end + 1)
                else:
                    after = end
                if after == len(data) and n > 0 and delta < (1 << 63):
                    return memoryview(data)[pos:end], delta
        except ValueError:
            pass
    return pb.ReplicateRequest.FromString(data)  # type: ignore[arg-type]  # bytes-like is accepted


class ContentChunk:
    """An AppendRequest that carries only ``content``, held as a view of the received bytes.

    Content chunks are nearly every request of an append; decoding them with protobuf would
    copy the content once to parse it and again on each access of the field (and sizing it
    costs a serialization). Everything that reads a chunk reads ``journal`` and ``content``.
    """

    __slots__ = ("content",)
    journal: ClassVar[str] = ""

    def __init__(self, content: memoryview) -> None:
        self.content = content

    def to_proto(self) -> pb.AppendRequest:
        return pb.AppendRequest(content=bytes(self.content))


AppendChunk = pb.AppendRequest | ContentChunk
"""A request of an Append stream after the first."""


COMMIT = ContentChunk(memoryview(b""))
"""The empty request, an append's commit: decoded to this one chunk (read-only, as every chunk)."""


def decode_append_request(data: bytes | memoryview) -> pb.AppendRequest | ContentChunk:
    """Request deserializer of Append: a content-only chunk (exactly field 4, non-empty) as a
    :class:`ContentChunk`, the empty request (the commit) as :data:`COMMIT`, anything else
    (the first request) by protobuf."""
    if not data:
        return COMMIT
    if data[:1] == b"\x22":
        try:
            n, pos = varint(data, 1)
        except ValueError:
            n, pos = -1, 0
        if n > 0 and pos + n == len(data):
            return ContentChunk(memoryview(data)[pos:])
    if len(data) > FIRST_CACHE_BYTES:
        return pb.AppendRequest.FromString(data)  # type: ignore[arg-type]  # bytes-like is accepted
    key = bytes(data)
    req = _FIRSTS.get(key)
    if req is None:
        req = pb.AppendRequest.FromString(key)
        if req.journal and not req.HasField("header"):
            try:
                validate_append_request(req)
            except ValidationError:
                return req  # the servicer validates it again, and answers what is wrong
            if len(_FIRSTS) >= FIRST_CACHE_MAX:
                _FIRSTS.clear()
                _VALIDATED.clear()
            _FIRSTS[key] = req
            _VALIDATED[id(req)] = req
    return req


def validated(req: object) -> bool:
    """Whether ``req`` is a first request :func:`decode_append_request` validated and shares."""
    return _VALIDATED.get(id(req)) is req


FIRST_CACHE_BYTES = 512
"""First requests up to this size are decoded once per distinct encoding."""
FIRST_CACHE_MAX = 1024
"""Distinct first requests kept (all dropped when full)."""
_FIRSTS: dict[bytes, pb.AppendRequest] = {}
# The same messages by identity: holding them keeps their ids from being reused while listed.
_VALIDATED: dict[int, pb.AppendRequest] = {}


def raw_request(data: bytes) -> bytes:
    """Request serializer of the primary's Replicate calls: requests are sent pre-serialized."""
    return data

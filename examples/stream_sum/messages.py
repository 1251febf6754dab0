"""stream-sum's messages and its one rule of arithmetic.

A stream is identified by 16 random bytes (32 hex digits). Its chunks carry sequence numbers
1, 2, ... and data (base64 in the JSON, as Go encodes ``[]byte``); the last chunk's data is
empty. Both messages are typed (``TypedMessage``): decoded and validated by msgspec, read as
attributes. The running sum starts as 20 zero
bytes and each chunk with data replaces it by ``sha1(sum || data)``: unlike a plain SHA-1 its
state is 20 bytes a store can keep, and any lost, repeated or reordered chunk changes it.
"""

from __future__ import annotations

import hashlib

from gazette.errors import GazetteError
from gazette.message import TypedMessage

__all__ = ["CHUNK_LABEL", "SUMS_JOURNAL", "ZERO", "Chunk", "StreamSumError", "Sum", "update"]

SUMS_JOURNAL = "examples/stream-sum/sums"
CHUNK_LABEL = "app.gazette.dev/message-type=stream_sum.Chunk"
ZERO = bytes(20)


class StreamSumError(GazetteError):
    """A chunk out of sequence (summer), or a sum that is wrong, repeated or late (chunker)."""


class Chunk(TypedMessage):
    """``{"id": hex, "seq": n, "data": base64}``; empty data ends the stream."""

    id: str
    seq: int
    data: bytes


class Sum(TypedMessage):
    """``{"id": hex, "seq": last seq, "sum": hex}``: a stream's final sum."""

    id: str
    seq: int
    sum: str


def update(value: bytes, data: bytes) -> bytes:
    """The running sum after one chunk's data."""
    return hashlib.sha1(value + data, usedforsecurity=False).digest() if data else value

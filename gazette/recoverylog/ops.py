"""Recorded operations: Gazette's ``RecordedOp`` in fixed framing, with chained checksums.

A recovery log is a journal (``content-type: application/x-gazette-recoverylog``) of
``RecordedOp`` messages, each in fixed framing: the 4-byte word ``66 33 93 36``, the
little-endian u32 length of the message, then the message. A ``write`` op's data follows its
frame, ``length`` raw bytes outside any frame.

Invariants:

* ``checksum`` of op N is CRC32-Castagnoli chained over the *message bytes* (frame header
  excluded) of every applied op before it: ``checksum(N+1) = crc32c_extend(checksum(N),
  message(N))``, starting at 0. Write data is not covered (it is bounded by ``length``).
* An op with no create/link/unlink/write/property is a no-op: it only advances the sequence
  (the hand-off a new owner injects carries its author this way).
* ``first_offset``, ``last_offset`` and ``log`` are never written by a recorder; a reader fills
  them in (where the frame began, where it and its data end, which journal).
* The author fence is the journal register ``author=<author in base 32>`` (Gazette's
  ``strconv.FormatUint(a, 32)``), so Go and Python owners fence each other.
"""

from __future__ import annotations

import secrets
import struct
from typing import Final

import google_crc32c
from google.protobuf import unknown_fields

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import recoverylog_pb2 as rl

__all__ = [
    "CONTENT_TYPE",
    "FRAME_HEADER",
    "HEADER_LENGTH",
    "WORD",
    "decode_header",
    "decode_op",
    "encode_op",
    "extend_checksum",
    "fence",
    "fence_selector",
    "new_author",
    "op_kind",
]

CONTENT_TYPE: Final = "application/x-gazette-recoverylog"
WORD: Final = b"\x66\x33\x93\x36"
HEADER_LENGTH: Final = 8
FRAME_HEADER: Final = struct.Struct("<4sI")
_DIGITS: Final = "0123456789abcdefghijklmnopqrstuv"


def new_author() -> int:
    """A random author in [1, 2^32 - 1]."""
    return secrets.randbelow(0xFFFFFFFF - 1) + 1


def _base32(n: int) -> str:
    out = []
    while True:
        n, r = divmod(n, 32)
        out.append(_DIGITS[r])
        if n == 0:
            return "".join(reversed(out))


def fence(author: int) -> pb.LabelSet:
    """The register that marks ``author`` as the log's owner."""
    ls = pb.LabelSet()
    ls.labels.add(name="author", value=_base32(author))
    return ls


def fence_selector(author: int) -> pb.LabelSelector:
    """The ``check_registers`` selector that admits only ``author``'s appends."""
    sel = pb.LabelSelector()
    sel.include.CopyFrom(fence(author))
    return sel


def extend_checksum(checksum: int, message: bytes | memoryview) -> int:
    return int(google_crc32c.extend(checksum, bytes(message)))


def encode_op(op: rl.RecordedOp) -> tuple[bytes, bytes]:
    """(frame, message): the framed op to append and its message bytes (for the checksum)."""
    msg = op.SerializeToString()
    return FRAME_HEADER.pack(WORD, len(msg)) + msg, msg


def decode_header(header: bytes | memoryview) -> int:
    """The message length of a frame header; ``ValueError`` when the word is wrong."""
    word, length = FRAME_HEADER.unpack(header)
    if word != WORD:
        raise ValueError(f"frame header {bytes(header).hex()} lacks the fixed-framing word")
    return int(length)


def decode_op(message: bytes | memoryview) -> rl.RecordedOp:
    """Parses an op; ``ValueError`` for bytes that are not a RecordedOp this reader knows
    (a truncated message, or fields it does not understand, such as an unknown op)."""
    op = rl.RecordedOp()
    try:
        op.ParseFromString(bytes(message))
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ValueError(f"not a RecordedOp: {err}") from None
    unknown = unknown_fields.UnknownFieldSet(op)
    if len(unknown):
        numbers = sorted({unknown[i].field_number for i in range(len(unknown))})
        raise ValueError(f"RecordedOp with unknown fields {numbers} (an op this reader does not know)")
    return op


def op_kind(op: rl.RecordedOp) -> str:
    """``create``, ``link``, ``unlink``, ``write``, ``property`` or ``noop``."""
    for kind in ("create", "link", "unlink", "write", "property"):
        if op.HasField(kind):
            return kind
    return "noop"

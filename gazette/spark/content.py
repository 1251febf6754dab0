"""Reading a planned slice's bytes, in blocks that end on message boundaries.

Runs in Spark's Python workers. Persisted segments are fetched from their signed URLs (a
presigned store GET, or a file below ``file_root``), decompressed as they stream; the rest is
read from the brokers with bounded Read RPCs (``end_offset``).

Invariants:

* Memory is bounded by about two blocks plus one store chunk, whatever the fragment's size:
  content is never held whole.
* Every block yielded is ``(offset, bytes)`` with ``bytes`` the journal content at ``offset``,
  ending on a frame boundary of the journal's framing (``cut``); the last block of a segment
  run may end with an unterminated final frame, which the parser then judges.
* Blocks of one slice are yielded in offset order; across a gap between segments (content
  removed by retention) nothing is carried over: a frame cut by a gap is a ContentError.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from gazette.client.journal_client import JournalClient
from gazette.client.reader import RetryReader, open_fragment
from gazette.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    framing_for_content_type,
)
from gazette.protocol import protocol_pb2 as pb
from gazette.spark.errors import ContentError
from gazette.spark.plan import JournalSlice, Segment

__all__ = ["Cut", "cut_for", "segment_bytes", "slice_blocks"]

Cut = Callable[[bytes], int]
"""How many bytes at the start of a buffer are whole frames."""


def _cut_lines(buf: bytes) -> int:
    return buf.rfind(b"\n") + 1


def _cut_whole(buf: bytes) -> int:
    return len(buf)


def cut_for(content_type: str) -> Cut:
    """The frame-boundary cut of a journal's content-type (unframed content: anywhere)."""
    if content_type == CONTENT_TYPE_JSON_LINES:
        return _cut_lines
    if content_type in (CONTENT_TYPE_CSV, CONTENT_TYPE_PROTO_FIXED):
        framing = framing_for_content_type(content_type)

        def cut(buf: bytes) -> int:
            if content_type == CONTENT_TYPE_CSV and b'"' not in buf:
                return _cut_lines(buf)  # No quoted field can hold a newline.
            return framing.unpack(buf).consumed

        return cut
    return _cut_whole


async def segment_bytes(client: JournalClient, journal: str, seg: Segment,
                        file_root: str | None) -> AsyncGenerator[bytes, None]:
    """The content of ``seg``, from its store when it has a URL, else from the brokers."""
    source: Any
    if seg.url:
        fragment = pb.Fragment(journal=journal, begin=seg.fragment_begin, end=seg.fragment_end,
                               compression_codec=seg.codec)  # type: ignore[arg-type]
        source = open_fragment(fragment, seg.begin, seg.url, file_root)
    else:
        source = RetryReader(client, pb.ReadRequest(journal=journal, offset=seg.begin,
                                                    end_offset=seg.end, block=False))
    try:
        pos = seg.begin
        async for data in source:
            if pos + len(data) >= seg.end:
                yield data[: seg.end - pos]  # A fragment read past the segment's end.
                return
            pos += len(data)
            yield data
    finally:
        await source.aclose()


async def slice_blocks(client: JournalClient, sl: JournalSlice, cut: Cut, block_bytes: int,
                       file_root: str | None) -> AsyncGenerator[tuple[int, bytes], None]:
    """Blocks of about ``block_bytes`` of the slice's content, each on frame boundaries."""
    pieces: list[bytes] = []
    size = 0
    base = sl.begin  # Offset of pieces[0].
    last = len(sl.segments) - 1
    for i, seg in enumerate(sl.segments):
        if seg.begin != base + size:
            if size:
                raise ContentError(
                    f"journal {sl.journal}: a message at offset {base} is cut by missing "
                    f"content [{base + size}, {seg.begin}) (removed fragments?)")
            base = seg.begin
        async for data in segment_bytes(client, sl.journal, seg, file_root):
            pieces.append(data)
            size += len(data)
            if size < block_bytes:
                continue
            buf = b"".join(pieces)
            n = cut(buf)
            if n == 0:
                pieces, size = [buf], len(buf)  # One frame longer than a block: read on.
                continue
            yield base, (buf if n == len(buf) else buf[:n])
            rest = buf[n:]
            base += n
            pieces, size = ([rest] if rest else []), len(rest)
        if size and (i == last or sl.segments[i + 1].begin != seg.end):
            yield base, b"".join(pieces)
            base += size
            pieces, size = [], 0

"""From journal content to Arrow record batches: framing, message offsets, UUID columns.

Runs in Spark's Python workers, one block at a time, with no per-message Python loop for JSON
lines (the common content): ``pyarrow.json`` parses the fields of the schema, numpy finds the
lines' offsets, and UUIDs are decoded from their text for all rows at once.

Columns (by name, wherever they appear in the schema):

* ``_journal`` (string), ``_offset`` (long: the message's begin offset) in every mode;
* ``_value`` (binary: the message frame without its delimiter or header) in ``raw`` mode;
* ``_uuid`` (string), ``_producer`` (string: 12 hex digits), ``_publish_time`` (timestamp)
  when messages carry UUIDs (JSON lines: the ``uuid_field`` key; CSV: column 0);
* every other field is a message field: a JSON key, or a CSV column (columns 1.. in schema
  order, column 0 being the UUID).

Invariants:

* Rows keep the journal's order; ``begins[i]``/``ends[i]`` are row i's journal offsets.
* Blank lines are not messages (as Gazette's JSON framing skips them); every other line is,
  and a message that does not parse is a ContentError naming the journal and its offset, or
  with ``malformed=skip`` is dropped and counted in a warning.
* ACK messages (UUID flags ACK_TXN) are messages like any other here; committed mode drops
  them once the Sequencer has read them.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from gazette.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    framing_for_content_type,
)
from gazette.message.uuid import ACK_TXN, G1582_NS100, uuid_words
from gazette.spark.errors import ContentError

__all__ = [
    "ACK_FLAG",
    "META_COLUMNS",
    "Parsed",
    "build_batch",
    "message_fields",
    "parse_block",
    "uuid_bytes",
    "uuid_fields",
]

log = logging.getLogger(__name__)

META_COLUMNS: Final = ("_journal", "_offset", "_value", "_uuid", "_producer", "_publish_time")
ACK_FLAG: Final = int(ACK_TXN)
_ZERO_UUID_TEXT: Final = "00000000-0000-0000-0000-000000000000"
_HEX_COLUMNS: Final = np.array([*range(0, 8), *range(9, 13), *range(14, 18), *range(19, 23),
                                *range(24, 36)])
_DASH_COLUMNS: Final = np.array([8, 13, 18, 23])
_NIBBLE: Final = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _NIBBLE[_c] = _i + 10

Int64s = npt.NDArray[np.int64]


@dataclass
class Parsed:
    """One block's messages: their fields or frames, offsets and UUID texts."""

    begins: Int64s
    ends: Int64s
    #: Message fields (decoded modes), one row per message.
    fields: pa.Table | None = None
    #: Message frames (raw mode).
    values: pa.Array | None = None
    #: Canonical UUID text per message (null where a message has none).
    uuids: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.begins)


def message_fields(schema: pa.Schema) -> pa.Schema:
    """The schema's message fields (its columns other than the meta columns)."""
    return pa.schema([f for f in schema if f.name not in META_COLUMNS])


def _line_spans(buf: bytes, base: int) -> tuple[Int64s, Int64s, Int64s]:
    """Begin and end offsets of the non-blank lines of ``buf`` (absolute), and each line's
    end within ``buf`` (just past its newline)."""
    data = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(data == 10).astype(np.int64)
    stops = nl + 1
    if len(buf) and buf[-1] != 10:
        stops = np.append(stops, len(buf))  # A final line without its newline.
        nl = np.append(nl, len(buf))
    starts = np.empty_like(stops)
    if len(starts):
        starts[0] = 0
        starts[1:] = stops[:-1]
    keep = nl > starts
    if not keep.all():
        starts, stops = starts[keep], stops[keep]
    return starts + base, stops + base, starts


def _located(journal: str, base: int, buf: bytes, what: str, err: Exception) -> ContentError:
    return ContentError(
        f"journal {journal}: content [{base}, {base + len(buf)}) is not {what}: {err}")


def _parse_frames(journal: str, base: int, buf: bytes, starts: Int64s, stops: Int64s,
                  parse: Callable[[bytes], pa.Table], schema: pa.Schema, what: str,
                  skip: bool) -> tuple[pa.Table, Int64s]:
    """The table of frames ``[starts[i], stops[i])`` of ``buf`` and the indexes of the frames
    it holds: all of them, or (``skip``) those that parse, the others found by bisection
    (bad frames are found by bisection: a block with a few costs a few more parses, not one
    per message; an error names the offset of the first)."""
    parts: list[pa.Table] = []
    kept: list[Int64s] = []
    skipped: list[tuple[int, Exception]] = []

    def attempt(lo: int, hi: int) -> None:
        try:
            table = parse(buf[starts[lo]: stops[hi - 1]])
            if table.num_rows == hi - lo:
                parts.append(table)
                kept.append(np.arange(lo, hi, dtype=np.int64))
                return
            err: Exception = ValueError(f"{table.num_rows} records in {hi - lo} messages")
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as e:
            err = e
        if hi - lo == 1:
            at = base + int(starts[lo])
            if not skip:
                raise ContentError(f"journal {journal}: the message at offset {at} is not "
                                   f"{what}: {err} (option malformed=skip skips such messages)")
            skipped.append((at, err))
            return
        mid = (lo + hi) // 2
        attempt(lo, mid)
        attempt(mid, hi)

    attempt(0, len(starts))
    if skipped:
        at, err = skipped[0]
        log.warning("journal %s: skipped %d malformed message(s) of [%d, %d), the first at "
                    "offset %d: %s", journal, len(skipped), base, base + len(buf), at, err)
    if not parts:
        return schema.empty_table(), np.zeros(0, dtype=np.int64)
    table = pa.concat_tables(parts) if len(parts) != 1 else parts[0]
    return table, np.concatenate(kept)


def _parse_json(journal: str, base: int, buf: bytes, fields: pa.Schema,
                uuid_field: str | None, skip: bool) -> Parsed:
    begins, ends, starts = _line_spans(buf, base)
    explicit = fields
    if uuid_field is not None and uuid_field not in fields.names:
        explicit = fields.append(pa.field(uuid_field, pa.string()))
    if not len(begins):
        return Parsed(begins, ends, explicit.empty_table(), None, None)
    read_options = pajson.ReadOptions(use_threads=False, block_size=len(buf) + 1)
    parse_options = pajson.ParseOptions(explicit_schema=explicit,
                                        unexpected_field_behavior="ignore")

    def parse(data: bytes) -> pa.Table:
        return pajson.read_json(pa.BufferReader(data), read_options=read_options,
                                parse_options=parse_options)

    table, kept = _parse_frames(journal, base, buf, starts, ends - base, parse, explicit,
                                "JSON of the schema", skip)
    if len(kept) != len(begins):
        begins, ends = begins[kept], ends[kept]
    uuids = table.column(uuid_field).combine_chunks() if uuid_field is not None else None
    return Parsed(begins, ends, table, None, uuids)


def _parse_csv(journal: str, base: int, buf: bytes, fields: pa.Schema, *,
               decode: bool, uuids: bool, skip: bool) -> Parsed:
    framing = framing_for_content_type(CONTENT_TYPE_CSV)
    if b'"' in buf:
        unpacked = framing.unpack(buf, final=True)
        stops = np.array(unpacked.ends, dtype=np.int64)
        if unpacked.consumed < len(buf):  # A final record without its newline.
            stops = np.append(stops, len(buf))
        starts = np.concatenate([[0], stops[:-1]]).astype(np.int64)
        begins, ends = starts + base, stops + base
    else:
        begins, ends, starts = _line_spans(buf, base)
    parsed = Parsed(begins, ends)
    if not decode:
        parsed.values = _frames(buf, starts, ends - base)
    if not (decode or uuids):
        return parsed
    # Column 0 is the UUID; the schema's message fields are columns 1.. in order.
    columns = ["f0", *(f"f{i + 1}" for i in range(len(fields) if decode else 0))]
    types = {"f0": pa.string(), **{f"f{i + 1}": f.type for i, f in enumerate(fields)}}
    if not len(begins):
        parsed.fields, parsed.uuids = fields.empty_table(), pa.array([], pa.string())
        return parsed

    def parse(data: bytes) -> pa.Table:
        return pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(use_threads=False, autogenerate_column_names=True,
                                           block_size=len(data) + 1),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={c: types[c] for c in columns}, include_columns=columns,
                strings_can_be_null=True, quoted_strings_can_be_null=False),
        )

    table, kept = _parse_frames(journal, base, buf, starts, ends - base, parse,
                                pa.schema([(c, types[c]) for c in columns]),
                                "a CSV record of the schema", skip)
    if len(kept) != len(begins):
        parsed.begins, parsed.ends = begins[kept], ends[kept]
        if parsed.values is not None:
            parsed.values = parsed.values.take(pa.array(kept))
    parsed.uuids = table.column(0).combine_chunks()
    if decode:
        parsed.fields = table.drop_columns(["f0"]).rename_columns(fields.names)
    return parsed


def _frames(buf: bytes, starts: Int64s, stops: Int64s) -> pa.Array:
    """Each ``buf[starts[i]:stops[i]]`` without its final newline, as a binary array."""
    if not len(starts):
        return pa.array([], pa.binary())
    if not np.array_equal(starts[1:], stops[:-1]) or stops[-1] >= 2**31:
        # Blank lines between frames (or a huge block): slice each frame.
        mv = memoryview(buf)
        return pa.array([mv[b: e - 1 if buf[e - 1] == 10 else e]
                         for b, e in zip(starts.tolist(), stops.tolist(), strict=True)],
                        pa.binary())
    # Contiguous frames: one zero-copy array over the block, then the newlines cut off.
    offsets = np.append(starts, stops[-1]).astype(np.int32)
    whole = pa.Array.from_buffers(pa.binary(), len(starts),
                                  [None, pa.py_buffer(offsets), pa.py_buffer(buf)])
    trimmed = pc.binary_slice(whole, 0, -1)
    if buf[stops[-1] - 1] != 10:  # A final frame without its newline keeps its last byte.
        last = buf[starts[-1]: stops[-1]]
        trimmed = pa.concat_arrays([trimmed.slice(0, len(trimmed) - 1), pa.array([last], pa.binary())])
    return trimmed


def _parse_fixed(journal: str, base: int, buf: bytes) -> Parsed:
    framing = framing_for_content_type(CONTENT_TYPE_PROTO_FIXED)
    unpacked = framing.unpack(buf, final=True)
    for frame in unpacked.frames:
        if not isinstance(frame, bytes):
            raise _located(journal, base, buf, "fixed frames", frame)
    stops = np.array(unpacked.ends, dtype=np.int64)
    starts = np.concatenate([[0], stops[:-1]]).astype(np.int64)
    if unpacked.consumed != len(buf):
        raise _located(journal, base, buf, "whole fixed frames",
                       ValueError(f"{len(buf) - unpacked.consumed} bytes left over"))
    return Parsed(starts + base, stops + base, values=pa.array(unpacked.frames, pa.binary()))


def parse_block(journal: str, content_type: str, base: int, buf: bytes, *,
                decode: bool, fields: pa.Schema, uuid_field: str | None,
                skip_malformed: bool = False) -> Parsed:
    """The messages of one block of ``journal`` content starting at offset ``base``.

    ``decode``: parse message fields (else frames only, for raw mode). ``uuid_field``: the
    JSON key of UUIDs to read (None: do not read them; CSV's UUID is always column 0).
    ``skip_malformed``: drop (and log) messages that do not parse, else raise ContentError.
    """
    if content_type == CONTENT_TYPE_JSON_LINES:
        if not decode:
            begins, ends, starts = _line_spans(buf, base)
            parsed = Parsed(begins, ends, values=_frames(buf, starts, ends - base))
            if uuid_field is not None:
                parsed.uuids = _parse_json(journal, base, buf, pa.schema([]), uuid_field,
                                           skip_malformed).uuids
            return parsed
        return _parse_json(journal, base, buf, fields, uuid_field, skip_malformed)
    if content_type == CONTENT_TYPE_CSV:
        return _parse_csv(journal, base, buf, fields, decode=decode,
                          uuids=uuid_field is not None, skip=skip_malformed)
    if content_type == CONTENT_TYPE_PROTO_FIXED and not decode:
        return _parse_fixed(journal, base, buf)
    if decode:
        raise ContentError(
            f"journal {journal} has content-type {content_type or '(none)'!r}, which "
            f"format('gazette') cannot decode: read it with mode=raw")
    # Unframed content: the block itself is the row.
    b = np.array([base], dtype=np.int64)
    return Parsed(b, b + len(buf), values=pa.array([buf], pa.binary()))


def uuid_bytes(journal: str, parsed: Parsed) -> npt.NDArray[np.uint8]:
    """The 16 bytes of each message's UUID (zeros where a message has none), as an
    ``(n, 16)`` array, decoded from canonical text for all rows at once."""
    n = len(parsed)
    texts = parsed.uuids
    if texts is None or n == 0:
        return np.zeros((n, 16), dtype=np.uint8)
    texts = pc.fill_null(texts, _ZERO_UUID_TEXT)
    texts = pc.if_else(pc.equal(texts, ""), _ZERO_UUID_TEXT, texts)  # CSV ACKs: empty.
    texts = pa.concat_arrays([texts]) if texts.offset else texts
    value_offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32, count=n + 1)
    lengths = np.diff(value_offsets)
    if not (lengths == 36).all():
        bad = int(np.flatnonzero(lengths != 36)[0])
        raise ContentError(f"journal {journal}: the message at offset {parsed.begins[bad]} has "
                           f"UUID {texts[bad].as_py()!r}, which is not canonical")
    data = np.frombuffer(texts.buffers()[2], dtype=np.uint8)
    chars = data[value_offsets[0]: value_offsets[0] + 36 * n].reshape(n, 36)
    nibbles = _NIBBLE[chars[:, _HEX_COLUMNS]]
    bad_rows = (nibbles == 255).any(axis=1) | (chars[:, _DASH_COLUMNS] != ord("-")).any(axis=1)
    if bad_rows.any():
        bad = int(np.flatnonzero(bad_rows)[0])
        raise ContentError(f"journal {journal}: the message at offset {parsed.begins[bad]} has "
                           f"UUID {texts[bad].as_py()!r}, which is not canonical")
    return ((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).astype(np.uint8)


def flags_of(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint16]:
    """The 10 flag bits of each UUID."""
    return (((raw[:, 8].astype(np.uint16) & 0x03) << 8) | raw[:, 9]).astype(np.uint16)


def uuid_fields(raw: npt.NDArray[np.uint8]
                ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint16]]:
    """Producer (48-bit), clock and flags of each UUID, as Gazette reads them: the message
    layer's decoder (``uuid_words``), viewed as arrays without a copy (read-only)."""
    words = uuid_words(raw.tobytes())
    return (np.frombuffer(words.producers, dtype=np.uint64),
            np.frombuffer(words.clocks, dtype=np.uint64),
            np.frombuffer(words.flags, dtype=np.uint16))


def _publish_times(raw: npt.NDArray[np.uint8], valid: npt.NDArray[np.bool_]) -> pa.Array:
    ticks = uuid_fields(raw)[1] >> np.uint64(4)  # a clock is its 60-bit timestamp, then 4 counter bits
    micros = (ticks.astype(np.int64) - G1582_NS100) // 10
    return pa.array(micros, pa.timestamp("us", tz="UTC"), mask=~valid)


def build_batch(journal: str, parsed: Parsed, schema: pa.Schema,
                keep: npt.NDArray[np.int64] | None, raw: npt.NDArray[np.uint8] | None,
                ) -> pa.RecordBatch:
    """The record batch of ``schema`` for rows ``keep`` of ``parsed`` (all when None).
    ``raw`` are the rows' UUID bytes, when known."""
    n = len(parsed) if keep is None else len(keep)
    take_idx = None if keep is None else pa.array(keep, pa.int64())

    def take(arr: Any) -> Any:
        return arr if take_idx is None else pc.take(arr, take_idx)

    uuids = take(parsed.uuids) if parsed.uuids is not None else None
    columns = []
    for f in schema:
        name = f.name
        if name == "_journal":
            col = pa.repeat(pa.scalar(journal, pa.string()), n)
        elif name == "_offset":
            col = pa.array(parsed.begins if keep is None else parsed.begins[keep], pa.int64())
        elif name == "_value":
            col = take(parsed.values) if parsed.values is not None else pa.nulls(n, pa.binary())
        elif name in ("_uuid", "_producer", "_publish_time"):
            if uuids is None:
                col = pa.nulls(n, f.type)
            elif name == "_uuid":
                col = uuids
            elif name == "_producer":
                col = pc.utf8_slice_codeunits(uuids, 24, 36)
            else:
                rows = raw if raw is None or keep is None else raw[keep]
                if rows is None:
                    col = pa.nulls(n, f.type)
                else:
                    col = _publish_times(rows, pc.is_valid(uuids).to_numpy(zero_copy_only=False))
        elif parsed.fields is not None and name in parsed.fields.column_names:
            col = take(parsed.fields.column(name).combine_chunks())
        else:
            col = pa.nulls(n, f.type)
        if not col.type.equals(f.type):
            col = col.cast(f.type)
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=schema)

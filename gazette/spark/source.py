"""``format("gazette")``: the PySpark data source over journals, batch and streaming.

The driver lists journals and fragments (``plan``); each task reads one slice of one journal
(``content``), parses it into Arrow record batches (``rows``) and, in committed mode, keeps only
what the Sequencer commits (``committed``).

Streaming offsets are a JSON object with one entry per journal: its next byte offset in raw and
uncommitted modes, and in committed mode ``{"offset": n, "producers": ["hex:ack:begin", ...]}``
(the Sequencer's checkpoint of that journal: clocks travel as text, as they exceed JSON's exact
integers). A micro-batch reads from the start offsets to the write heads seen when it was
planned (capped by ``max_bytes_per_trigger`` and, under ``availableNow``, by the heads seen when
the query started); journals matching the selector later join at offset 0.

Invariants:

* Planning (driver) reads no content, except in committed streaming: there the producer states
  at a batch's end are computed on the driver by sequencing the batch's UUIDs (a second,
  UUID-only parse of that batch), since a task has no way to hand state back to the next batch.
* Tasks open their own client and event loop and close both when Spark stops reading.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.json as pajson
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from gazette.client.journal_client import JournalClient
from gazette.message.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES
from gazette.spark.committed import CommittedFilter, ProducerTuple
from gazette.spark.content import cut_for, slice_blocks
from gazette.spark.errors import ContentError, OptionError
from gazette.spark.options import Mode, SourceOptions, parse_options
from gazette.spark.plan import (
    JournalInfo,
    JournalSlice,
    Segment,
    balance,
    list_matching,
    plan_journal,
    run_planning,
)
from gazette.spark.rows import (
    ACK_FLAG,
    Parsed,
    build_batch,
    flags_of,
    message_fields,
    parse_block,
    uuid_bytes,
)
from gazette.spark.schema import META_DDL

__all__ = ["GazetteDataSource", "read_slice"]

log = logging.getLogger(__name__)

RAW_SCHEMA: Final = "_journal string, _offset long, _value binary"
_META_DDL: Final = META_DDL
_SAMPLE_BYTES: Final = 1 << 20


class GazetteDataSource(DataSource):
    """``spark.read.format("gazette")`` and ``spark.readStream.format("gazette")``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "gazette"

    def schema(self) -> StructType | str:
        given = {k.lower(): v for k, v in self.options.items()}.get("schema")
        if given:
            return given
        if self.opts.mode is Mode.RAW:
            return RAW_SCHEMA
        return run_planning(self.opts.broker, lambda client: _infer_schema(client, self.opts))

    def reader(self, schema: StructType) -> DataSourceReader:
        return GazetteReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GazetteStreamReader(self.opts, schema)


async def _infer_schema(client: JournalClient, opts: SourceOptions) -> str:
    """Message fields from the first MiB of the first matching journal with content."""
    journals = await list_matching(client, opts.selector)
    for j in journals:
        if j.content_type != CONTENT_TYPE_JSON_LINES:
            raise OptionError("schema", f"journal {j.name} holds {j.content_type or 'unframed'} "
                                        "content: give a schema (.schema(...) or option 'schema')")
        _, slices = await plan_journal(client, j, opts, 0, _SAMPLE_BYTES)
        for sl in slices:
            async for base, buf in slice_blocks(client, sl, cut_for(j.content_type),
                                                _SAMPLE_BYTES, None):
                try:
                    table = pajson.read_json(pa.BufferReader(buf))
                except pa.ArrowInvalid as err:
                    raise ContentError(f"journal {j.name}: content at {base} is not JSON lines "
                                       f"({err}); give a schema") from None
                fields = [f for f in table.schema if f.name != opts.uuid_field]
                message = from_arrow_schema(pa.schema(fields), prefer_timestamp_ntz=False)
                ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in message)
                return f"{_META_DDL}, {ddl}" if ddl else _META_DDL
    raise OptionError("schema", f"no journal matching {opts.selector!r} has content to infer "
                                "a schema from: give one (.schema(...) or option 'schema')")


def _partitions(slices: Sequence[JournalSlice]) -> list[InputPartition]:
    return [InputPartition(sl) for sl in slices]


class GazetteReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts

        async def plan(client: JournalClient) -> list[JournalSlice]:
            out: list[JournalSlice] = []
            for j in await list_matching(client, opts.selector):
                _, slices = await plan_journal(client, j, opts)
                out.extend(slices)
            return out

        slices = balance(run_planning(opts.broker, plan), opts)
        log.info("gazette: %d partitions, %.1f MB", len(slices),
                 sum(s.size for s in slices) / 1e6)
        return _partitions(slices)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_slice(self.opts, self.schema, partition.value)


def read_slice(opts: SourceOptions, schema: StructType, sl: JournalSlice) -> Iterator[pa.RecordBatch]:
    """The record batches of one slice (runs in a Spark Python worker)."""
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    names = set(schema.fieldNames())
    wants_uuid = bool(names & {"_uuid", "_producer", "_publish_time"})
    decode = opts.mode is not Mode.RAW
    # UUIDs are parsed only when asked for, or to sequence committed messages.
    uuid_field = opts.uuid_field if (opts.mode is Mode.COMMITTED or wants_uuid) else None
    fields = message_fields(arrow_schema)
    if opts.mode is Mode.COMMITTED and sl.content_type not in (CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_CSV):
        raise ContentError(f"journal {sl.journal}: mode=committed needs the messages' UUIDs, "
                           f"which {sl.content_type or 'unframed'} content does not expose: "
                           "use mode=raw")
    loop = asyncio.new_event_loop()
    client = JournalClient(opts.broker)
    committed = None
    if opts.mode is Mode.COMMITTED:
        committed = CommittedFilter(
            sl.journal, sl.begin, sl.producers,
            reread=lambda b, e: reread(client, opts, sl, b, e, decode, fields, uuid_field))
    blocks = slice_blocks(client, sl, cut_for(sl.content_type), opts.block_bytes, opts.file_root)
    started, rows, read = time.monotonic(), 0, 0
    try:
        while True:
            try:
                base, buf = loop.run_until_complete(blocks.__anext__())
            except StopAsyncIteration:
                break
            read += len(buf)
            parsed = parse_block(sl.journal, sl.content_type, base, buf, decode=decode,
                                 fields=fields, uuid_field=uuid_field,
                                 skip_malformed=opts.skip_malformed)
            raw = uuid_bytes(sl.journal, parsed) if uuid_field is not None else None
            if committed is not None:
                assert raw is not None
                for p, r, kept in loop.run_until_complete(committed.feed(parsed, raw)):
                    kept = kept[flags_of(r[kept]) != ACK_FLAG]
                    rows += len(kept)
                    yield build_batch(sl.journal, p, arrow_schema, kept, r)
                continue
            batch = build_batch(sl.journal, parsed, arrow_schema, None, raw)
            rows += batch.num_rows
            yield batch
    finally:
        try:
            loop.run_until_complete(blocks.aclose())
            loop.run_until_complete(client.close())
        finally:
            loop.close()
        elapsed = time.monotonic() - started
        log.info("gazette: read %s [%d, %d): %d rows, %.1f MB in %.1fs", sl.journal, sl.begin,
                 sl.begin + read, rows, read / 1e6, elapsed)


async def reread(client: JournalClient, opts: SourceOptions, sl: JournalSlice, begin: int,
                 end: int, decode: bool, fields: pa.Schema, uuid_field: str | None,
                 ) -> list[tuple[Parsed, npt.NDArray[np.uint8]]]:
    """``[begin, end)`` of the slice's journal, from the brokers, parsed as the slice is."""
    again = JournalSlice(sl.journal, sl.content_type, begin, end,
                         (Segment(begin, end, begin, end, 0, ""),))
    out = []
    async for base, buf in slice_blocks(client, again, cut_for(sl.content_type),
                                        opts.block_bytes, None):
        parsed = parse_block(sl.journal, sl.content_type, base, buf, decode=decode,
                             fields=fields, uuid_field=uuid_field,
                             skip_malformed=opts.skip_malformed)
        out.append((parsed, uuid_bytes(sl.journal, parsed)))
    return out


# -- streaming ----------------------------------------------------------------------------


def _encode_state(offset: int, producers: tuple[ProducerTuple, ...]) -> dict[str, Any]:
    return {"offset": offset, "producers": [f"{p}:{ack}:{begin}" for p, ack, begin in producers]}


def _decode_state(value: Any) -> tuple[int, tuple[ProducerTuple, ...]]:
    if isinstance(value, int):
        return value, ()
    producers = []
    for text in value.get("producers", []):
        p, ack, begin = str(text).split(":")
        producers.append((p, int(ack), int(begin)))
    return int(value["offset"]), tuple(producers)


class GazetteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._target: dict[str, int] | None = None
        self._heads_seen: dict[str, int] | None = None  # By the last latestOffset.

    def _listing(self) -> tuple[list[JournalInfo], dict[str, list[int]]]:
        """Matching journals and the sorted fragment ends of each (the last: its head)."""
        opts = self.opts

        async def listing(client: JournalClient) -> tuple[list[JournalInfo], dict[str, list[int]]]:
            journals = await list_matching(client, opts.selector)
            out = {}
            for j in journals:
                resp = await client.list_fragments(j.name)
                out[j.name] = sorted({f.spec.end for f in resp.fragments}) or [0]
            return journals, out

        return run_planning(opts.broker, listing)

    def _heads(self) -> tuple[list[JournalInfo], dict[str, int]]:
        journals, ends = self._listing()
        return journals, {j: e[-1] for j, e in ends.items()}

    def _value(self, offset: int, producers: tuple[ProducerTuple, ...] = ()) -> Any:
        return _encode_state(offset, producers) if self.opts.mode is Mode.COMMITTED else offset

    def initialOffset(self) -> dict[str, Any]:
        _, heads = self._heads()
        latest = self.opts.starting == "latest"
        return {j: self._value(h if latest else 0) for j, h in heads.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        _, self._target = self._heads()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        journals, fragment_ends = self._listing()
        self._heads_seen = {j: e[-1] for j, e in fragment_ends.items()}
        start = dict(start or {})
        budget = limit.max_bytes if isinstance(limit, ReadMaxBytes) else 0
        share = max(budget // max(len(journals), 1), 1) if budget else 0
        ends: dict[str, int] = {}
        for j in journals:
            begin, _ = _decode_state(start.get(j.name, self._value(0)))
            cuts = fragment_ends[j.name]
            head = cuts[-1]
            if self._target is not None:
                head = min(head, self._target.get(j.name, 0))
            if share:
                # Whole fragments (their ends are message boundaries), at least one.
                within = [c for c in cuts if begin < c <= min(head, begin + share)]
                head = within[-1] if within else next((c for c in cuts if begin < c <= head), head)
            ends[j.name] = max(begin, head)
        if self.opts.mode is not Mode.COMMITTED:
            out: dict[str, Any] = dict(start)
            out.update(ends)
            return out
        return self._advance_committed(journals, start, ends)

    def _advance_committed(self, journals: list[JournalInfo], start: dict[str, Any],
                           ends: dict[str, int]) -> dict[str, Any]:
        """Offsets with the producer states at ``ends``, by sequencing UUIDs on the driver."""
        opts = self.opts
        out: dict[str, Any] = dict(start)

        async def advance(client: JournalClient) -> None:
            for j in journals:
                offset, producers = _decode_state(start.get(j.name, self._value(0)))
                end = ends[j.name]
                if end <= offset:
                    out[j.name] = _encode_state(offset, producers)
                    continue
                _, slices = await plan_journal(client, j, opts, offset, end, producers)
                no_fields = pa.schema([])
                for sl in slices:
                    seq = CommittedFilter(j.name, offset, producers, reread=functools.partial(
                        reread, client, opts, sl, decode=False, fields=no_fields,
                        uuid_field=opts.uuid_field))
                    async for base, buf in slice_blocks(client, sl, cut_for(sl.content_type),
                                                        opts.block_bytes, opts.file_root):
                        parsed = parse_block(j.name, sl.content_type, base, buf, decode=False,
                                             fields=no_fields, uuid_field=opts.uuid_field,
                                             skip_malformed=opts.skip_malformed)
                        await seq.feed(parsed, uuid_bytes(j.name, parsed))
                    _, producers = seq.checkpoint()
                out[j.name] = _encode_state(end, producers)

        run_planning(opts.broker, advance)
        return out

    def reportLatestOffset(self) -> dict[str, Any] | None:
        # The heads latestOffset just listed: reporting them costs no second listing.
        return dict(self._heads_seen) if self._heads_seen is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        opts = self.opts

        async def plan(client: JournalClient) -> list[JournalSlice]:
            out: list[JournalSlice] = []
            for j in await list_matching(client, opts.selector):
                if j.name not in end:
                    continue
                offset, producers = _decode_state(start.get(j.name, self._value(0)))
                stop, _ = _decode_state(end[j.name])
                if stop <= offset:
                    continue
                _, slices = await plan_journal(client, j, opts, offset, stop, producers)
                out.extend(slices)
            return out

        return _partitions(balance(run_planning(opts.broker, plan), opts))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_slice(self.opts, self.schema, partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: brokers keep no reader state."""

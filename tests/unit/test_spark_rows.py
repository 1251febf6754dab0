"""The Spark source's parsing and read-committed filtering, without Spark: property tests
against the message package (JSONFraming offsets, UUID fields, the Sequencer)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message.message import Envelope, JSONMessage
from gazette.message.sequencer import Sequencer
from gazette.message.uuid import build_uuid, clock_from_time, get_flags
from gazette.spark.committed import CommittedFilter
from gazette.spark.errors import ContentError
from gazette.spark.rows import ACK_FLAG, build_batch, flags_of, parse_block, uuid_bytes

JSONL = "application/x-ndjson"
CSV = "text/csv"
FIELDS = pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.string())])
ARROW = pa.schema([pa.field("_journal", pa.string()), pa.field("_offset", pa.int64()),
                   pa.field("_uuid", pa.string()), pa.field("_producer", pa.string()),
                   pa.field("_publish_time", pa.timestamp("us", tz="UTC")),
                   pa.field("n", pa.int64()), pa.field("s", pa.string())])

producers = st.sampled_from([b"\x01" * 6, b"\x02" * 6, b"\xfe\xdc\xba\x98\x76\x54"])
messages = st.lists(st.tuples(producers, st.integers(1, 40), st.sampled_from([0, 1, 2]),
                              st.integers(-(2**40), 2**40), st.text(max_size=12),
                              st.booleans()), min_size=1, max_size=60)


def _lines(msgs: list[Any]) -> tuple[bytes, list[int]]:
    """NDJSON of the messages (some with a blank line after), and each message's offset."""
    out, offsets = b"", []
    for producer, clock, flags, n, s, blank in msgs:
        offsets.append(len(out))
        doc = {"UUID": str(build_uuid(producer, clock, flags)), "n": n, "s": s}
        out += json.dumps(doc).encode() + b"\n" + (b"\n" if blank else b"")
    return out, offsets


@settings(max_examples=200, deadline=None)
@given(messages, st.integers(0, 1 << 40))
def test_json_block_offsets_fields_and_uuids(msgs: list[Any], base: int) -> None:
    buf, offsets = _lines(msgs)
    parsed = parse_block("j", JSONL, base, buf, decode=True, fields=FIELDS, uuid_field="UUID")
    assert parsed.begins.tolist() == [base + o for o in offsets]
    raw = uuid_bytes("j", parsed)
    batch = build_batch("j", parsed, ARROW, None, raw)
    assert batch.column("n").to_pylist() == [m[3] for m in msgs]
    assert batch.column("s").to_pylist() == [m[4] for m in msgs]
    for i, (producer, clock, flags, *_) in enumerate(msgs):
        u = build_uuid(producer, clock, flags)
        assert raw[i].tobytes() == u.bytes
        assert flags_of(raw)[i] == get_flags(u)
        assert batch.column("_producer")[i].as_py() == producer.hex()
    # Raw frames are the lines without their newline.
    frames = parse_block("j", JSONL, base, buf, decode=False, fields=FIELDS, uuid_field=None)
    assert frames.values is not None
    assert [bytes(v.as_py()) for v in frames.values] == [line for line in buf.split(b"\n") if line]


def test_publish_time_is_the_uuid_clock() -> None:
    when = 1_700_000_000_123_456_000
    line = json.dumps({"UUID": str(build_uuid(b"\x01" * 6, clock_from_time(when), 0)), "n": 1})
    parsed = parse_block("j", JSONL, 0, line.encode() + b"\n", decode=True, fields=FIELDS,
                         uuid_field="UUID")
    batch = build_batch("j", parsed, ARROW, None, uuid_bytes("j", parsed))
    got = batch.column("_publish_time")[0].value  # Microseconds since the epoch.
    assert got == when // 1000


def test_csv_records_with_uuid_in_column_zero() -> None:
    u = build_uuid(b"\x03" * 6, 77, 0)
    buf = f'{u},5,"a,b"\n{u},6,"line\nbreak"\n'.encode()
    parsed = parse_block("j", CSV, 100, buf, decode=True, fields=FIELDS, uuid_field="UUID")
    assert parsed.begins.tolist() == [100, 100 + buf.index(b"\n") + 1]
    batch = build_batch("j", parsed, ARROW, None, uuid_bytes("j", parsed))
    assert batch.column("n").to_pylist() == [5, 6]
    assert batch.column("s").to_pylist() == ["a,b", "line\nbreak"]
    assert batch.column("_uuid").to_pylist() == [str(u), str(u)]


def test_bad_content_names_the_journal_and_offsets() -> None:
    with pytest.raises(ContentError, match="journal j: the message at offset 19 is not JSON"):
        parse_block("j", JSONL, 10, b'{"n": 1}\n{"n": \n', decode=True, fields=FIELDS,
                    uuid_field="UUID")
    with pytest.raises(ContentError, match=r"journal j: the message at offset 6 is not a CSV"):
        parse_block("j", CSV, 0, b"u,1,a\nu,x,b\n", decode=True, fields=FIELDS, uuid_field="UUID")
    parsed = parse_block("j", JSONL, 0, b'{"UUID": "not-a-uuid", "n": 1}\n', decode=True,
                         fields=FIELDS, uuid_field="UUID")
    with pytest.raises(ContentError, match="offset 0 has UUID 'not-a-uuid'"):
        uuid_bytes("j", parsed)


def _reference(msgs: list[Any], buf: bytes, offsets: list[int], ring: int = 8) -> list[int]:
    """Offsets of the non-ACK messages the message package's Sequencer commits, with the same
    ring as the filter under test: anomalous publishing (a clock running backwards inside a
    transaction) sequences differently from the ring than from a replay, in the Sequencer as
    in Gazette's, and the filter must match the Sequencer's own behaviour."""
    seq = Sequencer(ring_size=ring)
    ends = offsets[1:] + [len(buf)] if offsets else []
    out: list[int] = []
    for (producer, clock, flags, n, s, _), b, e in zip(msgs, offsets, ends, strict=True):
        doc = {"UUID": str(build_uuid(producer, clock, flags)), "n": n, "s": s}
        env = Envelope("j", b, e, JSONMessage(doc))
        seq.queue_uncommitted(env)
        if seq.dequeuing():
            while True:
                try:
                    got = seq.step()
                except RuntimeError:
                    _, rb, re_ = seq.replay_range()
                    replay = [Envelope("j", ob, oe, JSONMessage(
                        {"UUID": str(build_uuid(p, c, f))}))
                        for (p, c, f, *_), ob, oe in zip(msgs, offsets, ends, strict=True)
                        if rb <= ob and oe <= re_]
                    seq.start_replay(replay)
                    continue
                if got is None:
                    break
                if get_flags(got.message.get_uuid()) != ACK_FLAG:
                    out.append(got.begin)
    return sorted(out)


@settings(max_examples=300, deadline=None)
@given(messages, st.lists(st.integers(1, 20), min_size=1, max_size=10), st.integers(1, 16))
def test_committed_filter_commits_what_the_sequencer_commits(
        msgs: list[Any], cuts: list[int], ring: int) -> None:
    buf, offsets = _lines(msgs)
    want = _reference(msgs, buf, offsets, ring)
    filt = CommittedFilter("j", 0, ring_size=ring)
    got: list[int] = []
    # Blocks of random sizes in messages, on message boundaries.
    starts = [0]
    for c in cuts:
        if starts[-1] + c < len(offsets):
            starts.append(starts[-1] + c)
    bounds = [offsets[i] for i in starts] + [len(buf)]
    for b, e in zip(bounds, bounds[1:], strict=False):
        if b == e:
            continue
        parsed = parse_block("j", JSONL, b, buf[b:e], decode=True, fields=FIELDS,
                             uuid_field="UUID")
        for p, raw, keep in asyncio.run(filt.feed(parsed, uuid_bytes("j", parsed))):
            keep = keep[flags_of(raw[keep]) != ACK_FLAG]
            got.extend(p.begins[keep].tolist())
    assert sorted(got) == want


@st.composite
def transactions(draw: Any) -> list[Any]:
    """Mostly well-formed publishing (transactions of several messages with an ACK, or
    OUTSIDE_TXN messages, clocks rising per producer), with occasional anomalies: the
    Sequencer's fast and general paths both."""
    clocks = {p: draw(st.integers(1, 5)) for p in (b"\x01" * 6, b"\x02" * 6, b"\x03" * 6)}
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 25))):
        p = draw(st.sampled_from(sorted(clocks)))
        kind = draw(st.sampled_from(["txn", "txn", "txn", "outside", "open", "anomaly"]))
        if kind == "anomaly":
            out.append((p, draw(st.integers(1, clocks[p] + 2)), draw(st.sampled_from([0, 1, 2])),
                        0, "x", False))
            continue
        if kind == "outside":
            clocks[p] += 1
            out.append((p, clocks[p], 0, clocks[p], "o", False))
            continue
        for _ in range(draw(st.integers(1, 6))):
            clocks[p] += 1
            out.append((p, clocks[p], 1, clocks[p], "c", draw(st.booleans())))
        if kind == "txn":
            clocks[p] += 1
            out.append((p, clocks[p], 2, 0, "", False))
    return out


@settings(max_examples=300, deadline=None)
@given(transactions(), st.lists(st.integers(1, 20), min_size=1, max_size=10), st.integers(1, 16))
def test_committed_filter_fast_path_matches_the_sequencer(
        msgs: list[Any], cuts: list[int], ring: int) -> None:
    test_committed_filter_commits_what_the_sequencer_commits.hypothesis.inner_test(  # type: ignore[attr-defined]
        msgs, cuts, ring)


@settings(max_examples=100, deadline=None)
@given(st.one_of(messages, transactions()), st.integers(0, 60))
def test_committed_checkpoint_resumes_exactly(msgs: list[Any], split: int) -> None:
    """A filter restored from another's checkpoint emits what the other would have."""
    buf, offsets = _lines(msgs)
    want = _reference(msgs, buf, offsets)
    split = min(split, len(msgs))
    mid = offsets[split] if split < len(offsets) else len(buf)

    def run(filt: CommittedFilter, begin: int, end: int) -> list[int]:
        if begin >= end:
            return []
        parsed = parse_block("j", JSONL, begin, buf[begin:end], decode=True, fields=FIELDS,
                             uuid_field="UUID")
        out = []
        for p, raw, keep in asyncio.run(filt.feed(parsed, uuid_bytes("j", parsed))):
            keep = keep[flags_of(raw[keep]) != ACK_FLAG]
            out.extend(p.begins[keep].tolist())
        return out

    first = CommittedFilter("j", 0)
    got = run(first, 0, mid)
    offset, producers = first.checkpoint()
    assert offset <= mid  # The end of the last message (blank lines may follow it).

    async def reread(b: int, e: int) -> list[Any]:
        parsed = parse_block("j", JSONL, b, buf[b:e], decode=True, fields=FIELDS,
                             uuid_field="UUID")
        return [(parsed, uuid_bytes("j", parsed))]

    got += run(CommittedFilter("j", mid, producers, reread=reread), mid, len(buf))
    assert sorted(got) == want
    assert len(got) == len(set(got))


def test_uuid_bytes_of_messages_without_uuids_are_zero() -> None:
    parsed = parse_block("j", JSONL, 0, b'{"n": 1}\n', decode=True, fields=FIELDS,
                         uuid_field="UUID")
    assert not np.any(uuid_bytes("j", parsed))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-100, 100), st.sampled_from(["ok", "bad-json", "bad-type"])),
                min_size=1, max_size=40))
def test_skip_malformed_keeps_exactly_the_good_messages(docs: list[tuple[int, str]]) -> None:
    buf, want = b"", []
    for n, kind in docs:
        offset = len(buf)
        if kind == "ok":
            want.append((offset, n))
            buf += json.dumps({"n": n}).encode() + b"\n"
        elif kind == "bad-json":
            buf += b'{"n": ' + str(n).encode() + b"\n"
        else:
            buf += json.dumps({"n": f"not-{n}"}).encode() + b"\n"
    parsed = parse_block("j", JSONL, 0, buf, decode=True, fields=FIELDS, uuid_field="UUID",
                         skip_malformed=True)
    assert parsed.fields is not None
    assert list(zip(parsed.begins.tolist(), parsed.fields.column("n").to_pylist(), strict=True)) == want


def test_fixed_frames_are_raw_rows() -> None:
    from gazette.message.framing import CONTENT_TYPE_PROTO_FIXED, FixedFraming

    framing = FixedFraming()
    payloads = [b"\x08\x01", b"", b"\x12\x03abc"]
    buf = b"".join(framing.marshal(p) for p in payloads)
    parsed = parse_block("j", CONTENT_TYPE_PROTO_FIXED, 40, buf, decode=False, fields=FIELDS,
                         uuid_field=None)
    assert parsed.values is not None and parsed.values.to_pylist() == payloads
    assert parsed.begins.tolist() == [40, 50, 58]
    with pytest.raises(ContentError, match="cannot decode: read it with mode=raw"):
        parse_block("j", CONTENT_TYPE_PROTO_FIXED, 0, buf, decode=True, fields=FIELDS,
                    uuid_field=None)

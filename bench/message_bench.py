"""Message-layer throughput in process: the codecs, read-committed and publish paths' own Python cost.

Read path: journal content of ~100-byte JSON-lines messages is cut into fixed-size chunks
(not aligned to messages, as a reader receives them) and served from memory. Publish path:
a Publisher over an appender that queues nothing (``BufferedAppender`` shape), so the
figures exclude the client and broker. Prints messages/s for:

* ``framing``: JSONFraming.decode alone (split + JSON parse);
* ``uncommitted``: ReadUncommittedIter (adds JSONMessage + Envelope per message);
* ``committed/outside``: ReadCommittedIter over OUTSIDE_TXN messages of 4 producers;
* ``committed/txn``: ReadCommittedIter over transactions of 10 CONTINUE_TXN messages and an
  ACK, 4 producers interleaved, served from the sequencer ring;
* ``marshal``, ``marshal_many``: JSONFraming encoding alone, a message per call and 1000;
* ``publish/1``, ``publish/4``: ``publish_committed`` per message to one journal, and to four
  by ``modulo_mapping`` on a key (stamp, map, frame);
* ``publish_many/4``: ``publish_committed_many`` over slices of 1000, four journals.

Each JSON row runs three codecs over the same lines, side by side: ``stdlib`` (JSONMessage
through :class:`~gazette.message.framing.StdlibJSONFraming`, the standard library's json:
the codec before msgspec), ``msgspec`` (JSONMessage through JSONFraming, today's codec) and
``typed`` (a ``TypedMessage``, a msgspec Struct decoded straight from the bytes and
validated), with the ratios to ``stdlib``. Then the CSV and fixed framings: ``before`` is
the record-at-a-time path they had (kept here as the reference), ``after`` today's.

Rates are by CPU time of this process (steadier on a shared machine than wall time, which
is printed after them), the best of several runs, the codecs of a row alternating run by
run. Not a timed assertion: compare ratios within one run (see the design notes on noisy
machines).

    python bench/message_bench.py [--messages 200000] [--chunk 65536] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gazette.message import (
    ACK_TXN,
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Chunk,
    ChunkSource,
    CSVFraming,
    Decoded,
    FixedFraming,
    JSONFraming,
    JSONMessage,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    build_uuid,
    modulo_mapping,
    new_producer_id,
    register_framing,
)
from gazette.message.framing import StdlibJSONFraming
from gazette.message.mapping import MappingFunc
from gazette.message.reading import batch_decoder, message_framing
from gazette.message.typed import TypedMessage
from gazette.protocol import protocol_pb2 as pb

JOURNAL = "bench/journal"


class Row(TypedMessage):
    """The bench's message as a typed class: the same fields as the JSONMessage docs."""

    key: str
    n: int
    pad: str


class PubRow(TypedMessage):
    key: str
    n: int
    ok: bool
    pad: str


Run = Callable[[bytes, int], Coroutine[Any, Any, int]]
#: The JSON codecs each JSON row compares: the first is the baseline of the ratios.
CODECS = ("stdlib", "msgspec", "typed")


def codec(kind: str) -> tuple[Any, Any]:
    """The framing and batch decoder of the bench's message for a codec of CODECS."""
    if kind == "stdlib":
        return StdlibJSONFraming(), JSONMessage.from_json_many
    if kind == "msgspec":
        return JSONFraming(), JSONMessage.from_json_many
    framing = message_framing(Row, JSONFraming())
    return framing, batch_decoder(Row, framing)


def journal_content(count: int, transactional: bool) -> bytes:
    framing = JSONFraming()
    producers = [new_producer_id() for _ in range(4)]
    clocks = [1 << 60] * 4
    msgs = []
    for i in range(count):
        p = i % 4
        clocks[p] += 160
        if transactional:
            flags = ACK_TXN if (i // 4) % 11 == 10 else CONTINUE_TXN
        else:
            flags = OUTSIDE_TXN
        msg = JSONMessage({"key": f"user-{i % 997:04d}", "n": i, "pad": "x" * 12})
        msg.set_uuid(build_uuid(producers[p], clocks[p], flags))
        msgs.append(msg)
    return framing.marshal_many(msgs)


class MemorySource:
    """Serves content in fixed-size chunks, then ends."""

    def __init__(self, content: bytes, chunk: int) -> None:
        self._chunks = [content[i : i + chunk] for i in range(0, len(content), chunk)]
        self._offset = 0
        self._next = 0

    async def read(self) -> Chunk | None:
        if self._next == len(self._chunks):
            return None
        data = self._chunks[self._next]
        self._next += 1
        out = Chunk(JOURNAL, self._offset, data)
        self._offset += len(data)
        return out


def no_replay(journal: str, begin: int, end: int) -> ChunkSource:
    raise AssertionError("the bench is sized to be served from the ring")


def run_framing(kind: str) -> Run:
    return run_decode(codec(kind)[0].decode)


def run_uncommitted(kind: str) -> Run:
    async def run(content: bytes, chunk: int) -> int:
        it = ReadUncommittedIter(MemorySource(content, chunk), *codec(kind))
        n = 0
        while batch := await it.next_batch():
            n += len(batch)
        return n

    return run


def run_committed(kind: str) -> Run:
    async def run(content: bytes, chunk: int) -> int:
        it = ReadCommittedIter(
            MemorySource(content, chunk), *codec(kind), Sequencer(ring_size=4096), no_replay)
        n = 0
        while batch := await it.next_batch():
            n += len(batch)
        return n

    return run


class NullAppender:
    """A BufferedAppender that drops what it is given: the Publisher's cost alone."""

    writable = True

    def append_nowait(self, journal: str, data: bytes) -> None:
        return None

    async def wait_writable(self) -> None:
        return None


def publish_docs(count: int) -> list[dict[str, Any]]:
    """~50 bytes of fields: with the UUID the Publisher stamps, a 100-byte line."""
    return [
        {"key": f"user-{(i * 7919) % 1009:05d}", "n": i, "ok": True, "pad": "abcdefgh"}
        for i in range(count)
    ]


def listing(count: int) -> pb.ListResponse:
    resp = pb.ListResponse()
    for i in range(count):
        spec = resp.journals.add().spec
        spec.name = f"bench/part-{i:03d}"
        spec.labels.labels.add(name=CONTENT_TYPE, value=CONTENT_TYPE_JSON_LINES)
    return resp


def key_of(msg: Any) -> bytes:
    key: str = msg.doc["key"] if type(msg) is JSONMessage else msg.key
    return key.encode()


def one_journal(msg: Any) -> tuple[str, str]:
    return ("bench/part-000", CONTENT_TYPE_JSON_LINES)


def four_journals() -> MappingFunc:
    parts = listing(4)
    return modulo_mapping(key_of, lambda: parts)


def publisher(mapping: MappingFunc, many: bool, msgs: list[Any], kind: str = "msgspec") -> Run:
    """A publish run of ``msgs`` (built beforehand; publishing again re-stamps them), the
    JSON-lines content-type served by the framing of codec ``kind`` for its duration."""

    async def run(content: bytes, count: int) -> int:
        if kind == "stdlib":
            register_framing(CONTENT_TYPE_JSON_LINES, StdlibJSONFraming)
        try:
            pub = Publisher(NullAppender())
            if many:
                for i in range(0, count, 1000):
                    await pub.publish_committed_many(mapping, msgs[i : i + 1000])
            else:
                publish = pub.publish_committed
                for msg in msgs:
                    await publish(mapping, msg)
        finally:
            register_framing(CONTENT_TYPE_JSON_LINES, JSONFraming)
        return count

    return run


def run_marshal(framing: Any, msgs: list[Any], many: bool) -> Run:
    """Encoding alone: ``msgs`` framed one per call, or 1000 per ``marshal_many``."""

    async def run(content: bytes, count: int) -> int:
        if many:
            for i in range(0, len(msgs), 1000):
                framing.marshal_many(msgs[i : i + 1000])
        else:
            marshal = framing.marshal
            for msg in msgs:
                marshal(msg)
        return len(msgs)

    return run


def run_decode(decode: Callable[[bytes], Decoded]) -> Run:
    """A framing's batch decode over the content in chunks, the tail carried over."""

    async def run(content: bytes, chunk: int) -> int:
        tail, n = b"", 0
        for i in range(0, len(content), chunk):
            buf = tail + content[i : i + chunk]
            decoded = decode(buf)
            tail = buf[decoded.consumed :]
            n += len(decoded.values)
        return n

    return run


def csv_marshal_before(msgs: list[Any]) -> bytes:
    """CSVFraming.marshal_many as it was: a writer call per record, its terminator cut."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    records: list[str] = []
    for msg in msgs:
        out.seek(0)
        out.truncate()
        writer.writerow(CSVFraming._record(msg))  # noqa: SLF001 - the path as it was
        records.append(out.getvalue()[:-2])
    records.append("")
    return "\n".join(records).encode()


def csv_decode_before(buffer: bytes) -> Decoded:
    """CSVFraming.decode as it was (its fast path): split, decode each frame, one reader."""
    u = CSVFraming().unpack(buffer)
    texts = [f.decode() for f in u.frames if isinstance(f, bytes)]
    rows: list[Any] = list(csv.reader(texts, strict=True))
    assert len(rows) == len(u.frames) and all(rows)
    return Decoded(rows, u.ends, u.consumed, 0)


def fixed_marshal_many_before(msgs: list[bytes]) -> bytes:
    """FixedFraming.marshal_many as it was: each frame built, then all joined."""
    f = FixedFraming()
    return b"".join([f.marshal(m) for m in msgs])


class _Marshal:
    """A framing whose marshal_many is ``fn`` (what run_marshal calls)."""

    def __init__(self, fn: Callable[[Any], bytes]) -> None:
        self.marshal_many = fn


def compare(
    name: str, runs_of: dict[str, Run], content: bytes, chunk: int, runs: int, expect: int
) -> None:
    """One row: each codec of ``runs_of`` timed ``runs`` times, alternating, best kept."""
    cpu_best = dict.fromkeys(runs_of, 0.0)
    wall_best = dict.fromkeys(runs_of, 0.0)
    for _ in range(runs):
        for label, fn in runs_of.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            n = asyncio.run(fn(content, chunk))
            elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            assert n == expect, (name, label, n, expect)
            cpu_best[label] = max(cpu_best[label], n / cpu)
            wall_best[label] = max(wall_best[label], n / elapsed)
    labels = list(runs_of)
    base = cpu_best[labels[0]]
    cells = "".join(f"{label} {cpu_best[label] / 1e3:6.0f}k ({1e6 / cpu_best[label]:5.2f} µs)  "
                    for label in labels)
    ratios = "  ".join(f"{label}/{labels[0]} {cpu_best[label] / base:5.2f}x"
                       for label in labels[1:])
    walls = " ".join(f"{wall_best[label] / 1e3:.0f}k" for label in labels)
    print(f"{name:<19} {cells}| {ratios}  | wall {walls}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=64 * 1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    outside = journal_content(args.messages, transactional=False)
    txn = journal_content(args.messages, transactional=True)
    n, chunk, runs = args.messages, args.chunk, args.runs
    print(
        f"{n} messages of {len(outside) / n:.0f} bytes, {chunk}-byte chunks; msgs per CPU-s "
        f"(µs per msg), best of {runs} alternated; ratios by CPU rate"
    )

    def json_row(name: str, make: Callable[[str], Run], content: bytes, expect: int) -> None:
        compare(name, {kind: make(kind) for kind in CODECS}, content, chunk, runs, expect)

    json_row("framing", run_framing, outside, n)
    json_row("uncommitted", run_uncommitted, outside, n)
    json_row("committed/outside", run_committed, outside, n)
    json_row("committed/txn", run_committed, txn, _txn_expect(n))

    docs = publish_docs(n)
    stamped = [JSONMessage(dict(d, UUID=str(build_uuid(new_producer_id(), 1 << 60, 0))))
               for d in docs]
    typed_rows = [PubRow(**d) for d in docs]
    for r, m in zip(typed_rows, stamped, strict=True):
        r.set_uuid_int(m.uuid_int)
    for name, many in (("marshal", False), ("marshal_many", True)):
        compare(name, {"stdlib": run_marshal(StdlibJSONFraming(), stamped, many),
                       "msgspec": run_marshal(JSONFraming(), stamped, many),
                       "typed": run_marshal(JSONFraming(), typed_rows, many)},
                b"", n, runs, n)
    for name, mapping, many in (("publish/1", one_journal, False),
                                ("publish/4", four_journals(), False),
                                ("publish_many/4", four_journals(), True)):
        # Afresh: publishing JSONMessages stamps UUIDs into them.
        compare(name, {
            "stdlib": publisher(mapping, many, [JSONMessage(d) for d in publish_docs(n)],
                                "stdlib"),
            "msgspec": publisher(mapping, many, [JSONMessage(d) for d in publish_docs(n)]),
            "typed": publisher(mapping, many, [PubRow(**d) for d in publish_docs(n)]),
        }, b"", n, runs, n)

    records = [[str(m.get_uuid()), m.doc["key"], str(m.doc["n"]), m.doc["pad"]]
               for m in stamped]
    csv_content = CSVFraming().marshal_many(records)
    print(f"CSV: {len(csv_content) / n:.0f}-byte records; fixed: ~100-byte payloads")
    compare("csv decode", {"before": run_decode(csv_decode_before),
                           "after": run_decode(CSVFraming().decode)}, csv_content, chunk, runs, n)
    compare("csv marshal_many", {
        "before": run_marshal(_Marshal(csv_marshal_before), records, many=True),
        "after": run_marshal(CSVFraming(), records, many=True)}, b"", n, runs, n)
    payloads = [line.encode() for line in csv_content.decode().splitlines()]
    fixed_content = FixedFraming().marshal_many(payloads)
    compare("fixed decode", {"after": run_decode(FixedFraming().decode)},
            fixed_content, chunk, runs, n)
    compare("fixed marshal_many", {
        "before": run_marshal(_Marshal(fixed_marshal_many_before), payloads, many=True),
        "after": run_marshal(FixedFraming(), payloads, many=True)}, b"", n, runs, n)


def _txn_expect(n: int) -> int:
    # Message i belongs to producer i % 4 and round i // 4; every 11th round is an ACK that
    # commits the 10 rounds before it. Rounds after the last ACK stay pending.
    out = 0
    for p in range(4):
        own = len(range(p, n, 4))
        last_ack_round = max((r for r in range(own) if r % 11 == 10), default=-1)
        out += last_ack_round + 1
    return out


if __name__ == "__main__":
    main()

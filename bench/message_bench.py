"""Message-layer throughput in process: the read-committed and publish paths' own Python cost.

Read path: journal content of ~100-byte JSON-lines messages is cut into fixed-size chunks
(not aligned to messages, as a reader receives them) and served from memory. Publish path:
a Publisher over an appender that queues nothing (``BufferedAppender`` shape), so the
figures exclude the client and broker. Prints messages/s for:

* ``framing``: JSONFraming.decode alone (split + JSON parse);
* ``uncommitted``: ReadUncommittedIter (adds JSONMessage + Envelope per message);
* ``committed/outside``: ReadCommittedIter over OUTSIDE_TXN messages of 4 producers;
* ``committed/txn``: ReadCommittedIter over transactions of 10 CONTINUE_TXN messages and an
  ACK, 4 producers interleaved, served from the sequencer ring;
* ``publish/1``, ``publish/4``: ``publish_committed`` per message to one journal, and to four
  by ``modulo_mapping`` on a key (stamp, map, frame);
* ``publish_many/4``: ``publish_committed_many`` over slices of 1000, four journals.

Each read and publish figure is printed for ``JSONMessage`` (dicts, the standard library's
JSON scanner) and for a typed message (``TypedMessage``, a msgspec Struct decoded straight
from the bytes and validated) over the same lines, with their ratio.

Reports the best of several runs, by wall time and by CPU time of this process (the
latter is steadier on a shared machine). Not a timed assertion: compare ratios within one
run (see the design notes on noisy machines).

    python bench/message_bench.py [--messages 200000] [--chunk 65536] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
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
    JSONFraming,
    JSONMessage,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    build_uuid,
    modulo_mapping,
    new_producer_id,
)
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


def codec(typed: bool) -> tuple[Any, Any]:
    """The framing and batch decoder of the bench's message, plain or typed."""
    if not typed:
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


def run_framing(typed: bool) -> Callable[[bytes, int], Coroutine[Any, Any, int]]:
    async def run(content: bytes, chunk: int) -> int:
        framing = codec(typed)[0]
        tail, n = b"", 0
        for i in range(0, len(content), chunk):
            buf = tail + content[i : i + chunk]
            decoded = framing.decode(buf)
            tail = buf[decoded.consumed :]
            n += len(decoded.values)
        return n

    return run


def run_uncommitted(typed: bool) -> Callable[[bytes, int], Coroutine[Any, Any, int]]:
    async def run(content: bytes, chunk: int) -> int:
        it = ReadUncommittedIter(MemorySource(content, chunk), *codec(typed))
        n = 0
        while batch := await it.next_batch():
            n += len(batch)
        return n

    return run


def run_committed(typed: bool) -> Callable[[bytes, int], Coroutine[Any, Any, int]]:
    async def run(content: bytes, chunk: int) -> int:
        it = ReadCommittedIter(
            MemorySource(content, chunk), *codec(typed), Sequencer(ring_size=4096), no_replay)
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


def publisher(
    mapping: MappingFunc, many: bool, msgs: list[Any]
) -> Callable[[bytes, int], Coroutine[Any, Any, int]]:
    """A publish run of ``msgs`` (built beforehand; publishing again re-stamps them)."""

    async def run(content: bytes, count: int) -> int:
        pub = Publisher(NullAppender())
        if many:
            for i in range(0, count, 1000):
                await pub.publish_committed_many(mapping, msgs[i : i + 1000])
        else:
            publish = pub.publish_committed
            for msg in msgs:
                await publish(mapping, msg)
        return count

    return run


def measure(
    name: str,
    fn: Callable[[bytes, int], Coroutine[Any, Any, int]],
    content: bytes,
    chunk: int,
    runs: int,
    expect: int,
) -> float:
    rates, cpu_rates = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        n = asyncio.run(fn(content, chunk))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        assert n == expect, (name, n, expect)
        rates.append(n / elapsed)
        cpu_rates.append(n / cpu)
    rate, cpu_rate = max(rates), max(cpu_rates)
    print(
        f"{name:<24} {rate / 1e3:6.0f} k msgs/s wall ({1e6 / rate:5.2f} µs/msg), "
        f"{cpu_rate / 1e3:6.0f} k msgs/CPU-s ({1e6 / cpu_rate:5.2f} µs/msg), best of {runs}"
    )
    return cpu_rate


def both(
    name: str,
    make: Callable[[bool], Callable[[bytes, int], Coroutine[Any, Any, int]]],
    content: bytes,
    chunk: int,
    runs: int,
    expect: int,
) -> None:
    """``name`` with JSONMessage, then typed, then the ratio (by CPU rate)."""
    plain = measure(f"{name}", make(False), content, chunk, runs, expect)
    typed = measure(f"{name} typed", make(True), content, chunk, runs, expect)
    print(f"{'':<24} typed / JSONMessage: {typed / plain:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=64 * 1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    outside = journal_content(args.messages, transactional=False)
    txn = journal_content(args.messages, transactional=True)
    print(
        f"{args.messages} messages of {len(outside) / args.messages:.0f} bytes, "
        f"{args.chunk}-byte chunks"
    )
    n = args.messages
    both("framing", run_framing, outside, args.chunk, args.runs, n)
    both("uncommitted", run_uncommitted, outside, args.chunk, args.runs, n)
    both("committed/outside", run_committed, outside, args.chunk, args.runs, n)
    both("committed/txn", run_committed, txn, args.chunk, args.runs, _txn_expect(n))
    for name, mapping, many in (("publish/1", one_journal, False),
                                ("publish/4", four_journals(), False),
                                ("publish_many/4", four_journals(), True)):
        docs = publish_docs(n)  # afresh: publishing JSONMessages stamps UUIDs into them
        rows = [PubRow(**d) for d in docs]
        plain = measure(name, publisher(mapping, many, [JSONMessage(d) for d in docs]), b"", n,
                        args.runs, n)
        typed = measure(f"{name} typed", publisher(mapping, many, rows), b"", n, args.runs, n)
        print(f"{'':<24} typed / JSONMessage: {typed / plain:.2f}x")


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

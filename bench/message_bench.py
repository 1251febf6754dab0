"""Message read-path throughput: JSON lines decoded, sequenced and delivered read-committed.

Journal content of ~100-byte JSON-lines messages is cut into fixed-size chunks (not aligned
to messages, as a reader receives them) and served from memory, so the figures are the
message layer's own Python cost per message. Prints messages/s for:

* ``framing``: JSONFraming.decode alone (split + JSON parse);
* ``uncommitted``: ReadUncommittedIter (adds JSONMessage + Envelope per message);
* ``committed/outside``: ReadCommittedIter over OUTSIDE_TXN messages of 4 producers;
* ``committed/txn``: ReadCommittedIter over transactions of 10 CONTINUE_TXN messages and an
  ACK, 4 producers interleaved, served from the sequencer ring.

Reports the best of several runs, by wall time and by CPU time of this process (the
latter is steadier on a shared machine). Not a timed assertion: compare ratios within one
run (see the design notes on noisy machines).

    python bench/message_bench.py [--messages 200000] [--chunk 65536] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Chunk,
    ChunkSource,
    JSONFraming,
    JSONMessage,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    build_uuid,
    new_producer_id,
)

JOURNAL = "bench/journal"


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


async def run_framing(content: bytes, chunk: int) -> int:
    framing = JSONFraming()
    tail, n = b"", 0
    for i in range(0, len(content), chunk):
        buf = tail + content[i : i + chunk]
        decoded = framing.decode(buf)
        tail = buf[decoded.consumed :]
        n += len(decoded.values)
    return n


async def run_uncommitted(content: bytes, chunk: int) -> int:
    it = ReadUncommittedIter(
        MemorySource(content, chunk), JSONFraming(), JSONMessage.from_json_many
    )
    n = 0
    while batch := await it.next_batch():
        n += len(batch)
    return n


async def run_committed(content: bytes, chunk: int) -> int:
    it = ReadCommittedIter(
        MemorySource(content, chunk),
        JSONFraming(),
        JSONMessage.from_json_many,
        Sequencer(ring_size=4096),
        no_replay,
    )
    n = 0
    while batch := await it.next_batch():
        n += len(batch)
    return n


def measure(
    name: str,
    fn: Callable[[bytes, int], Coroutine[Any, Any, int]],
    content: bytes,
    chunk: int,
    runs: int,
    expect: int,
) -> None:
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
        f"{name:<18} {rate / 1e3:6.0f} k msgs/s wall ({1e6 / rate:5.2f} µs/msg), "
        f"{cpu_rate / 1e3:6.0f} k msgs/CPU-s ({1e6 / cpu_rate:5.2f} µs/msg), best of {runs}"
    )


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
    measure("framing", run_framing, outside, args.chunk, args.runs, n)
    measure("uncommitted", run_uncommitted, outside, args.chunk, args.runs, n)
    measure("committed/outside", run_committed, outside, args.chunk, args.runs, n)
    measure("committed/txn", run_committed, txn, args.chunk, args.runs, _txn_expect(n))


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

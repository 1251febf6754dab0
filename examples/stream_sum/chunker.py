"""The chunker: publishes the chunks of many concurrent streams and verifies every sum.

Each of ``workers`` workers picks, per chunk, one of its open streams or (while its budget of
``streams`` lasts; negative is endless) a new one, as Gazette's chunker does, and publishes the
stream's next chunk, committed, to the partition its ID maps to. When a stream's last chunk is
out the worker waits for the stream's ``Sum``, read committed from ``examples/stream-sum/sums``
from the offset of a barrier appended at start. It warns at growing delays and fails at the SLA.

Invariants (a failure raises ``StreamSumError`` and ends the run):

* every sum of this chunker's streams equals the one computed here, sequence number and value;
* no sum of ours arrives twice;
* no sum takes longer than ``sla`` seconds after its last chunk was published.

Run: ``python -m examples.stream_sum.chunker --streams 100 --chunks 50 --workers 4``
(``--broker.address`` or ``BROKER_ADDRESS``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from examples.stream_sum.messages import (
    CHUNK_LABEL,
    SUMS_JOURNAL,
    ZERO,
    Chunk,
    StreamSumError,
    Sum,
    update,
)
from gazette.client import AppendService, AsyncAppend, JournalClient, list_journals
from gazette.client.appender import append
from gazette.consumer import is_ack
from gazette.message import Publisher, modulo_mapping, read_committed

__all__ = ["Totals", "run_chunker"]

log = logging.getLogger("stream_sum.chunker")

# Delays at which a missing sum is reported (seconds), before the SLA fails the run.
_WARN_AT = (2, 5, 10, 20, 30)


@dataclass
class Totals:
    streams: int = 0  # verified
    chunks: int = 0  # published in verified streams
    max_delay: float = 0.0  # the longest wait for a sum (seconds)
    delays: list[float] = field(default_factory=list)


@dataclass
class _Stream:
    id: str
    seq: int = 0
    value: bytes = ZERO


class _Verifier:
    """Matches the sums read back against the ones expected."""

    def __init__(self) -> None:
        self.expected: dict[str, tuple[_Stream, asyncio.Future[None]]] = {}
        self.verified: set[str] = set()

    def expect(self, stream: _Stream) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.expected[stream.id] = (stream, fut)
        return fut

    def observe(self, total: Sum) -> None:
        sid = total.id
        if sid in self.verified:
            raise StreamSumError(f"stream {sid}: its sum arrived twice")
        entry = self.expected.pop(sid, None)
        if entry is None:
            return  # another chunker's stream
        stream, fut = entry
        if total.seq != stream.seq or total.sum != stream.value.hex():
            raise StreamSumError(f"stream {sid}: sum {total.sum} through chunk {total.seq}, "
                                 f"expected {stream.value.hex()} through chunk {stream.seq}")
        self.verified.add(sid)
        fut.set_result(None)


async def run_chunker(client: JournalClient, *, streams: int, chunks: int, workers: int = 4,
                      sla: float = 40.0, data_bytes: int = 32, seed: int | None = None,
                      stop: asyncio.Event | None = None,
                      on_verified: Callable[[Totals], None] | None = None,
                      totals: Totals | None = None) -> Totals:
    """Publishes and verifies until each worker's ``streams`` are done (or ``stop`` is set and
    open streams are finished); returns the totals (``totals``, updated as streams verify, if
    given)."""
    parts = await list_journals(client, CHUNK_LABEL)
    if not parts.journals:
        raise StreamSumError(f"no chunk partitions: no journal is labelled {CHUNK_LABEL}")
    mapping = modulo_mapping(lambda m: bytes.fromhex(m.id), lambda: parts)
    barrier = await append(client, SUMS_JOURNAL, [b""])
    rng = random.Random(seed)
    verifier = _Verifier()
    totals = totals if totals is not None else Totals()

    async def read_sums() -> None:
        async for env in read_committed(client, SUMS_JOURNAL, Sum, offset=barrier.commit.end):
            if not is_ack(env):
                verifier.observe(env.message)

    async def wait_for_sum(stream: _Stream, fut: asyncio.Future[None]) -> None:
        started = time.monotonic()
        for warn_at in (*_WARN_AT, sla):
            try:
                async with asyncio.timeout(max(0.0, started + warn_at - time.monotonic())):
                    await asyncio.shield(fut)
                break
            except TimeoutError:
                if warn_at >= sla:
                    raise StreamSumError(f"stream {stream.id}: no sum {sla:.0f}s after its last chunk "
                                         f"(the SLA)") from None
                log.warning("stream %s: still waiting for its sum after %.1fs", stream.id, warn_at)
        delay = time.monotonic() - started
        totals.streams += 1
        totals.chunks += stream.seq
        totals.delays.append(delay)
        totals.max_delay = max(totals.max_delay, delay)
        if on_verified is not None:
            on_verified(totals)

    async def worker(service: AppendService, publisher: Publisher[AsyncAppend]) -> None:
        budget, open_streams = streams, list[_Stream]()
        while True:
            stopping = stop is not None and stop.is_set()
            n = len(open_streams) + (1 if budget != 0 and not stopping else 0)
            if n == 0:
                return
            i = rng.randrange(n)
            if i == len(open_streams):
                open_streams.append(_Stream(os.urandom(16).hex()))
                budget -= 1
            s = open_streams[i]
            data = rng.randbytes(data_bytes) if s.seq < chunks else b""
            s.seq, s.value = s.seq + 1, update(s.value, data)
            await publisher.publish_committed(
                mapping, Chunk(id=s.id, seq=s.seq, data=data))
            if not data:
                del open_streams[i]
                fut = verifier.expect(s)
                await service.flush()  # the last chunk is committed before its wait starts
                await wait_for_sum(s, fut)

    reader = asyncio.ensure_future(read_sums())
    try:
        async with AppendService(client) as service:
            publisher = Publisher(service)
            work = [asyncio.ensure_future(worker(service, publisher)) for _ in range(workers)]
            try:
                pending: set[asyncio.Future[None]] = {reader, *work}
                # Until every worker is done; a worker's failure, or the reader ending at all
                # (it never ends on its own), ends the run.
                while pending - {reader}:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
                    if reader in done:
                        raise StreamSumError("the sums reader ended")
            finally:
                for t in work:
                    t.cancel()
                await asyncio.gather(*work, return_exceptions=True)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker.address", dest="broker", default=os.environ.get("BROKER_ADDRESS", "http://localhost:8080"))
    ap.add_argument("--streams", type=int, default=-1, help="streams per worker (<0: endless)")
    ap.add_argument("--chunks", type=int, default=100, help="chunks per stream")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--sla", type=float, default=40.0, help="seconds a sum may take")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> Totals:
        async with JournalClient(a.broker) as client:
            return await run_chunker(client, streams=a.streams, chunks=a.chunks, workers=a.workers, sla=a.sla,
                                     on_verified=_progress)

    try:
        t = asyncio.run(run())
    except StreamSumError as e:
        print(f"chunker: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"chunker: {t.streams} streams ({t.chunks} chunks) verified; longest wait for a sum {t.max_delay:.2f}s")
    return 0


def _progress(t: Totals) -> None:
    if t.streams % 100 == 0:
        log.info("%d streams (%d chunks) verified; longest wait %.2fs", t.streams, t.chunks, t.max_delay)


if __name__ == "__main__":
    sys.exit(main())

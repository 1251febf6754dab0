"""CPU of our own Python per replicated append, without gRPC: the append state machine, the
pipeline and two peers' ``replicate.serve``, all in one process over the in-memory peer
streams of ``tests/unit/test_pipeline*.py`` (flow control on, as served).

It measures what the broker code costs per append apart from grpc.aio (which dominates a real
broker's CPU: see ``replication_bench.py``), so hot-path changes can be compared on a noisy
machine: it prints the best and the median of several rounds of ``process_time``.

    python bench/append_path_cpu.py              # 100-byte appends
    python bench/append_path_cpu.py --size 65536 --appends 2000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))

from test_pipeline import JOURNAL  # noqa: E402
from test_pipeline_fsm import FSMBroker  # noqa: E402

from gazette.broker import append as append_mod  # noqa: E402
from gazette.broker.resolver import Resolution  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402


async def measure(size: int, appends: int, rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with asyncio.TaskGroup() as tg:
            b = FSMBroker(Path(tmp), tg)
            b.config.min_append_rate = 1 << 16
            resolve = b.resolve
            cache: dict[int, Resolution] = {}

            async def cached(journal: str, **kw: Any) -> Resolution:
                # A broker's resolver answers from a cache per keyspace revision.
                if b.revision not in cache:
                    cache[b.revision] = await resolve(journal, **kw)
                return cache[b.revision]

            b.resolve = cached  # type: ignore[method-assign]
            first = pb.AppendRequest(journal=JOURNAL)
            data = b"x" * size

            async def one() -> None:
                async def chunks() -> AsyncIterator[pb.AppendRequest]:
                    yield pb.AppendRequest(content=data)
                    yield pb.AppendRequest()

                resp = await append_mod.append(b, first, chunks())  # type: ignore[arg-type]
                assert resp.status == pb.OK, resp

            for _ in range(200):
                await one()
            per_round = max(1, appends // rounds)
            out = []
            for _ in range(rounds):
                t0 = time.process_time()
                for _ in range(per_round):
                    await one()
                out.append((time.process_time() - t0) / per_round)
            b.replica.cancel()
            assert b.replica.retired is not None
            await asyncio.wait_for(b.replica.retired, 5)
            return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--appends", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    got = asyncio.run(measure(args.size, args.appends, args.rounds))
    print(f"{args.size} B appends, primary + 2 peers in-process: best {min(got) * 1e6:.1f} µs, "
          f"median {statistics.median(got) * 1e6:.1f} µs CPU per append")
    return 0


if __name__ == "__main__":
    sys.exit(main())

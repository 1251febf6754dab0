"""CPU of our own Python per replicated append, without gRPC: the append state machine, the
pipeline and two peers' ``replicate.serve``, all in one process over the in-memory peer
streams of ``tests/unit/test_pipeline*.py`` (flow control on, as served).

It measures what the broker code costs per append apart from grpc.aio (which dominates a real
broker's CPU: see ``replication_bench.py``), so hot-path changes can be compared on a noisy
machine: it prints the best and the median of several rounds of ``process_time``.

    python bench/append_path_cpu.py              # 100-byte appends
    python bench/append_path_cpu.py --size 65536 --appends 2000
    python bench/append_path_cpu.py --replication 1 --profile   # the primary alone, profiled
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))

from test_pipeline import JOURNAL, MEMBERS, header, route  # noqa: E402
from test_pipeline_fsm import FSMBroker  # noqa: E402

from gazette.broker import append as append_mod  # noqa: E402
from gazette.broker.resolver import Resolution  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402


async def measure(size: int, appends: int, rounds: int, replication: int = 3,
                  profile: cProfile.Profile | None = None) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with asyncio.TaskGroup() as tg:
            b = FSMBroker(Path(tmp), tg)
            b.config.min_append_rate = 1 << 16
            resolve = b.resolve
            if replication == 1:
                b.spec.replication = 1
                solo = route(MEMBERS[:1])

                async def resolve_one(journal: str, **kw: Any) -> Resolution:
                    res = await FSMBroker.resolve(b, journal, **kw)
                    res.header = header(b.revision, solo)
                    kv = res.assignments[0]
                    res.assignments = [dataclasses.replace(kv, value=solo if b.advertised else None)]
                    return res

                resolve = resolve_one
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
            if profile is not None:
                profile.enable()
            for _ in range(rounds):
                t0 = time.process_time()
                for _ in range(per_round):
                    await one()
                out.append((time.process_time() - t0) / per_round)
            if profile is not None:
                profile.disable()
            b.replica.cancel()
            assert b.replica.retired is not None
            async with asyncio.timeout(5):
                await b.replica.retired
            return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--appends", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replication", type=int, choices=(1, 3), default=3,
                    help="1: the primary alone (no peers); 3: primary and two in-process peers")
    ap.add_argument("--profile", action="store_true", help="print the measured rounds' cProfile")
    args = ap.parse_args()
    prof = cProfile.Profile() if args.profile else None
    got = asyncio.run(measure(args.size, args.appends, args.rounds, args.replication, prof))
    who = "primary + 2 peers" if args.replication == 3 else "primary alone"
    print(f"{args.size} B appends, {who} in-process: best {min(got) * 1e6:.1f} µs, "
          f"median {statistics.median(got) * 1e6:.1f} µs CPU per append")
    if prof is not None:
        pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

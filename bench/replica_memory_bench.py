"""Memory of a broker's journal replicas, in process: bytes per replica (tracemalloc), and
where they go, beside the same replicas built with ``asyncio.Event`` (the baseline).

A broker holds one `Replica` per assigned journal: its spool, index, flow control, events,
locks and two tasks (maintenance and pulse). This bench builds N of them on one event loop
(no etcd, no peers: what every replica costs before it holds any content), waits until each
finished its first refresh (an idle replica then runs no task), and reads tracemalloc's growth
per replica and glibc's (``mallinfo2``: protobuf arenas, hash contexts). It then builds them again
with ``asyncio.Event`` in place of ``LeanEvent`` and prints the ratio, and the top allocation
sites of the first run.

    python bench/replica_memory_bench.py                 # 5,000 replicas
    python bench/replica_memory_bench.py --replicas 20000 --top 15
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import tempfile
import tracemalloc
from unittest import mock

from gazette.broker import index as index_mod
from gazette.broker import replica as replica_mod
from gazette.broker.persister import Persister
from gazette.broker.replica import Replica
from gazette.fragment.stores import Stores
from gazette.protocol import protocol_pb2 as pb


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def c_heap() -> int:
    """Bytes in use in glibc's heap (``mallinfo2().uordblks``), 0 where unavailable."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return 0
    fn.restype = _MallInfo2
    return int(fn().uordblks)


def spec() -> pb.JournalSpec:
    s = pb.JournalSpec(name="bench/x", replication=2)
    s.fragment.length = 1 << 29
    s.fragment.compression_codec = pb.SNAPPY
    s.fragment.stores.append("file:///")
    s.fragment.refresh_interval.seconds = 300
    return s


async def measure(n: int, top: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        stores = Stores(file_root=d)
        persister = Persister(stores, lambda journal: None)
        js = spec()
        replicas: list[Replica] = []
        async with asyncio.TaskGroup() as tg:
            gc.collect()
            tracemalloc.start(1)
            before = tracemalloc.take_snapshot()
            c_before = c_heap()
            for i in range(n):
                replicas.append(Replica(f"bench/{i:07d}", js, d, stores, persister, tg))
            # Idle: every first refresh done and its task ended (no replica runs a task then).
            await asyncio.gather(*(r.wait_first_refresh() for r in replicas))
            # A turn of the loop at a time, until the refresh tasks ended.
            while any(r._refreshing is not None for r in replicas):  # noqa: SLF001, ASYNC110
                await asyncio.sleep(0)
            gc.collect()
            after = tracemalloc.take_snapshot()
            c_after = c_heap()
            tracemalloc.stop()
            diff = after.compare_to(before, "lineno")
            per = sum(st.size_diff for st in diff) / n
            print(f"  Python objects {per:.0f} B per replica (tracemalloc), C heap "
                  f"{(c_after - c_before) / n:.0f} B (glibc mallinfo2: protobuf arenas, hash contexts)")
            if top:
                for st in diff[:top]:
                    frame = st.traceback[0]
                    print(f"    {st.size_diff / n:8.0f} B  {frame.filename.rsplit('/', 3)[-1]}:{frame.lineno}")
            for r in replicas:
                r.cancel()
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=5000)
    ap.add_argument("--top", type=int, default=10, help="allocation sites to list (0: none)")
    args = ap.parse_args()
    print(f"{args.replicas} replicas, top allocation sites per replica (LeanEvent):")
    lean = asyncio.run(measure(args.replicas, args.top))
    with mock.patch.object(replica_mod, "LeanEvent", asyncio.Event), \
            mock.patch.object(index_mod, "LeanEvent", asyncio.Event):
        plain = asyncio.run(measure(args.replicas, 0))
    print(f"per replica: {lean / 1024:.1f} KiB with LeanEvent, {plain / 1024:.1f} KiB with asyncio.Event "
          f"(ratio {lean / plain:.2f})")


if __name__ == "__main__":
    main()

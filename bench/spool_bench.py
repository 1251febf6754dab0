"""Spool append-path throughput: content chunks plus a commit proposal per chunk.

Prints MB/s for 64 KiB and 1 MiB chunks (each chunk is one "append": content, then the commit
of ``spool.next()``), and the persist-time compression rate of a completed spool per codec.
Not a timed assertion: compare ratios within one run (see the design notes on noisy machines).

    python bench/spool_bench.py [--total-mib 256] [--dir /path/on/disk]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from gazette.broker.spool import Spool, SpoolSnapshot
from gazette.fragment import Fragment
from gazette.protocol import protocol_pb2 as pb


def bench_appends(chunk: int, total: int, directory: str | None) -> float:
    done: list[SpoolSnapshot] = []
    spool = Spool("bench/journal", directory=directory, on_complete=done.append)
    payload = os.urandom(chunk)
    req = pb.ReplicateRequest(content=payload)
    commit = pb.ReplicateRequest()
    start = time.perf_counter()
    for _ in range(total // chunk):
        req.content_delta = 0
        spool.apply(req)
        commit.proposal.CopyFrom(spool.next())
        resp = spool.apply(commit)
        assert resp.status == pb.Status.OK
    elapsed = time.perf_counter() - start
    return total / elapsed / 1e6


def bench_compression(directory: str | None, size: int) -> dict[str, float]:
    # JSON lines with varying fields, so codecs see realistic (not trivially repeated) input.
    lines = b"".join(
        b'{"Msg": "event %d", "user": "%s", "n": %d, "ok": true}\n'
        % (i, os.urandom(6).hex().encode(), i * 7919 % 100003)
        for i in range(size // 60 + 1)
    )
    data = lines[:size]
    out: dict[str, float] = {}
    for name, codec in pb.CompressionCodec.items():
        if codec == pb.CompressionCodec.INVALID:
            continue
        done: list[SpoolSnapshot] = []
        spool = Spool("bench/journal", directory=directory, on_complete=done.append)
        spool.must_apply(
            pb.ReplicateRequest(proposal=Fragment("bench/journal", 0, 0, codec=codec).to_proto())
        )
        for i in range(0, size, 1 << 20):
            spool.apply(pb.ReplicateRequest(content=data[i : i + (1 << 20)], content_delta=i))
        spool.must_apply(pb.ReplicateRequest(proposal=spool.next()))
        spool.must_apply(
            pb.ReplicateRequest(
                proposal=Fragment("bench/journal", size, size, codec=codec).to_proto()
            )
        )
        start = time.perf_counter()
        stored = sum(len(c) for c in done[0].iter_compressed())
        elapsed = time.perf_counter() - start
        out[f"{name} ({size / max(stored, 1):.1f}x)"] = size / elapsed / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--dir", default=None, help="spool directory (default: the temp dir)")
    args = ap.parse_args()
    total = args.total_mib << 20
    directory = args.dir or tempfile.gettempdir()

    for chunk in (64 << 10, 1 << 20):
        mbps = bench_appends(chunk, total, directory)
        print(f"spool append+commit, {chunk >> 10:5d} KiB chunks: {mbps:8.1f} MB/s")
    for name, mbps in bench_compression(directory, 64 << 20).items():
        print(f"persist-time compression {name:>34}: {mbps:8.1f} MB/s")


if __name__ == "__main__":
    main()

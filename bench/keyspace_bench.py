"""The cost of one keyspace change on a broker, as the keyspace grows (issue: scale curves).

Every broker mirrors the whole cluster keyspace and runs its observers (the resolver, which
starts, stops and re-routes local replicas) after each change; with N journals, the allocator's
writes alone are O(N) changes, so a per-change cost proportional to N is a quadratic cluster.
This bench feeds a broker's ``KeySpace`` + ``Resolver`` in process (no etcd: etcd's own cost is
not ours), with N journals of replication 2 (the broker holding half the replicas), then times
single changes of three kinds: a new journal's spec, its assignment to this broker, and an
assignment of another broker; and the allocator leader's extraction of its State after one change
(its entry cache warm), which stays O(n) per round (it walks every item to count and solve).
It prints the time per change and its ratio to the first step's (the 1,000-journal cluster):
linear-in-the-change work keeps the ratio near 1.

    python bench/keyspace_bench.py                       # 1k, 5k, 20k, 50k journals
    python bench/keyspace_bench.py --steps 1000,10000 --changes 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from aetcd import rpc

from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.allocator.specs import journal_is_consistent
from gazette.allocator.state import EntryCache, State
from gazette.broker.keys import broker_decoder
from gazette.broker.resolver import Resolver
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import protocol_pb2 as pb

ROOT = "/gazette/bench"
LOCAL = pb.ProcessSpec.ID(zone="zone-a", suffix="local")
OTHERS = [pb.ProcessSpec.ID(zone="zone-b", suffix="b"), pb.ProcessSpec.ID(zone="zone-a", suffix="c")]


class _Replica:
    """What the resolver does to a local replica, and no more."""

    def __init__(self, spec: pb.JournalSpec) -> None:
        self.spec = spec
        self.route_signal = asyncio.Event()
        self.assignments_sig: tuple[tuple[str, int], ...] = ()
        self.retired = None

    def set_primary(self, primary: bool) -> None:
        pass

    def signal_route_change(self) -> None:
        pass

    def cancel(self) -> None:
        pass


class _Feed:
    """Writes as etcd's watch would deliver them: one revision per write."""

    def __init__(self, ks: KeySpace) -> None:
        self.ks, self.revision = ks, 1

    def write(self, ops: list[tuple[str, bytes]]) -> None:
        self.revision += 1
        response = rpc.WatchResponse()
        response.header.revision, response.header.cluster_id = self.revision, 1
        for key, value in ops:
            ev = response.events.add()
            ev.kv.key, ev.kv.value = key.encode(), value
            ev.kv.mod_revision = ev.kv.create_revision = self.revision
            ev.kv.version = 1
        self.ks.apply([response])


def _member(pid: pb.ProcessSpec.ID) -> tuple[str, bytes]:
    spec = pb.BrokerSpec(journal_limit=1 << 20)
    spec.process_spec.id.CopyFrom(pid)
    spec.process_spec.endpoint = f"http://{pid.suffix}:8080"
    return members_key(ROOT, pid.zone, pid.suffix), spec.SerializeToString()


def _spec(name: str) -> bytes:
    return pb.JournalSpec(name=name, replication=2).SerializeToString()


def _world(n: int) -> tuple[_Feed, Resolver]:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    resolver = Resolver(ks, LOCAL, lambda journal, spec: _Replica(spec))  # type: ignore[arg-type, return-value]
    feed = _Feed(ks)
    feed.write([_member(p) for p in (LOCAL, *OTHERS)])
    ops: list[tuple[str, bytes]] = []
    for i in range(n):
        name = f"bench/journal-{i:06d}"
        first, second = (LOCAL, OTHERS[0]) if i % 2 == 0 else (OTHERS[0], OTHERS[1])
        ops += [(items_key(ROOT, name), _spec(name)),
                (assignment_key(ROOT, name, first.zone, first.suffix, 0), b""),
                (assignment_key(ROOT, name, second.zone, second.suffix, 1), b"")]
    for at in range(0, len(ops), 30_000):  # etcd delivers big loads in many responses too
        feed.write(ops[at:at + 30_000])
    return feed, resolver


def _time(feed: _Feed, changes: int, op: Any) -> float:
    samples = []
    for k in range(changes):
        ops = op(k)
        start = time.perf_counter()
        feed.write(ops)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="1000,5000,20000,50000", help="journal counts")
    ap.add_argument("--changes", type=int, default=100, help="changes timed per kind and step")
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",")]
    print(f"{'journals':>9} | {'load s':>7} | {'new spec ms':>11} | {'local assign ms':>15} | "
          f"{'remote assign ms':>16} | {'leader round ms':>15} | ratio to first step")
    first: list[float] | None = None
    for n in steps:
        started = time.perf_counter()
        feed, resolver = _world(n)
        load = time.perf_counter() - started
        assert resolver.replicas is not None and len(resolver.replicas) == (n + 1) // 2
        tag = f"new/{n}"
        new = _time(feed, a.changes, lambda k, t=tag: [(items_key(ROOT, f"{t}-{k}"), _spec(f"{t}-{k}"))])
        local = _time(feed, a.changes, lambda k, t=tag: [
            (assignment_key(ROOT, f"{t}-{k}", LOCAL.zone, LOCAL.suffix, 0), b"")])
        remote = _time(feed, a.changes, lambda k, t=tag: [
            (assignment_key(ROOT, f"{t}-{k}", OTHERS[1].zone, OTHERS[1].suffix, 1), b"")])
        # The allocator leader's per-round extraction, its entry cache warm (one change since).
        cache, local_key = EntryCache(), members_key(ROOT, LOCAL.zone, LOCAL.suffix)
        State.from_keyspace(feed.ks, local_key, journal_is_consistent, cache=cache)
        rounds = []
        for k in range(5):
            feed.write([(items_key(ROOT, f"{tag}-round-{k}"), _spec(f"{tag}-round-{k}"))])
            started = time.perf_counter()
            State.from_keyspace(feed.ks, local_key, journal_is_consistent, cache=cache)
            rounds.append(time.perf_counter() - started)
        row = [new, local, remote, statistics.median(rounds)]
        first = first or row
        ratios = " / ".join(f"{x / f:.2f}" for x, f in zip(row, first, strict=True))
        print(f"{n:>9,} | {load:>7.1f} | {new * 1e3:>11.3f} | {local * 1e3:>15.3f} | {remote * 1e3:>16.3f} | "
              f"{row[3] * 1e3:>15.1f} | {ratios}")


if __name__ == "__main__":
    main()

"""The allocator leader's event loop while journals are applied in bursts (issue 31).

The leader re-solves as items change, and a solve is seconds of pure Python at 10,000 journals.
Whatever the leader does on its event loop delays everything else the broker serves there, and
its etcd lease keep-alive: a loop held for seconds at a time made the lease lapse and the broker
exit. This bench runs one leader's `allocate` in this process, against an etcd on loopback, with
two more members announced (three members in two zones), and a probe that sleeps 5 ms on the
same loop and records by how much each sleep overran: the loop's lag. Journals of replication 2
are added in steps, each as etcd transactions of 100 specs (gazctl's default `--max-txn-size`)
paced at ``--pace`` ms per journal (about what a broker's Apply path takes), and per step it
prints:

* ``apply s``: writing the step's journals; ``assigned s``: from then until every journal has
  its two assignments in the leader's keyspace;
* ``solves`` / ``solve s``: the leader's solves during the step and their total duration (from
  its ``solved for ...`` log lines);
* ``lag max ms`` / ``lag p99 ms``: the probe's overrun, over the step's apply and assignment;
  the largest is the longest the loop was held in one go;
* ``gc max ms``: the longest collection of Python's cyclic garbage collector in the step (it
  holds the loop too, and grows with the number of live objects, not with the allocator's work).

    python bench/allocator_loop_bench.py                     # 1,000, 5,000, 10,000 journals
    python bench/allocator_loop_bench.py --steps 1000,20000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import re
import statistics
import time

from gazette.allocator import allocate, announce
from gazette.allocator.keys import assignments_prefix, items_key, members_key
from gazette.allocator.testing import always_consistent
from gazette.broker.keys import broker_decoder
from gazette.etcd import connect
from gazette.etcd.keyspace import KeySpace
from gazette.etcd.txn import Put, commit
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.etcd_process import EtcdProcess

ROOT = "/gazette/loop-bench"
MEMBERS = [("zone-a", "leader"), ("zone-a", "other"), ("zone-b", "third")]
TXN = 100
PROBE = 0.005
SOLVED = re.compile(r"solved for \d+ of \d+ item slots over \d+ members in ([\d.]+)s")


class Solves(logging.Handler):
    """Collects the durations of the leader's solves from its log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if m := SOLVED.search(record.getMessage()):
            self.seconds.append(float(m.group(1)))


class GcPauses:
    """The durations of the cyclic garbage collector's collections (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds.append(time.perf_counter() - self._started)


def broker_spec(zone: str, suffix: str, limit: int) -> bytes:
    spec = pb.BrokerSpec(journal_limit=limit)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = f"http://{suffix}.test:8080"
    return spec.SerializeToString()


async def probe(lags: list[float]) -> None:
    while True:
        t = time.perf_counter()
        await asyncio.sleep(PROBE)
        lags.append(time.perf_counter() - t - PROBE)


def fully_assigned(ks: KeySpace, n: int) -> bool:
    return sum(1 for _ in ks.prefixed(assignments_prefix(ROOT))) >= 2 * n


async def run(steps: list[int], pace: float, step_timeout: float) -> None:
    solves, gc_pauses = Solves(), GcPauses()
    logging.getLogger("gazette.allocator").addHandler(solves)
    logging.getLogger("gazette.allocator").setLevel(logging.INFO)
    with EtcdProcess(unsafe_no_fsync=True) as etcd:
        client = await connect(etcd.endpoint)
        limit = max(steps) + 1000
        announcements = [await announce(client, members_key(ROOT, z, s), broker_spec(z, s, limit),
                                        ttl=20) for z, s in MEMBERS]
        ks = KeySpace(ROOT, broker_decoder(ROOT))
        await ks.load(client)
        lags: list[float] = []
        async with asyncio.TaskGroup() as tg:
            owned = [tg.create_task(ks.watch(client)), tg.create_task(probe(lags))]
            owned += [tg.create_task(a.keep_alive()) for a in announcements]
            owned.append(tg.create_task(allocate(client, ks, members_key(ROOT, *MEMBERS[0]),
                                                 always_consistent)))
            print("| journals | apply s | assigned s | solves | solve s | lag max ms | lag p99 ms | gc max ms |")
            print("|---|---|---|---|---|---|---|---|")
            have = 0
            for step in steps:
                lags.clear()
                gc_pauses.seconds.clear()
                solved_before = len(solves.seconds)
                started = time.perf_counter()
                for begin in range(have, step, TXN):
                    due = started + (begin - have) * pace
                    if (ahead := due - time.perf_counter()) > 0:
                        await asyncio.sleep(ahead)
                    names = [f"loop-bench/j{i:06d}" for i in range(begin, min(begin + TXN, step))]
                    await commit(client, [], [
                        Put(items_key(ROOT, n), pb.JournalSpec(name=n, replication=2).SerializeToString())
                        for n in names])
                applied = time.perf_counter()
                async with asyncio.timeout(step_timeout):
                    while not fully_assigned(ks, step):
                        await ks.wait_for_revision(ks.revision + 1)
                assigned = time.perf_counter()
                have = step
                new = solves.seconds[solved_before:]
                p99 = statistics.quantiles(lags, n=100)[98] if len(lags) >= 2 else 0.0
                print(f"| {step:,} | {applied - started:.1f} | {assigned - applied:.1f} | {len(new)} "
                      f"| {sum(new):.2f} | {max(lags, default=0) * 1000:.0f} | {p99 * 1000:.0f} "
                      f"| {max(gc_pauses.seconds, default=0) * 1000:.0f} |",
                      flush=True)
            for t in owned:
                t.cancel()
        for a in announcements:
            await a.revoke()
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="1000,5000,10000", help="cumulative journal counts")
    ap.add_argument("--pace", type=float, default=3.0, help="ms per journal applied")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a step may take to assign")
    a = ap.parse_args()
    asyncio.run(run([int(s) for s in a.steps.split(",")], a.pace / 1000, a.timeout))


if __name__ == "__main__":
    main()

"""Whole-cluster cost as journals (and shards) grow: issue 31's scale curves.

Starts an etcd and three brokers (``--brokers``) in two zones (``zone-a``: two, ``zone-b``: one; each with
``--broker.limit`` above the largest step), all on loopback, then adds journals of replication 2
in steps (each step adds to the previous). Per step, one table row:

* ``apply ms/j``: the step's new journals applied through one broker with the client's
  ``apply`` in transactions of gazctl's default ``--max-txn-size``, wall time per journal;
  ``CPU ms/j``: the CPU the brokers and etcd spent from the start of that apply until etcd
  stood still (applied, assigned, replicas started and routes advertised), per journal: the
  cluster's whole cost of a journal, which the wall time of a large apply includes in part
  (the apply shares the cores with the allocation of the journals it applied first);
* ``assigned s``: from the end of the apply until every journal of the cluster is listed with a
  primary and two members (polled with List through one broker: the figure includes up to one
  List's duration);
* ``quiet s``: from then until the brokers' logs show no replica start or stop nor solve
  for ``--settle`` seconds (the replicas have started); ``still s``: from then until etcd's
  revision has not moved for ``--settle`` seconds (every route advertised, the allocator writing nothing);
  idle CPU is measured once every broker's keyspace has also applied that revision (its
  ``gazette_keyspace_revision``; the progress line says how long after);
* ``solves`` / ``solve s``: the allocator's rounds during the step and their total solve time,
  parsed from the leader's ``solved for ...`` log lines;
* ``RSS KiB/rep``: the brokers' summed RSS above the empty brokers', per journal replica
  (2 per journal);
* ``idle CPU %``: each broker's user+system CPU (``/proc/PID/stat``) over ``--idle`` seconds of
  doing nothing, in % of one core, and the sum (etcd's beside it); ``idle pulses/s``: Append
  RPCs the brokers answered meanwhile (``gazette_appends_total``), which are their pulses;
* ``list s``: ``gazctl journals list`` of every journal (the user's path: process start,
  List RPC, table output), beside ``gazctl start s`` (``--help``: the start alone) and
  ``List RPC s``, the RPC alone in this process; each the best of ``--list-runs`` (3);
* ``append+read p50/p99 ms``: ``--probes`` 100-byte appends to a fixed journal (replication 2),
  each followed by a read of what it appended, sent to each broker in turn (a broker that is
  not the primary proxies): p50 and p99 over all brokers, and the slowest broker's p50;
* ``etcd db MiB``: ``etcd_mvcc_db_total_size_in_bytes`` from etcd's /metrics; ``watch ev/s``:
  ``etcd_debugging_mvcc_events_total`` (events sent to watchers) over the step's apply and
  assignment, per second.

With ``--shards``, three consumer processes (``gazette consume`` with a trivial app, in two
zones) then take shards of one hot standby each, added in steps over 16 source journals: time
until every shard is PRIMARY with one STANDBY, the consumers' idle CPU, ``gazctl shards list``
time and RSS per shard (consumers' RSS above their empty selves per shard).

The last lines are the ratios of each step to the first (the bench README's convention:
compare ratios within one run). A markdown table and a PNG of the curves (matplotlib, the bench
extra; skipped with a line saying so when it is missing) are written to ``--out``.

    python bench/scale_bench.py --quick                  # 500, 2,000 journals; about 2 min
    python bench/scale_bench.py                          # 1,000, 5,000, 10,000 journals
    python bench/scale_bench.py --steps 1000,10000,50000 --shards --shard-steps 500,2000,5000
    python bench/scale_bench.py --brokers 20 --consumers 20 --steps 2000 --shards --shard-steps 1000
    python bench/scale_bench.py --steps 2000,10000 --broker-args '--broker.auto-suspend
        --broker.health-interval 4s' --idle-delay 90    # idle journals suspended
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import grpc

from gazette.allocator.keys import SEP, assignments_prefix
from gazette.cli.gazctl.common import DEFAULT_MAX_TXN_SIZE
from gazette.client.journal_client import JournalClient, label_selector
from gazette.consumer.client import ShardClient
from gazette.etcd import connect
from gazette.journalspace import apply_request
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import BrokerProcess, Cluster
from gazette.testing.consumer_proc import ConsumerProc, consumer_endpoints, consumer_env
from gazette.testing.etcd_process import EtcdProcess

PREFIX = "scale/"
PROBE = "scale-probe/journal"
BROKERS_ROOT = "/gazette/scale"
CONSUMERS_ROOT = "/gazette/scale-consumers"
ZONES = ("zone-a", "zone-b")
POLL = 1.0  # seconds between polls of etcd
SOURCES = 16
TICK = os.sysconf("SC_CLK_TCK")
SOLVED = re.compile(rb"solved for (\d+) of (\d+) item slots over (\d+) members in ([\d.]+)s")

APP = '''\
"""A trivial consumer application for bench/scale_bench.py: it consumes nothing of note."""
from gazette.consumer.stores.memory import MemoryStore
from gazette.message import JSONMessage


class App:
    def new_store(self, shard, recorder):
        return MemoryStore()

    def new_message(self, spec):
        return JSONMessage

    def consume_message(self, shard, store, env, pub):
        pass

    def finalize_txn(self, shard, store, pub):
        pass
'''


def progress(text: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- /proc and logs --------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def children(pid: int) -> list[int]:
    """``pid``'s descendants (a broker's solver process)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except FileNotFoundError:
            continue
        for k in kids:
            out += [k, *children(k)]
    return out


def cpu_by_process(bpids: Sequence[int], etcd_pid: int) -> dict[str, float]:
    """CPU seconds so far of the bench itself, etcd, each broker and each broker's
    descendants (its solver), by name; a descendant that exits meanwhile is not counted."""
    t = os.times()
    out = {"bench": t.user + t.system, "etcd": cpu_seconds(etcd_pid)}
    for i, pid in enumerate(bpids, 1):
        out[f"b{i}"] = cpu_seconds(pid)
        kids = 0.0
        for k in children(pid):
            try:
                kids += cpu_seconds(k)
            except FileNotFoundError:
                pass
        out[f"b{i} solver"] = kids
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> str:
    return ", ".join(f"{k} {after[k] - before.get(k, 0.0):.1f}" for k in after)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def idle_cpu(pids: Sequence[int], seconds: float) -> list[float]:
    """Each process's CPU over ``seconds`` of wall time, in % of one core."""
    before, start = [cpu_seconds(p) for p in pids], time.monotonic()
    await asyncio.sleep(seconds)  # the measured idle period itself, not a synchronisation
    wall = time.monotonic() - start
    return [100 * (cpu_seconds(p) - b) / wall for p, b in zip(pids, before, strict=True)]


class LogTail:
    """New bytes of a set of log files since the last call."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.offsets = {p: p.stat().st_size if p.exists() else 0 for p in self.paths}
        self.read_seen = b""  # what the last settle() read

    def read(self) -> bytes:
        out = b""
        for p in self.paths:
            with p.open("rb") as f:
                f.seek(self.offsets[p])
                data = f.read()
            self.offsets[p] += len(data)
            out += data
        return out


BUSY = (b"starting local journal replica", b"stopping local journal replica", b"solved for",
        b"shard assigned")


async def settle(logs: LogTail, quiet: float, patience: float) -> float:
    """Waits until the logs have shown no replica start or stop, allocator solve or shard
    assignment for ``quiet`` seconds: a replica still starting is not idle. The seconds until
    the last such line; what was read is left in ``logs.read_seen``."""
    start = last = time.monotonic()
    seen = b""
    while time.monotonic() - last < quiet:
        if time.monotonic() - start > patience:
            raise TimeoutError(f"processes still busy after {patience:.0f}s")
        await asyncio.sleep(0.5)  # polling the logs, not synchronisation
        new = logs.read()
        seen += new
        if any(marker in new for marker in BUSY):
            last = time.monotonic()
    logs.read_seen = seen
    return last - start


async def etcd_still(ec: aetcd.Client, quiet: float, patience: float) -> float:
    """Waits until etcd's revision has not moved for ``quiet`` seconds: every primary has
    advertised its route and the allocator writes nothing more (logs go quiet before that).
    A broker may still be applying what it watched (see `caught_up`). The seconds it took."""
    start = last = time.monotonic()
    revision = -1
    while time.monotonic() - last < quiet:
        if time.monotonic() - start > patience:
            raise TimeoutError(f"etcd revisions still moving after {patience:.0f}s")
        now = await _revision(ec)
        if now != revision:
            revision, last = now, time.monotonic()
        await asyncio.sleep(0.5)  # polling etcd's revision, not synchronisation
    return last - start


async def _revision(ec: aetcd.Client) -> int:
    await ec.connect()
    response = await ec.kvstub.Range(aetcd.rpc.RangeRequest(key=b"/", limit=1, count_only=True),
                                     metadata=ec.metadata)
    return int(response.header.revision)


def solves(text: bytes) -> tuple[int, float]:
    found = [float(m.group(4)) for m in SOLVED.finditer(text)]
    return len(found), sum(found)


def etcd_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:  # noqa: S310 - loopback etcd
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


def _keyspace_revisions(metrics_url: str) -> list[float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:  # noqa: S310 - loopback
        return [float(line.rsplit(" ", 1)[1]) for line in resp.read().decode().splitlines()
                if line.startswith("gazette_keyspace_revision{")]


async def caught_up(metrics_urls: Sequence[str], ec: aetcd.Client, patience: float) -> float:
    """Waits until every member's keyspace has applied etcd's current revision (their
    ``gazette_keyspace_revision``): etcd standing still does not mean the members have read
    it all, and a member applying its watch's backlog (the allocator's leader, at tens of
    thousands of journals) is not idle. The seconds it took."""
    start = time.monotonic()
    target = await _revision(ec)
    while True:
        behind = []
        for url in metrics_urls:
            revs = await asyncio.to_thread(_keyspace_revisions, url)
            if not revs or min(revs) < target:
                behind.append(url)
        if not behind:
            return time.monotonic() - start
        if time.monotonic() - start > patience:
            raise TimeoutError(f"{', '.join(behind)} still behind etcd's revision {target} after {patience:.0f}s")
        await asyncio.sleep(0.5)  # polling the members' metrics, not synchronisation


def appends_served(brokers: Sequence[BrokerProcess]) -> float:
    """Append RPCs the brokers answered, summed over statuses (``gazette_appends_total``):
    over an idle window these are the primaries' pulses."""
    total = 0.0
    for b in brokers:
        with urllib.request.urlopen(b.url("/debug/metrics"), timeout=10) as resp:  # noqa: S310 - loopback
            for line in resp.read().decode().splitlines():
                if line.startswith("gazette_appends_total{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


# -- journals --------------------------------------------------------------------------------


def journals_yaml(names: Sequence[str], prefix: str = PREFIX) -> str:
    children = "".join(f"- name: {n}\n" for n in names)
    return (f"name: {prefix}\nreplication: 2\nlabels:\n- name: content-type\n"
            "  value: application/x-ndjson\nfragment:\n  length: 134217728\n"
            "  compression_codec: NONE\n  stores:\n  - file:///\n  refresh_interval: 5m0s\n"
            f"children:\n{children}")


async def assignments(etcd: aetcd.Client, root: str, prefix: str) -> dict[str, dict[int, bytes]]:
    """The assignments of the items under ``prefix``, read from etcd: item -> slot -> value.
    Read from etcd rather than listed through a broker: a List of every journal is work for
    the broker being measured (at 5,000 journals, polling it starved broker-1's event loop)."""
    out: dict[str, dict[int, bytes]] = {}
    await etcd.connect()
    key = (assignments_prefix(root) + prefix).encode()
    end = key[:-1] + bytes([key[-1] + 1])
    revision = 0
    while True:  # paged: one answer for every assignment exceeds gRPC's 4 MiB at 20,000 journals
        response = await etcd.kvstub.Range(aetcd.rpc.RangeRequest(
            key=key, range_end=end, revision=revision, limit=5000), metadata=etcd.metadata)
        revision = revision or response.header.revision  # every page of one snapshot
        for kv in response.kvs:
            item, _zone, _suffix, slot = kv.key.decode()[len(assignments_prefix(root)):].split(SEP)
            out.setdefault(item, {})[int(slot)] = kv.value
        if not response.more or not response.kvs:
            return out
        key = response.kvs[-1].key + b"\0"


async def fully_assigned(etcd: aetcd.Client, root: str, prefix: str, want: int, patience: float) -> float:
    """Polls etcd until ``want`` journals under ``prefix`` have a primary (slot 0) and a
    replica (slot 1) assigned; the seconds it took (to within the poll period)."""
    start = said = time.monotonic()
    while True:
        done = sum(1 for slots in (await assignments(etcd, root, prefix)).values() if {0, 1} <= set(slots))
        if done >= want:
            return time.monotonic() - start
        if time.monotonic() - start > patience:
            raise TimeoutError(f"{done} of {want} journals fully assigned after {patience:.0f}s")
        if time.monotonic() - said > 5:
            progress(f"  {done:,} of {want:,} journals fully assigned")
            said = time.monotonic()
        await asyncio.sleep(POLL)  # the poll period: etcd is read, not waited on


async def probe(brokers: Sequence[BrokerProcess], count: int) -> tuple[float, float, float, int]:
    """Append+read round trips to PROBE through each broker: (p50, p99, worst broker's p50) in
    seconds, and the number of round trips that failed (a lagging broker's peers time out;
    failures are counted, not timed)."""
    samples: list[float] = []
    per_broker: list[float] = []
    errors = 0
    for b in brokers:
        channel = insecure_channel(f"127.0.0.1:{b.port}")
        stub = pb_grpc.JournalStub(channel)
        mine: list[float] = []
        try:
            for i in range(count + 5):
                data = b'{"probe": %06d, "pad": "0123456789012345678901234567890123456789012345678"}\n' % i
                start = time.perf_counter()
                try:
                    await _round_trip(stub, data)
                except (grpc.aio.AioRpcError, ProbeError) as err:
                    errors += 1
                    if errors == 1 or count <= 5:
                        progress(f"  probe through {b.broker_id} failed: {str(err).strip()[:200]}")
                    if count <= 5:
                        raise ProbeError(str(err)) from None
                    continue
                if i >= 5:  # the first round trips open channels and proxies
                    mine.append(time.perf_counter() - start)
        finally:
            await channel.close()
        samples += mine
        per_broker.append(statistics.median(mine) if mine else float("nan"))
    samples.sort()
    if not samples:
        return float("nan"), float("nan"), float("nan"), errors
    return (statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))],
            max(per_broker), errors)


class ProbeError(RuntimeError):
    """An append or read of the probe journal was refused or read back wrong."""


async def _round_trip(stub: Any, data: bytes) -> None:
    resp = await stub.Append(iter((pb.AppendRequest(journal=PROBE),
                                   pb.AppendRequest(content=data), pb.AppendRequest())), timeout=10)
    if resp.status != pb.OK:
        raise ProbeError(f"append: {pb.Status.Name(resp.status)}")
    got = b""
    call = stub.Read(pb.ReadRequest(journal=PROBE, offset=resp.commit.begin, block=False), timeout=10)
    try:
        async for r in call:
            got += r.content
            if len(got) >= len(data) or (not r.content and r.status != pb.OK):
                break
    finally:
        call.cancel()
    if got[:len(data)] != data:
        raise ProbeError(f"read returned {got[:80]!r}")


def gazctl_time(cluster: Cluster, *args: str) -> float:
    start = time.monotonic()
    r = cluster.gazctl(*args, timeout=600)
    took = time.monotonic() - start
    if r.rc != 0:  # a failed listing is reported, not timed
        progress(f"  gazctl {' '.join(args)} failed: {r.stderr.strip()[-300:]}")
        return float("nan")
    return took


def check_alive(cluster: Cluster, procs: Sequence[ConsumerProc] = ()) -> None:
    """Raises if a broker or consumer exited: later figures would measure a smaller cluster."""
    dead = [b.broker_id for b in cluster.brokers if not b.is_running()]
    dead += [p.suffix for p in procs if not p.running()]
    if dead:
        raise RuntimeError(f"{', '.join(dead)} exited (see its log; --keep keeps them)")


@dataclass
class Row:
    count: int
    cells: dict[str, float] = field(default_factory=dict)


async def journal_steps(a: argparse.Namespace, etcd: EtcdProcess, ec: aetcd.Client, cluster: Cluster,
                        rows: list[Row]) -> None:
    brokers = cluster.brokers
    pids = [b.pid for b in brokers]
    assert all(p is not None for p in pids)
    bpids: list[int] = [p for p in pids if p is not None]
    async with JournalClient(brokers[0].address) as client:
        await client.apply(apply_request(journals_yaml([PROBE], "scale-probe/")))
        await fully_assigned(ec, BROKERS_ROOT, "scale-probe/", 1, a.timeout)
        deadline = time.monotonic() + 60
        while True:  # etcd has the assignment before the brokers have read it and started replicas
            try:
                await probe(brokers, 5)  # and warms channels and proxies
                break
            except (RuntimeError, grpc.aio.AioRpcError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # a retry pause: the brokers catch up with etcd
        base_rss = sum(rss_bytes(p) for p in bpids)
        progress(f"empty brokers: {base_rss / 2**20:.0f} MiB RSS together")
        logs = LogTail([b.log_path for b in brokers])
        have = 0
        for n, step in enumerate(a.steps, 1):
            new = [f"{PREFIX}j-{i:06d}" for i in range(have, step)]
            progress(f"step {n}/{len(a.steps)}: applying {len(new):,} journals ({step:,} in all)")
            events0 = etcd_metric(etcd.url, "etcd_debugging_mvcc_events_total")
            cpu0 = sum(cpu_seconds(p) for p in [*bpids, etcd.pid or 0])
            by0 = cpu_by_process(bpids, etcd.pid or 0)
            t0 = time.monotonic()
            await client.apply(apply_request(journals_yaml(new)), DEFAULT_MAX_TXN_SIZE)
            applied = time.monotonic() - t0
            by1 = cpu_by_process(bpids, etcd.pid or 0)
            progress(f"  applied in {applied:.1f}s (CPU s meanwhile: {cpu_delta(by0, by1)}); waiting for assignment")
            assigned = await fully_assigned(ec, BROKERS_ROOT, PREFIX, step, a.timeout)
            events = etcd_metric(etcd.url, "etcd_debugging_mvcc_events_total") - events0
            busy = time.monotonic() - t0
            nsolves, solve_s = solves(logs.read())
            progress(f"  assigned in etcd {assigned:.1f}s after the apply; waiting for the brokers' logs "
                     f"to be quiet for {a.settle:.0f}s")
            quiet_after = await settle(logs, a.settle, a.timeout)
            still_after = await etcd_still(ec, a.settle, a.timeout)
            behind = await caught_up([b.url("/debug/metrics") for b in cluster.brokers], ec, a.timeout)
            step_cpu = sum(cpu_seconds(p) for p in [*bpids, etcd.pid or 0]) - cpu0
            progress(f"  CPU s after the apply: {cpu_delta(by1, cpu_by_process(bpids, etcd.pid or 0))}")
            progress(f"  etcd still {still_after:.1f}s after the logs went quiet, every broker's keyspace "
                     f"at its revision {behind:.1f}s later; the step took "
                     f"{step_cpu:.1f} s of CPU ({1e3 * step_cpu / len(new):.2f} ms per journal)")
            nsolves2, solve_s2 = solves(logs.read_seen)
            nsolves, solve_s = nsolves + nsolves2, solve_s + solve_s2
            if a.idle_delay:
                progress(f"  waiting {a.idle_delay:.0f}s (--idle-delay)")
                await asyncio.sleep(a.idle_delay)  # the bench's own schedule, not synchronisation
            progress(f"  quiet {quiet_after:.1f}s after assignment; idle CPU over {a.idle:.0f}s")
            appends0 = appends_served(cluster.brokers)
            cpu = await idle_cpu([*bpids, etcd.pid or 0], a.idle)
            pulses = (appends_served(cluster.brokers) - appends0) / a.idle
            rss = sum(rss_bytes(p) for p in bpids)
            progress("  listing and probing")
            start_s = gazctl_time(cluster, "journals", "list", "--help")
            list_s = min(gazctl_time(cluster, "journals", "list", "-l", f"prefix={PREFIX}")
                         for _ in range(a.list_runs))
            rpc_s = float("inf")
            for _ in range(a.list_runs):
                t1 = time.monotonic()
                listed = await client.list(label_selector(include=[("prefix", PREFIX)]))
                rpc_s = min(rpc_s, time.monotonic() - t1)
            assert len(listed.journals) == step, len(listed.journals)
            progress(f"  {rss / 2**20:.0f} MiB RSS ({(rss - base_rss) / 1024 / (2 * step):.1f} KiB per "
                     f"replica); idle CPU % brokers {' / '.join(f'{c:.1f}' for c in cpu[:-1])}, etcd "
                     f"{cpu[-1]:.1f}; gazctl start {start_s:.2f}s, list {list_s:.2f}s, List RPC {rpc_s:.2f}s")
            p50, p99, worst, probe_errors = await probe(brokers, a.probes)
            row = Row(step, {
                "apply ms/j": 1e3 * applied / len(new),
                "CPU ms/j": 1e3 * step_cpu / len(new),
                "assigned s": assigned, "quiet s": quiet_after, "still s": still_after,
                "solves": nsolves, "solve s": solve_s,
                "RSS MiB": rss / 2**20,
                "RSS KiB/rep": (rss - base_rss) / 1024 / (2 * step),
                **{f"idle b{i + 1} %": c for i, c in enumerate(cpu[:-1])},
                "idle brokers %": sum(cpu[:-1]), "idle etcd %": cpu[-1], "idle pulses/s": pulses,
                "gazctl start s": start_s, "list s": list_s, "List RPC s": rpc_s,
                "p50 ms": p50 * 1e3, "p99 ms": p99 * 1e3, "worst p50 ms": worst * 1e3,
                "probe errors": probe_errors,
                "suspended": sum(1 for j in listed.journals if j.spec.suspend.level == pb.JournalSpec.Suspend.FULL),
                "etcd db MiB": etcd_metric(etcd.url, "etcd_mvcc_db_total_size_in_bytes") / 2**20,
                "watch ev/s": events / busy,
            })
            rows.append(row)
            print(table([row], "journals"), flush=True)
            have = step
            check_alive(cluster)


# -- shards ----------------------------------------------------------------------------------


def shards_of(ids: Sequence[int]) -> pc.ApplyRequest:
    req = pc.ApplyRequest()
    for i in ids:
        spec = req.changes.add().upsert
        spec.id = f"scale-{i:06d}"
        spec.sources.add(journal=f"scale-src/part-{i % SOURCES:03d}")
        spec.hot_standbys = 1
        spec.max_txn_duration.seconds = 1
    return req


async def shards_ready(etcd: aetcd.Client, root: str, want: int, patience: float) -> float:
    """Polls etcd until ``want`` shards have one PRIMARY and one STANDBY replica status (the
    values of their assignments); the seconds it took (to within the poll period)."""
    start = said = time.monotonic()
    primary, standby = pc.ReplicaStatus.PRIMARY, pc.ReplicaStatus.STANDBY
    while True:
        done = 0
        for slots in (await assignments(etcd, root, "scale-")).values():
            codes = [pc.ReplicaStatus.FromString(v).code for v in slots.values()]
            done += codes.count(primary) == 1 and codes.count(standby) == 1
        if done >= want:
            return time.monotonic() - start
        if time.monotonic() - start > patience:
            raise TimeoutError(f"{done} of {want} shards PRIMARY with a STANDBY after {patience:.0f}s")
        if time.monotonic() - said > 5:
            progress(f"  {done:,} of {want:,} shards PRIMARY with one STANDBY")
            said = time.monotonic()
        await asyncio.sleep(POLL)  # the poll period: etcd is read, not waited on


async def shard_steps(a: argparse.Namespace, etcd: EtcdProcess, ec: aetcd.Client, cluster: Cluster,
                      root: Path, rows: list[Row]) -> None:
    async with JournalClient(cluster.brokers[0].address) as jc:
        names = [f"scale-src/part-{i:03d}" for i in range(SOURCES)]
        await jc.apply(apply_request(journals_yaml(names, "scale-src/")))
        await fully_assigned(ec, BROKERS_ROOT, "scale-src/", SOURCES, a.timeout)
    app_dir = root / "app"
    app_dir.mkdir()
    (app_dir / "scaleapp.py").write_text(APP)
    prefix = CONSUMERS_ROOT
    base = {**os.environ, "BROKER_ADDRESS": cluster.brokers[0].address, "ETCD_ADDRESS": etcd.url,
            "ETCD_PREFIX": prefix, "ETCD_LEASE": a.etcd_lease, "CONSUMER_LIMIT": str(max(a.shard_steps) * 2),
            "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")])}
    procs = [ConsumerProc(f"cons-{i}", consumer_env(base, CONSUMER_ZONE=ZONES[i % 2]), cluster.log_dir,
                          app="scaleapp:App")
             for i in range(a.consumers)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(endpoints := await consumer_endpoints(ec, prefix)) < len(procs):
            if time.monotonic() > deadline or not all(p.running() for p in procs):
                raise RuntimeError("consumer processes did not announce themselves")
            await asyncio.sleep(0.2)  # polling etcd's member keys, not synchronisation
        cpids = [p.pid for p in procs if p.pid is not None]
        base_rss = sum(rss_bytes(p) for p in cpids)
        progress(f"empty consumers: {base_rss / 2**20:.0f} MiB RSS together")
        logs = LogTail([p.log_path for p in procs])
        logs.read()
        have = 0
        async with ShardClient(endpoints[0]) as client:
            for n, step in enumerate(a.shard_steps, 1):
                progress(f"shard step {n}/{len(a.shard_steps)}: applying {step - have:,} shards ({step:,} in all)")
                t0 = time.monotonic()
                await client.apply(shards_of(range(have, step)), DEFAULT_MAX_TXN_SIZE)
                applied = time.monotonic() - t0
                progress(f"  applied in {applied:.1f}s; waiting for PRIMARY + STANDBY")
                ready = await shards_ready(ec, CONSUMERS_ROOT, step, a.timeout)
                nsolves, solve_s = solves(logs.read())
                progress(f"  ready {ready:.1f}s after the apply; waiting for the consumers' logs to be "
                         f"quiet for {a.settle:.0f}s")
                await settle(logs, a.settle, a.timeout)
                await etcd_still(ec, a.settle, a.timeout)
                await caught_up([f"{e}/debug/metrics" for e in endpoints], ec, a.timeout)
                nsolves2, solve_s2 = solves(logs.read_seen)
                nsolves, solve_s = nsolves + nsolves2, solve_s + solve_s2
                if a.idle_delay:
                    await asyncio.sleep(a.idle_delay)  # the bench's own schedule
                cpu = await idle_cpu([*cpids, *(b.pid or 0 for b in cluster.brokers)], a.idle)
                rss = sum(rss_bytes(p) for p in cpids)
                list_s = gazctl_time(cluster, "shards", "list", "--consumer.address", endpoints[0])
                row = Row(step, {
                    "apply ms/s": 1e3 * applied / (step - have),
                    "ready s": ready, "solves": nsolves, "solve s": solve_s,
                    "RSS MiB": rss / 2**20, "RSS KiB/shard": (rss - base_rss) / 1024 / step,
                    **{f"idle c{i + 1} %": c for i, c in enumerate(cpu[:len(cpids)])},
                    "idle consumers %": sum(cpu[:len(cpids)]), "idle brokers %": sum(cpu[len(cpids):]),
                    "list s": list_s,
                })
                rows.append(row)
                print(table([row], "shards"), flush=True)
                have = step
                check_alive(cluster, procs)
    finally:
        for p in procs:
            p.kill()


# -- output ----------------------------------------------------------------------------------


def fmt(v: float) -> str:
    if v != v:  # NaN
        return "-"
    if abs(v) >= 100 or float(v).is_integer():
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def table(rows: Sequence[Row], what: str) -> str:
    cols = list(rows[0].cells)
    lines = ["| " + " | ".join([what, *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    lines += ["| " + " | ".join([f"{r.count:,}", *(fmt(r.cells[c]) for c in cols)]) + " |" for r in rows]
    return "\n".join(lines)


def ratios(rows: Sequence[Row], what: str, cols: Sequence[str]) -> str:
    first = rows[0]
    lines = [f"ratios to the first step ({first.count:,} {what}):",
             "| " + " | ".join([what, *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        cells = [f"{r.cells[c] / first.cells[c]:.2f}x" if first.cells[c] else "-" for c in cols]
        lines.append("| " + " | ".join([f"{r.count:,}", *cells]) + " |")
    return "\n".join(lines)


def plot(path: Path, curves: Sequence[tuple[str, Sequence[Row], Sequence[str]]]) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install .[bench]): no plot written"
    panels = [(what, rows, col) for what, rows, cols in curves for col in cols]
    ncols = 3
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    for ax, (what, rows, col) in zip(axes.flat, panels, strict=False):
        ax.plot([r.count for r in rows], [r.cells[col] for r in rows], marker="o")
        ax.set_title(col, fontsize=10)
        ax.set_xlabel(what)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return f"plot written to {path}"


JOURNAL_RATIOS = ["apply ms/j", "CPU ms/j", "assigned s", "RSS KiB/rep", "idle brokers %", "list s", "List RPC s",
                  "p50 ms", "p99 ms"]
JOURNAL_PLOT = ["apply ms/j", "assigned s", "solve s", "RSS KiB/rep", "idle brokers %", "list s",
                "p50 ms", "etcd db MiB", "watch ev/s"]
SHARD_COLS = ["apply ms/s", "ready s", "RSS KiB/shard", "idle consumers %", "list s"]


def counts(text: str) -> list[int]:
    out = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    if out != sorted(out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError("steps must increase")
    return out


async def run(a: argparse.Namespace, root: Path) -> None:
    limit = str(max(a.steps) + 1000)
    rows: list[Row] = []
    shard_rows: list[Row] = []
    etcd = EtcdProcess(root / "etcd", unsafe_no_fsync=not a.fsync)
    etcd.start()
    try:
        ec = await connect(etcd.url)
        with Cluster(etcd.url, BROKERS_ROOT + "/", root / "cluster", gazctl_timeout=600) as cluster:
            for i in range(a.brokers):
                cluster.add_broker(ZONES[i % 2], f"broker-{i + 1}",
                                   extra_args=("--broker.limit", limit, "--etcd.lease", a.etcd_lease,
                                               *a.broker_args.split()))
            progress(f"etcd and {a.brokers} brokers up under {root}")
            failed = ""
            try:
                await journal_steps(a, etcd, ec, cluster, rows)
                if a.shards:
                    await shard_steps(a, etcd, ec, cluster, root, shard_rows)
            except Exception as err:  # noqa: BLE001 - what was measured is still printed
                failed = f"stopped early: {type(err).__name__}: {err}"
                progress(failed)
        await ec.close()
    finally:
        etcd.close()
    out = [f"# scale_bench.py {' '.join(sys.argv[1:])} ({time.strftime('%Y-%m-%d %H:%M')}, "
           f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end)", ""]
    if rows:
        out += [f"## journals (replication 2, {a.brokers} brokers in two zones)", "", table(rows, "journals"), "",
                ratios(rows, "journals", JOURNAL_RATIOS)]
    curves: list[tuple[str, Sequence[Row], Sequence[str]]] = [("journals", rows, JOURNAL_PLOT)] if rows else []
    if shard_rows:
        out += ["", f"## shards (one hot standby, {a.consumers} consumer processes)", "",
                table(shard_rows, "shards"), "", ratios(shard_rows, "shards", SHARD_COLS)]
        curves.append(("shards", shard_rows, SHARD_COLS))
    if failed:
        out += ["", failed]
    text = "\n".join(out)
    print("\n" + text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale_bench.md").write_text(text + "\n")
    print(plot(a.out / "scale_bench.png", curves) if curves else "nothing to plot")
    print(f"table written to {a.out / 'scale_bench.md'}")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=counts, default=None,
                    help="journal counts, each step adding to the previous (default 1000,5000,10000)")
    ap.add_argument("--quick", action="store_true", help="500,2000 journals (shards: 100,500)")
    ap.add_argument("--shards", action="store_true", help="also the consumer part")
    ap.add_argument("--shard-steps", type=counts, default=None, help="shard counts (default 500,2000,5000)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured per step")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds without replica starts or solves in the logs before idle CPU is measured")
    ap.add_argument("--list-runs", type=int, default=3,
                    help="listings timed per step (gazctl and the RPC alone): the best is reported")
    ap.add_argument("--probes", type=int, default=200, help="append+read round trips per broker per step")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a step may take to assign")
    ap.add_argument("--etcd-lease", default="20s",
                    help="the brokers' --etcd.lease (Gazette's default 20s; a broker whose event loop "
                         "lags longer loses its lease and exits)")
    ap.add_argument("--brokers", type=int, default=3, help="broker processes (zones alternate a, b)")
    ap.add_argument("--consumers", type=int, default=3, help="consumer processes with --shards")
    ap.add_argument("--broker-args", default="",
                    help="more flags for every broker, e.g. '--broker.auto-suspend --broker.health-interval 2s'")
    ap.add_argument("--idle-delay", type=float, default=0.0,
                    help="seconds to wait after a step settled before measuring idle CPU (auto-suspension "
                         "acts 15 health intervals after a journal's route last changed)")
    ap.add_argument("--fsync", action="store_true", help="etcd fsyncs (default: --unsafe-no-fsync)")
    ap.add_argument("--out", type=Path, default=Path("scale-bench-out"), help="where the table and PNG go")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    a = ap.parse_args(argv)
    a.steps = a.steps or ([500, 2000] if a.quick else [1000, 5000, 10000])
    a.shard_steps = a.shard_steps or ([100, 500] if a.quick else [500, 2000, 5000])
    root = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    try:
        asyncio.run(run(a, root))
    finally:
        if a.keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Message publish and read-committed throughput, beside NATS JetStream in the same run.

Starts its own etcd, one gazette broker and one nats-server with JetStream (file storage), on
loopback ports of its own (see ``_peers.py``), and drives both from this process:

* publish: 100-byte JSON messages (a JSON object of about 50 bytes of fields plus the
  ``"UUID"`` the Publisher stamps, framed as one line), through ``Publisher`` ->
  ``AppendService`` -> one broker, into one journal and into four journals (modulo mapping
  on a key); timed from the first publish until every append has committed. Two ways:
  ``publish_committed`` per message (the handle is kept, nothing awaited per message), and
  ``publish_committed_many`` over slices of 1000 messages. Transactions: four producers
  interleaved, ``publish_uncommitted`` with an ACK every 100 messages.
  JetStream: ``js.publish_async`` per message of the same documents (JSON-encoded in the
  loop, UUID text precomputed), timed until every ack arrived.
* read committed: the journals read from offset 0 to their write head through
  ``RetryReader`` -> ``ReadCommittedIter`` (JSON decode, UUID parse, Sequencer), counting
  messages. JetStream: a pull consumer (``AckPolicy.NONE``) fetching batches of 4096, each
  message JSON-decoded.

Prints msgs/s per workload (by wall time, and per CPU-second of this client process, which is
steadier on a shared machine), gazette/jetstream ratios and the targets (>= 150k msgs/s
published, >= 200k msgs/s read committed, per process). Figures are noisy on shared machines:
compare the ratios of one run, not absolute figures across runs. Every process it starts is stopped by PID
on every exit path, Ctrl-C included.

    python bench/publish_bench.py            # about 3.5 minutes (JetStream cases dominate)
    python bench/publish_bench.py --quick    # about 40 seconds
    python bench/publish_bench.py --systems gazette --profile-client client.prof
    python bench/publish_bench.py --quick --builds interpreted,compiled,compiled+uvloop

With ``--builds`` the bench runs once per build (``_builds.py``): the client (Publisher,
AppendService, the readers) and the broker run under each build's python and event loop;
JetStream (its nats-py client on the first build's loop) runs in the first build's child.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _builds  # noqa: E402
from _jetstream import JetStreamClient  # noqa: E402
from _peers import NATS_SERVER, Peers  # noqa: E402

from gazette import malloc  # noqa: E402
from gazette.client import AppendService, JournalClient  # noqa: E402
from gazette.message import (  # noqa: E402
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    JSONFraming,
    JSONMessage,
    Publisher,
    ReadCommittedIter,
    Sequencer,
    build_uuid,
    modulo_mapping,
    new_producer_id,
)
from gazette.message.mapping import MappingFunc  # noqa: E402
from gazette.message.source import JournalSource  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402

MiB = 1 << 20
PUBLISH_TARGET = 150_000.0
READ_TARGET = 200_000.0
TXN_SIZE = 100
MANY_SLICE = 1000


class BenchError(Exception):
    """A peer answered a benchmark request with something other than success."""


@dataclass(frozen=True)
class Plan:
    messages: int
    runs: int

    @staticmethod
    def quick() -> Plan:
        return Plan(messages=100_000, runs=1)

    @staticmethod
    def full() -> Plan:
        return Plan(messages=300_000, runs=2)


@dataclass
class Result:
    count: int
    seconds: float
    cpu: float = 0.0  # CPU seconds of this (client) process, all threads

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_rate(self) -> float:
        return self.count / self.cpu if self.cpu > 0 else 0.0


class Timer:
    """Wall and process CPU time of a block."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def result(self, count: int) -> Result:
        return Result(count, self.wall, self.cpu)


@dataclass
class Row:
    workload: str
    gazette: Result | None = None
    jetstream: Result | None = None
    target: float = 0.0


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)


def documents(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Application documents: ~50 bytes of fields; with the UUID a 100-byte line."""
    return [{"key": f"user-{(i * 7919 + seed) % 1009:05d}", "n": i, "ok": True,
             "pad": "abcdefgh"} for i in range(n)]


def to_journal(journal: str) -> MappingFunc:
    """The mapping of a single journal."""
    out = (journal, CONTENT_TYPE_JSON_LINES)
    return lambda msg: out


def key_of(msg: JSONMessage) -> bytes:
    key: str = msg.doc["key"]
    return key.encode()


async def best_of(runs: int, once: Callable[[int], Awaitable[Result]]) -> Result:
    best: Result | None = None
    for i in range(runs):
        r = await once(i)
        if best is None or r.rate > best.rate:
            best = r
    assert best is not None
    return best


# -- gazette ---------------------------------------------------------------------------------


class GazetteSide:
    def __init__(self, address: str) -> None:
        self.client = JournalClient(address)
        self.counter = 0

    async def close(self) -> None:
        await self.client.close()

    async def create(self, names: list[str]) -> None:
        changes = []
        for name in names:
            spec = pb.JournalSpec(name=name, replication=1)
            spec.labels.labels.add(name=CONTENT_TYPE, value=CONTENT_TYPE_JSON_LINES)
            spec.fragment.length = 512 * MiB
            spec.fragment.compression_codec = pb.NONE
            spec.fragment.stores.append("file:///")
            spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
            changes.append(pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0))
        await self.client.apply(changes)
        # Wait until each is writable (the allocator assigns a primary within moments).
        async with AppendService(self.client, max_attempts=200,
                                 backoff=lambda attempt: 0.05) as svc:
            for name in names:
                svc.append_nowait(name, b"")

    def listing(self, names: list[str]) -> pb.ListResponse:
        resp = pb.ListResponse()
        for name in names:
            j = resp.journals.add()
            j.spec.name = name
            j.spec.labels.labels.add(name=CONTENT_TYPE, value=CONTENT_TYPE_JSON_LINES)
        return resp

    async def publish(self, mapping: MappingFunc, docs: list[dict[str, Any]],
                      many: bool) -> Result:
        msgs = [JSONMessage(dict(d)) for d in docs]
        async with AppendService(self.client) as svc:
            pub = Publisher(svc)
            with Timer() as t:
                if many:
                    for i in range(0, len(msgs), MANY_SLICE):
                        await pub.publish_committed_many(mapping, msgs[i:i + MANY_SLICE])
                else:
                    publish = pub.publish_committed
                    for msg in msgs:
                        await publish(mapping, msg)
                await svc.flush()
        return t.result(len(msgs))

    async def publish_txns(self, mapping: MappingFunc, docs: list[dict[str, Any]]) -> Result:
        """Four producers, round robin, each committing every TXN_SIZE messages."""
        msgs = [JSONMessage(dict(d)) for d in docs]
        async with AppendService(self.client) as svc:
            pubs = [Publisher(svc) for _ in range(4)]
            with Timer() as t:
                for i, msg in enumerate(msgs):
                    pub = pubs[i % 4]
                    await pub.publish_uncommitted(mapping, msg)
                    if (i // 4) % TXN_SIZE == TXN_SIZE - 1:
                        for intent in pub.build_ack_intents():
                            svc.append_nowait(intent.journal, intent.intent)
                for pub in pubs:
                    for intent in pub.build_ack_intents():
                        svc.append_nowait(intent.journal, intent.intent)
                await svc.flush()
        return t.result(len(msgs))

    async def read_committed(self, journals: list[str]) -> Result:
        """Reads each journal to its head, read-committed; the count of messages."""
        count = 0

        def replay(j: str, begin: int, end: int) -> JournalSource:
            return JournalSource(self.client, j, begin, end)

        with Timer() as t:
            for journal in journals:
                it = ReadCommittedIter(JournalSource(self.client, journal), JSONFraming(),
                                       JSONMessage.from_json_many, Sequencer(), replay)
                while batch := await it.next_batch():
                    count += len(batch)
        return t.result(count)


# -- JetStream -------------------------------------------------------------------------------


class JetStreamSide(JetStreamClient):
    """JetStream async publish and pull-consumer reads of the same messages."""

    async def create(self, stream: str, subjects: list[str]) -> None:
        await self.js.add_stream(name=stream, subjects=subjects, storage=StorageType.FILE,
                                 num_replicas=1)

    async def publish(self, subjects: list[str], docs: list[dict[str, Any]]) -> Result:
        producer = new_producer_id()
        docs = [dict(d, UUID=str(build_uuid(producer, 1 << 60 | i << 4, 0)))
                for i, d in enumerate(docs)]
        encode = json.JSONEncoder(separators=(",", ":")).encode
        publish = self.js.publish_async
        n = len(subjects)
        with Timer() as t:
            for i, doc in enumerate(docs):
                await publish(subjects[i % n], encode(doc).encode())
            async with asyncio.timeout(120):
                await self.js.publish_async_completed()
        return t.result(len(docs))

    async def read(self, stream: str, subject: str) -> Result:
        info = await self.js.stream_info(stream)
        total = int(info.state.messages)
        sub = await self.js.pull_subscribe(
            subject, stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        got = 0
        loads = json.loads
        try:
            with Timer() as t:
                while got < total:
                    msgs = await sub.fetch(min(4096, total - got), timeout=10)
                    for m in msgs:
                        loads(m.data)
                    got += len(msgs)
        finally:
            await sub.unsubscribe()
        return t.result(got)


# -- the run ---------------------------------------------------------------------------------


async def bench(report: Report, plan: Plan, gazette_address: str | None,
                nats_port: int | None) -> None:
    gz = GazetteSide(gazette_address) if gazette_address else None
    js = JetStreamSide() if nats_port else None
    n = plan.messages
    try:
        if js is not None and nats_port is not None:
            await js.connect(nats_port)

        async def row(name: str, target: float, g: Callable[[int], Awaitable[Result]] | None,
                      j: Callable[[int], Awaitable[Result]] | None) -> None:
            r = Row(name, target=target)
            if gz is not None and g is not None:
                r.gazette = await best_of(plan.runs, g)
            if js is not None and j is not None:
                r.jetstream = await best_of(plan.runs, j)
            report.rows.append(r)
            print_row(r, flush=True)

        one = ["bench/one"]
        four = [f"bench/four/part-{i:03d}" for i in range(4)]
        if gz is not None:
            await gz.create(one + four + ["bench/txn"])
        if js is not None:
            await js.create("ONE", ["one"])
            await js.create("FOUR", ["four.*"])
        js_four = [f"four.{i}" for i in range(4)]

        def pub_gz(journals: list[str], many: bool) -> Callable[[int], Awaitable[Result]]:
            assert gz is not None
            listing = gz.listing(journals)
            mapping = modulo_mapping(key_of, lambda: listing) if len(journals) > 1 else \
                to_journal(journals[0])
            return lambda run: gz.publish(mapping, documents(n, run), many)

        def pub_js(subjects: list[str]) -> Callable[[int], Awaitable[Result]]:
            assert js is not None
            return lambda run: js.publish(subjects, documents(n, run))

        await row("publish 100 B -> 1 journal", PUBLISH_TARGET,
                  pub_gz(one, False) if gz else None, pub_js(["one"]) if js else None)
        await row("publish_many 100 B -> 1 journal", PUBLISH_TARGET,
                  pub_gz(one, True) if gz else None, None)
        await row("publish 100 B -> 4 journals", PUBLISH_TARGET,
                  pub_gz(four, False) if gz else None, pub_js(js_four) if js else None)
        await row("publish_many 100 B -> 4 journals", PUBLISH_TARGET,
                  pub_gz(four, True) if gz else None, None)
        if gz is not None:
            txn_listing = gz.listing(["bench/txn"])
            txn_mapping = modulo_mapping(key_of, lambda: txn_listing)
            await row(f"publish txns of {TXN_SIZE}, 4 producers", PUBLISH_TARGET,
                      lambda run: gz.publish_txns(txn_mapping, documents(n, run)), None)
        await row("read committed, 1 journal", READ_TARGET,
                  (lambda run: gz.read_committed(one)) if gz else None,
                  (lambda run: js.read("ONE", "one")) if js else None)
        await row("read committed, 4 journals", READ_TARGET,
                  (lambda run: gz.read_committed(four)) if gz else None,
                  (lambda run: js.read("FOUR", "four.*")) if js else None)
        if gz is not None:
            await row(f"read committed, txns of {TXN_SIZE}", READ_TARGET,
                      lambda run: gz.read_committed(["bench/txn"]), None)
    finally:
        if gz is not None:
            await gz.close()
        if js is not None:
            await js.close()


# -- output ----------------------------------------------------------------------------------


def cell(r: Result | None) -> str:
    if r is None:
        return "-"
    return f"{r.rate / 1000:6.1f}k /s {r.cpu_rate / 1000:6.1f}k /cpu-s"


def print_row(row: Row, flush: bool = False) -> None:
    ratio = "-"
    if row.gazette is not None and row.jetstream is not None and row.jetstream.rate > 0:
        ratio = f"{row.gazette.rate / row.jetstream.rate:.2f}x"
    verdict = "-"
    if row.gazette is not None and row.target:
        verdict = ("meets" if row.gazette.rate >= row.target else "BELOW") + \
            f" {row.target / 1000:.0f}k"
    print(f"{row.workload:<36} | {cell(row.gazette):>26} | {cell(row.jetstream):>26} | "
          f"{ratio:>6} | {verdict}", flush=flush)


HEADER = (f"{'workload (msgs: wall, per client CPU-s)':<36} | {'gazette':>26} | "
          f"{'jetstream':>26} | {'ratio':>6} | target (wall)")


def machine_line() -> str:
    cores = os.cpu_count() or 0
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return (f"machine: {cores} cores, load {load[0]:.2f}, Python {platform.python_version()}, "
            f"nats-server at {NATS_SERVER}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (about 40 s)")
    ap.add_argument("--systems", choices=("both", "gazette", "jetstream"), default="both")
    ap.add_argument("--messages", type=int, default=0, help="messages per publish case")
    ap.add_argument("--runs", type=int, default=0, help="runs per case (the best is shown)")
    ap.add_argument("--profile-client", metavar="OUT", default="",
                    help="cProfile this (client) process, write OUT, print its top costs")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    _builds.add_arguments(ap)
    return ap.parse_args(argv)


def figures(report: Report) -> list[_builds.Figure]:
    """The rows for a ``--builds`` parent: k msgs/s by wall time (per client CPU-second
    beside it), and JetStream's."""
    def detail(r: Result | None) -> str:
        return f"{r.cpu_rate / 1000:.1f}k/cpu-s" if r is not None else ""

    return [_builds.Figure(row.workload, "k msgs/s",
                           row.gazette.rate / 1000 if row.gazette is not None else None,
                           detail(row.gazette),
                           row.jetstream.rate / 1000 if row.jetstream is not None else None,
                           detail(row.jetstream))
            for row in report.rows]


def targets(c: _builds.Combined) -> list[str]:
    """Per build, the bench's own targets (wall msgs/s): publish >= 150k, read >= 200k."""
    lines = []
    for b in c.builds:
        parts = []
        for w in c.rows:
            v = c.value(w, b.name)
            target = (READ_TARGET if w.startswith("read") else PUBLISH_TARGET) / 1000
            if v is not None:
                parts.append(f"{w}: {v:.0f}k " + ("meets" if v >= target else "BELOW")
                             + f" {target:.0f}k")
        lines.append(f"  {b.name}:")
        lines += [f"    {p}" for p in parts]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if _builds.is_parent(args):
        if args.profile_client:
            raise SystemExit("--builds runs one process per build: without --profile-client")
        return _builds.run_builds(
            args, sys.argv[1:] if argv is None else argv, __file__, peer_name="JetStream",
            acceptance=targets, acceptance_title="the bench's targets (wall msgs/s)",
            peer_note="its nats-py client on that child's loop")
    # SIGTERM ends the run as Ctrl-C does, so the peers are stopped.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    plan = Plan.quick() if args.quick else Plan.full()
    plan = Plan(args.messages or plan.messages, args.runs or plan.runs)
    run_gz = args.systems in ("both", "gazette")
    run_js = args.systems in ("both", "jetstream") and not args.no_peer
    print(machine_line())
    print(f"plan: {plan.messages} messages per case, best of {plan.runs} run(s); one client "
          "process (this one), brokers in their own processes on the same cores. Shared, noisy "
          "machine: compare ratios within one run.", flush=True)
    report = Report()
    started = time.monotonic()
    prof = cProfile.Profile() if args.profile_client else None
    with Peers(keep_dir=args.keep) as peers:
        address: str | None = None
        nats_port: int | None = None
        if run_gz:
            etcd_url = peers.start_etcd()
            port, _ = peers.start_broker(etcd_url)
            address = f"http://127.0.0.1:{port}"
        if run_js:
            nats_port = peers.start_nats()
        print(f"peers ready in {time.monotonic() - started:.1f} s\n")
        print(HEADER)
        print("-" * len(HEADER), flush=True)
        if prof is not None:
            prof.enable()
        try:
            malloc.tune()  # as the broker does: large messages reuse heap buffers
            # On the build's loop in a --builds child (asyncio.run otherwise).
            _builds.run(bench(report, plan, address, nats_port))
        finally:
            if prof is not None:
                prof.disable()
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    if args.json_out:
        _builds.write_result(args.json_out, figures(report))
    if prof is not None:
        prof.dump_stats(args.profile_client)
        out = io.StringIO()
        stats = pstats.Stats(args.profile_client, stream=out)
        stats.strip_dirs().sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; every process this run started has been stopped", file=sys.stderr)
        sys.exit(130)

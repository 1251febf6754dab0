"""Single-journal append and read throughput of a gazette broker beside NATS JetStream.

Starts its own etcd, one gazette broker (``python -m gazette.cli.serve``) and one nats-server
with JetStream (file storage), all on loopback ports of its own, and drives both from this
process with asyncio clients, workload by workload, so each ratio compares figures taken
moments apart on the same machine:

* append: one journal (replication 1) / one stream (1 replica, file storage) per payload size;
  100 B, 4 KiB, 64 KiB and 1 MiB payloads with 1 and 16 concurrent writers. Gazette: one
  ``Append`` RPC per append (header, content, commit) on a JournalStub over a ``gazette.rpc``
  channel (grpcio's with ``GAZETTE_RPC=grpcio``), the
  response (status OK, commit) awaited. JetStream: ``js.publish`` per message, its ack awaited.
  Each case runs for a bounded time, count and byte budget, whichever ends first.
* read: the whole journal from offset 0 to its head (a non-blocking ``Read``), and the whole
  stream through a pull consumer (``AckPolicy.NONE``, batched ``fetch``).

Prints a table ``workload | gazette | jetstream | gazette/jetstream`` and the MB/s ratios of the
>= 64 KiB workloads against the target (gazette >= 2x JetStream). Figures are noisy on shared
machines: compare the ratios of one run, not absolute figures across runs.

Every process it starts is stopped by PID on every exit path, Ctrl-C included.

    python bench/broker_bench.py            # full run, about 2-3 minutes
    python bench/broker_bench.py --quick    # about 30 seconds
    python bench/broker_bench.py --codec SNAPPY --systems gazette
    python bench/broker_bench.py --systems gazette --profile-broker broker.prof
    python bench/broker_bench.py --tls --auth      # the broker with TLS and bearer tokens
    python bench/broker_bench.py --systems gazette --event-loop asyncio   # servers on asyncio's loop
    python bench/broker_bench.py --builds interpreted,compiled,compiled+uvloop   # see _builds.py

With ``--builds`` the bench runs once per build (``_builds.py``): the broker and the null-Append
server run under each build's python and event loop, the client stays on asyncio's (it
drives the servers; it is not what is compared), JetStream runs in the first build's child.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import io
import os
import platform
import pstats
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from google.protobuf.duration_pb2 import Duration
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _builds  # noqa: E402
from _jetstream import JetStreamClient  # noqa: E402
from _peers import NATS_SERVER, Peers  # noqa: E402

from gazette import malloc  # noqa: E402
from gazette.auth import Authorizer, authorize_channel  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402
from gazette.protocol import protocol_pb2_grpc as pb_grpc  # noqa: E402
from gazette.rpc import use_grpcio  # noqa: E402
from gazette.rpc.channel import insecure_channel, secure_channel  # noqa: E402
from gazette.rpc.tls import ClientTLS  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
SIZES = (100, 4 * KiB, 64 * KiB, MiB)
WRITERS = (1, 16)
FRAGMENT_LENGTH = 512 * MiB  # Gazette's default fragment length
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
TARGET = 2.0


class BenchError(Exception):
    """A peer answered a benchmark request with something other than success."""


@dataclass(frozen=True)
class Plan:
    """Bounds of one run: every append case stops at the first of seconds, count and bytes."""

    seconds: float
    max_count: int
    max_bytes: int
    read_seconds: float
    sizes: tuple[int, ...] = SIZES
    writers: tuple[int, ...] = WRITERS

    @staticmethod
    def quick() -> Plan:
        return Plan(seconds=0.8, max_count=20_000, max_bytes=160 * MiB, read_seconds=2.0)

    @staticmethod
    def full() -> Plan:
        return Plan(seconds=3.0, max_count=200_000, max_bytes=1024 * MiB, read_seconds=8.0)


@dataclass
class Result:
    count: int
    nbytes: int
    seconds: float

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    workload: str
    gazette: Result | None = None
    jetstream: Result | None = None
    null: Result | None = None  # the null-Append ceiling of the transport, when measured
    is_append: bool = True
    size: int = 0
    writers: int = 0
    host_seconds: float = 0.0  # measured SHA-1s and pwrite per append of this size (see host_cost)
    gazette_cpu: float = 0.0  # the broker's CPU seconds per append (user + system), if known
    null_cpu: float = 0.0  # the null Append server's, likewise

    @property
    def ceiling(self) -> float | None:
        """Appends/s this design could reach here: the null Append's time per append (the
        transport and one RPC) plus the per-byte work no broker of this design avoids (the
        commit's and the fragment's SHA-1 and the spool's pwrite), all measured in this run."""
        if self.null is None or self.null.rate == 0:
            return None
        return 1.0 / (1.0 / self.null.rate + self.host_seconds)

    @property
    def of_ceiling(self) -> float | None:
        c = self.ceiling
        return self.gazette.rate / c if c and self.gazette is not None else None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)


def size_name(size: int) -> str:
    if size >= MiB and size % MiB == 0:
        return f"{size // MiB} MiB"
    if size >= KiB and size % KiB == 0:
        return f"{size // KiB} KiB"
    return f"{size} B"


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU seconds of process ``pid`` so far (0 if unknown): per-append CPU
    is a steadier figure than throughput on a shared machine."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(pid: int | None, run: Awaitable[Result]) -> tuple[Result, float]:
    """Runs ``run``; returns its result and ``pid``'s CPU seconds per operation meanwhile."""
    before = cpu_seconds(pid)
    result = await run
    return result, (cpu_seconds(pid) - before) / max(1, result.count)


def host_cost(size: int, scratch: Path, rounds: int = 3) -> float:
    """Seconds per append of the broker's unavoidable per-byte work on ``size`` bytes, measured
    here: two SHA-1s (the commit's running sum and the fragment's) and one ``pwrite`` into a
    spool file in the broker's scratch file system. The best of ``rounds`` runs."""
    import hashlib
    import tempfile

    payload = make_payload(size)
    n = max(20, min(5000, (64 * MiB) // size))
    best = float("inf")
    with tempfile.TemporaryFile(dir=scratch) as f:
        fd = f.fileno()
        for _ in range(rounds):
            os.ftruncate(fd, 0)
            start = time.perf_counter()
            offset = 0
            for _ in range(n):
                hashlib.sha1(payload).digest()
                hashlib.sha1(payload).digest()
                os.pwrite(fd, payload, offset)
                offset += size
            best = min(best, (time.perf_counter() - start) / n)
    return best


def make_payload(size: int) -> bytes:
    """JSON-like lines with random tokens: compressible as real events are, not trivially."""
    lines: list[bytes] = []
    total = 0
    i = 0
    while total < size:
        line = b'{"seq": %d, "user": "%s", "ok": true}\n' % (i, os.urandom(8).hex().encode())
        lines.append(line)
        total += len(line)
        i += 1
    data = b"".join(lines)[:size]
    return data[:-1] + b"\n" if size > 0 else data


async def run_writers(op: Callable[[], Awaitable[None]], writers: int, size: int,
                      plan: Plan) -> Result:
    """Runs ``op`` from ``writers`` concurrent tasks until the plan's time/count/byte budget."""
    budget = max(writers, min(plan.max_count, plan.max_bytes // size))
    issued = 0
    done = 0

    async def worker(deadline: float) -> None:
        nonlocal issued, done
        while issued < budget and time.perf_counter() < deadline:
            issued += 1
            await op()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(start + plan.seconds) for _ in range(writers)))
    elapsed = time.perf_counter() - start
    return Result(done, done * size, elapsed)


# -- gazette -------------------------------------------------------------------------------


class GazetteSide:
    """A JournalStub client of one broker: one channel, every RPC multiplexed on it."""

    def __init__(self, target: str, http_base: str | None = None, *,
                 tls: ClientTLS | None = None, auth: Authorizer | None = None) -> None:
        channel = (secure_channel(target, CHANNEL_OPTIONS, tls) if tls is not None
                   else insecure_channel(target, options=CHANNEL_OPTIONS))
        self.channel = authorize_channel(channel, auth)
        self.stub = pb_grpc.JournalStub(self.channel)  # type: ignore[no-untyped-call]
        self.heads: dict[str, int] = {}
        self.http_base = http_base
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        await self.channel.close()
        if self._http is not None:
            await self._http.close()

    def http_append_op(self, journal: str, payload: bytes) -> Callable[[], Awaitable[None]]:
        """One HTTP PUT per append through the broker's gateway (keep-alive connections)."""
        assert self.http_base is not None
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        session, url = self._http, f"{self.http_base}/{journal}"

        async def op() -> None:
            async with session.put(url, data=payload) as resp:
                if resp.status != 204:
                    raise BenchError(f"PUT {journal}: HTTP {resp.status} {await resp.text()}")

        return op

    async def create(self, journal: str, codec: int) -> None:
        spec = pb.JournalSpec(name=journal, replication=1)
        spec.fragment.length = FRAGMENT_LENGTH
        spec.fragment.compression_codec = codec  # type: ignore[assignment]
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
        spec.labels.labels.add(name="app.gazette.dev/bench", value="broker_bench")
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0)])
        resp = await self.stub.Apply(req, timeout=30)
        if resp.status != pb.OK:
            raise BenchError(f"Apply of {journal}: {pb.Status.Name(resp.status)}")

    def append_op(self, journal: str, payload: bytes) -> Callable[[], Awaitable[None]]:
        # Requests are built once: the RPC only serializes them (one header, one content
        # chunk, the empty commit chunk), so the client adds no per-append Python work.
        reqs = (pb.AppendRequest(journal=journal), pb.AppendRequest(content=payload),
                pb.AppendRequest())
        size = len(payload)
        heads = self.heads

        async def op() -> None:
            resp = await self.stub.Append(iter(reqs))
            if resp.status != pb.OK or resp.commit.end - resp.commit.begin != size:
                raise BenchError(
                    f"Append to {journal}: {pb.Status.Name(resp.status)} commit "
                    f"[{resp.commit.begin}, {resp.commit.end}) for {size} bytes"
                )
            if resp.commit.end > heads.get(journal, 0):
                heads[journal] = resp.commit.end

        return op

    async def warm(self, journal: str, payload: bytes, patience: float = 30.0) -> None:
        """Appends until the broker serves the journal (its assignment takes a moment)."""
        op = self.append_op(journal, payload)
        deadline = time.monotonic() + patience
        while True:
            try:
                await op()
                return
            except (BenchError, grpc.aio.AioRpcError) as err:
                if time.monotonic() >= deadline:
                    raise BenchError(f"{journal} not writable after {patience:.0f}s: {err}") from err
                await asyncio.sleep(0.05)  # a retry pause, not a synchronisation

    async def read_all(self, journal: str, seconds: float) -> Result:
        """Reads from offset 0 until the write head (or the time bound); counts content bytes."""
        head = self.heads.get(journal, 0)
        nbytes = 0
        responses = 0
        start = time.perf_counter()
        deadline = start + seconds
        call = self.stub.Read(pb.ReadRequest(journal=journal, offset=0, block=False))
        try:
            async for resp in call:
                if resp.content:
                    nbytes += len(resp.content)
                    responses += 1
                    if time.perf_counter() >= deadline:
                        break
                elif resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                    break
                elif resp.status != pb.OK:
                    raise BenchError(f"Read of {journal}: {pb.Status.Name(resp.status)}")
        finally:
            call.cancel()
        elapsed = time.perf_counter() - start
        if nbytes < head and time.perf_counter() < deadline:
            raise BenchError(f"Read of {journal} ended at {nbytes} before its head {head}")
        return Result(responses, nbytes, elapsed)


# -- JetStream -----------------------------------------------------------------------------


class JetStreamSide(JetStreamClient):
    """nats-py client of one nats-server: JetStream publish with acks, pull-consumer reads."""

    async def create(self, stream: str, subject: str) -> None:
        await self.js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE,
                                 num_replicas=1)

    def publish_op(self, subject: str, payload: bytes) -> Callable[[], Awaitable[None]]:
        publish = self.js.publish

        async def op() -> None:
            ack = await publish(subject, payload)
            if not ack.seq:
                raise BenchError(f"publish to {subject}: no sequence in ack {ack}")

        return op

    async def read_all(self, stream: str, subject: str, size: int, seconds: float) -> Result:
        """Reads the whole stream (or until the time bound) in fetches of about 8 MiB."""
        info = await self.js.stream_info(stream)
        total = int(info.state.messages)
        batch = max(1, min(4096, (8 * MiB) // size))
        sub = await self.js.pull_subscribe(
            subject, stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        got = 0
        nbytes = 0
        start = time.perf_counter()
        deadline = start + seconds
        try:
            while got < total and time.perf_counter() < deadline:
                msgs = await sub.fetch(min(batch, total - got), timeout=10)
                got += len(msgs)
                nbytes += sum(len(m.data) for m in msgs)
        finally:
            elapsed = time.perf_counter() - start
            await sub.unsubscribe()
        return Result(got, nbytes, elapsed)


# -- the run -------------------------------------------------------------------------------


async def bench(report: Report, plan: Plan, codecs: list[str], gazette_target: str | None,
                nats_port: int | None, null_port: int | None, http_base: str | None = None,
                tls: ClientTLS | None = None, auth: Authorizer | None = None,
                scratch: Path | None = None, pids: tuple[int | None, int | None] = (None, None)) -> None:
    gz_pid, null_pid = pids
    scratch = scratch or Path(os.getcwd())
    gz = GazetteSide(gazette_target, http_base, tls=tls, auth=auth) if gazette_target else None
    js = JetStreamSide() if nats_port else None
    null = GazetteSide(f"127.0.0.1:{null_port}") if null_port else None
    try:
        if js is not None and nats_port is not None:
            await js.connect(nats_port)
        for codec_name in codecs:
            codec = pb.CompressionCodec.Value(codec_name)
            with_js = js is not None and codec_name == "NONE"
            tag = "" if codec_name == "NONE" else f" [{codec_name}]"
            for size in plan.sizes:
                payload = make_payload(size)
                sname = size_name(size)
                key = sname.replace(" ", "").lower()
                journal = f"bench/{codec_name.lower()}/{key}"
                stream, subject = f"BENCH_{key.upper()}", f"bench.{key}"
                if gz is not None:
                    await gz.create(journal, codec)
                    await gz.warm(journal, payload)
                if with_js and js is not None:
                    await js.create(stream, subject)
                    await js.publish_op(subject, payload)()
                host = host_cost(size, scratch) if null is not None else 0.0
                for writers in plan.writers:
                    row = Row(f"append {sname:>7} x{writers:<2}{tag}", size=size,
                              writers=writers, host_seconds=host)
                    if gz is not None:
                        row.gazette, row.gazette_cpu = await timed(gz_pid, run_writers(
                            gz.append_op(journal, payload), writers, size, plan))
                    if with_js and js is not None:
                        row.jetstream = await run_writers(js.publish_op(subject, payload),
                                                          writers, size, plan)
                    if null is not None and codec_name == codecs[0]:
                        row.null, row.null_cpu = await timed(null_pid, run_writers(
                            null.append_op(journal, payload), writers, size, plan))
                    report.rows.append(row)
                    print_row(row, null is not None, flush=True)
                    if gz is not None and http_base is not None:
                        row = Row(f"append {sname:>7} x{writers:<2}{tag} [http]", size=size)
                        row.gazette = await run_writers(gz.http_append_op(journal, payload),
                                                        writers, size, plan)
                        row.jetstream = report.rows[-1].jetstream
                        report.rows.append(row)
                        print_row(row, null is not None, flush=True)
                row = Row(f"read   {sname:>7} msgs{tag}", is_append=False, size=size)
                if gz is not None:
                    row.gazette = await gz.read_all(journal, plan.read_seconds)
                if with_js and js is not None:
                    row.jetstream = await js.read_all(stream, subject, size, plan.read_seconds)
                report.rows.append(row)
                print_row(row, null is not None, flush=True)
    finally:
        if gz is not None:
            await gz.close()
        if js is not None:
            await js.close()
        if null is not None:
            await null.close()


# -- output --------------------------------------------------------------------------------


def cell(r: Result | None, is_append: bool) -> str:
    if r is None:
        return "-"
    if is_append:
        rate = r.rate
        rs = f"{rate / 1000:.1f}k/s" if rate >= 1000 else f"{rate:.0f}/s"
        return f"{r.mbps:8.1f} MB/s {rs:>8}"
    return f"{r.mbps:8.1f} MB/s {'':>8}"


def ratio(row: Row) -> float | None:
    if row.gazette is None or row.jetstream is None or row.jetstream.mbps == 0:
        return None
    return row.gazette.mbps / row.jetstream.mbps


HEADER = f"{'workload':<30} | {'gazette':>22} | {'jetstream':>22} | gazette/jetstream"
NULL_HEADER = (f" | {'null Append':>22} | {'ceiling':>22} | of ceiling"
               f" | CPU µs/append (broker, null)")


def print_row(row: Row, with_null: bool, flush: bool = False) -> None:
    r = ratio(row)
    rs = f"{r:6.2f}x" if r is not None else "      -"
    tail = ""
    if with_null:
        tail = f"{'':9} | {cell(row.null, row.is_append):>22}"
        c, f = row.ceiling, row.of_ceiling
        if c is not None and row.is_append:
            ceiling = Result(int(c * 1000), int(c * 1000) * row.size, 1000.0)
            tail += f" | {cell(ceiling, True):>22} | {f:6.2f}" if f is not None else f" | {cell(ceiling, True):>22} |"
            if row.gazette_cpu and row.null_cpu:
                tail += f"     | {row.gazette_cpu * 1e6:7.0f} {row.null_cpu * 1e6:7.0f}"
    print(f"{row.workload:<30} | {cell(row.gazette, row.is_append):>22} | "
          f"{cell(row.jetstream, row.is_append):>22} | {rs}{tail}", flush=flush)


def acceptance(report: Report) -> str:
    """The append-path issue's bar, row by row: every append >= 0.7 of its ceiling; 64 KiB and
    1 MiB >= 1.5x JetStream with 16 writers and >= 1.0x with one; 100 B and 4 KiB >= 0.8x
    JetStream with 16 writers."""
    lines = []
    for row in report.rows:
        if not row.is_append or "[" in row.workload:
            continue
        checks = []
        f = row.of_ceiling
        if f is not None:
            checks.append(f"{f:.2f} of ceiling ({'ok' if f >= 0.7 else 'below 0.7'})")
        r = ratio(row)
        want = (1.5 if row.writers > 1 else 1.0) if row.size >= 64 * KiB else (0.8 if row.writers > 1 else None)
        if r is not None and want is not None:
            checks.append(f"{r:.2f}x JetStream ({'ok' if r >= want else f'below {want}x'})")
        if checks:
            lines.append(f"  {row.workload.strip():<22} " + "; ".join(checks))
    return "acceptance (append path):\n" + "\n".join(lines) if lines else ""


def summary(report: Report) -> str:
    big = [(row, ratio(row)) for row in report.rows if row.size >= 64 * KiB]
    parts = [f"{row.workload.strip()} {r:.2f}x" for row, r in big if r is not None]
    if not parts:
        return "no >= 64 KiB ratios (both systems must run, codec NONE)"
    worst = min(r for _, r in big if r is not None)
    verdict = "meets" if worst >= TARGET else "BELOW"
    return (f">= 64 KiB MB/s ratios gazette/jetstream (target >= {TARGET:.0f}x): "
            + "; ".join(" ".join(p.split()) for p in parts)
            + f"  -> min {worst:.2f}x, {verdict} target")


def machine_line() -> str:
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    try:
        nats_version = subprocess.run([NATS_SERVER, "--version"], capture_output=True,
                                      text=True, timeout=5).stdout.strip()
    except OSError:
        nats_version = "nats-server: not found"
    return (f"machine: {cores} cores ({usable} usable), load {load[0]:.2f}, "
            f"Python {platform.python_version()}, grpcio {grpc.__version__}, {nats_version}")


def print_profile(path: str, title: str, limit: int = 25) -> None:
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    print(f"\n==== {title} profile ({path}) ====\n{out.getvalue()}")


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (about 30 s)")
    ap.add_argument("--systems", choices=("both", "gazette", "jetstream"), default="both")
    ap.add_argument("--codec", action="append", choices=("NONE", "SNAPPY"),
                    help="gazette journal codec(s); JetStream runs with NONE only (default NONE)")
    ap.add_argument("--sizes", default="",
                    help="comma-separated payload sizes in bytes (default 100,4096,65536,1048576)")
    ap.add_argument("--seconds", type=float, default=0.0, help="time bound per append case")
    ap.add_argument("--writers", default="",
                    help="comma-separated concurrent writers per append case (default 1,16)")
    ap.add_argument("--direct", action="store_true",
                    help="with GAZETTE_RPC=grpcio: dial the broker's private grpcio socket, skipping the splice")
    ap.add_argument("--profile-broker", metavar="OUT", default="",
                    help="run the broker under cProfile, write OUT, print its top costs")
    ap.add_argument("--profile-client", metavar="OUT", default="",
                    help="cProfile this (client) process, write OUT, print its top costs")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="also time a server (the broker's transport) whose Append stores nothing: "
                         "the ceiling of one Append RPC per append here (default: on for full runs)")
    ap.add_argument("--http", action="store_true",
                    help="also append through the broker's HTTP gateway (PUT, aiohttp client, "
                         "keep-alive): rows marked [http], beside the same JetStream figure")
    ap.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default=None,
                    help="the broker's and the null-Append server's event loop (GAZETTE_EVENT_LOOP; "
                         "default: theirs, auto); the client runs on asyncio's")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    ap.add_argument("--tls", action="store_true",
                    help="the broker serves TLS (a trustme certificate); the client dials it")
    ap.add_argument("--auth", action="store_true",
                    help="the broker verifies bearer tokens (--auth-keys); the client signs them")
    _builds.add_arguments(ap)
    return ap.parse_args(argv)


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGINT both end the run as Ctrl-C does, so the peers are stopped."""
    # A shell starts background jobs with SIGINT ignored; restore Python's handler so that
    # asyncio.run turns it into a cancellation of the run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))


def _security(args: argparse.Namespace, root: Path) -> tuple[list[str], Any, ClientTLS | None, Authorizer | None]:
    """The broker's TLS/auth flags, the readiness probe's SSL context, and the client's TLS
    and authorizer, for ``--tls`` and ``--auth`` (``bench/security_bench.py`` runs all three
    side by side)."""
    flags: list[str] = []
    ssl_context = tls = auth = None
    if args.tls:
        import ssl

        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(root / "ca.pem"))
        (root / "server.pem").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(root / "server.key"))
        flags += ["--broker.server-cert-file", str(root / "server.pem"),
                  "--broker.server-cert-key-file", str(root / "server.key")]
        ssl_context = ssl.create_default_context(cafile=str(root / "ca.pem"))
        tls = ClientTLS(ca_file=str(root / "ca.pem"))
    if args.auth:
        from gazette.auth import KeyedAuth

        key = base64.b64encode(b"broker_bench signing key, 32 bytes long").decode()
        flags += ["--auth-keys", key]
        auth = KeyedAuth(key)
    return flags, ssl_context, tls, auth


# The issue's bars (32, native speed): gazette/JetStream appends with 16 writers, by size.
NATIVE_BARS = {100: 0.6, 4 * KiB: 0.6, 64 * KiB: 1.0, MiB: 1.2}
NATIVE_CEILING = 0.7  # every append workload, of the null-Append ceiling of the same build


def figures(report: Report) -> list[_builds.Figure]:
    """The rows for a ``--builds`` parent: MB/s (appends/s beside), JetStream's, and the
    null-Append ceiling in MB/s."""
    def rate(r: Result | None, is_append: bool) -> str:
        if r is None or not is_append:
            return ""
        return f"{r.rate / 1000:.1f}k/s" if r.rate >= 1000 else f"{r.rate:.0f}/s"

    out = []
    for row in report.rows:
        g, j, ceiling = row.gazette, row.jetstream, row.ceiling
        out.append(_builds.Figure(
            " ".join(row.workload.split()), "MB/s", g.mbps if g is not None else None,
            rate(g, row.is_append), j.mbps if j is not None else None, rate(j, row.is_append),
            ceiling * row.size / 1e6 if ceiling is not None and row.is_append else None))
    return out


def native_acceptance(c: _builds.Combined) -> list[str]:
    """Per build: appends with 16 writers against JetStream (100 B and 4 KiB >= 0.6x, 64 KiB
    >= 1.0x, 1 MiB >= 1.2x), and every append workload >= 0.7 of the same build's ceiling."""
    shapes: dict[str, list[int]] = {}
    for extra in c.extra.values():
        shapes.update(extra.get("rows", {}))
    lines = []
    for b in c.builds:
        vs, of = [], []
        for w, (size, writers, plain) in shapes.items():
            if not plain:  # SNAPPY and [http] rows: not the bar's workloads
                continue
            r = c.of_peer(w, b.name)
            if writers == 16 and size in NATIVE_BARS and r is not None:
                bar = NATIVE_BARS[size]
                vs.append(f"{size_name(size)} {r:.2f}x " + ("ok" if r >= bar else f"BELOW {bar}x"))
            f = c.of_ceiling(w, b.name)
            if f is not None:
                of.append((f, w))
        lines.append(f"  {b.name:<19} x16 vs JetStream: " + ("; ".join(vs) or "not measured"))
        if of:
            low = [f"{w} {f:.2f}" for f, w in of if f < NATIVE_CEILING]
            lines.append(f"  {'':<19} >= {NATIVE_CEILING} of ceiling: "
                         + (f"all {len(of)} ok (min {min(of)[0]:.2f})" if not low
                            else "BELOW: " + "; ".join(low)))
        else:
            lines.append(f"  {'':<19} >= {NATIVE_CEILING} of ceiling: not measured (--baseline)")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if _builds.is_parent(args):
        if args.event_loop or args.profile_broker or args.profile_client:
            raise SystemExit("--builds sets each build's event loop and runs one process per "
                             "build: without --event-loop, --profile-broker, --profile-client")
        return _builds.run_builds(
            args, sys.argv[1:] if argv is None else argv, __file__, peer_name="JetStream",
            ceiling_name="null-Append ceiling", acceptance=native_acceptance,
            peer_note="the client runs on asyncio's loop in every child")
    _interrupt_on_signals()
    plan = Plan.quick() if args.quick else Plan.full()
    if args.sizes:
        plan = Plan(plan.seconds, plan.max_count, plan.max_bytes, plan.read_seconds,
                    sizes=tuple(int(s) for s in args.sizes.split(",")))
    if args.seconds > 0:
        plan = Plan(args.seconds, plan.max_count, plan.max_bytes, plan.read_seconds,
                    sizes=plan.sizes)
    if args.writers:
        plan = Plan(plan.seconds, plan.max_count, plan.max_bytes, plan.read_seconds,
                    sizes=plan.sizes, writers=tuple(int(w) for w in args.writers.split(",")))
    codecs = args.codec or ["NONE"]
    run_gz = args.systems in ("both", "gazette")
    run_js = args.systems in ("both", "jetstream") and not args.no_peer
    baseline = (not args.quick) if args.baseline is None else bool(args.baseline)

    if args.event_loop is not None:  # the children (broker, null-Append server) inherit it
        os.environ["GAZETTE_EVENT_LOOP"] = args.event_loop
    from gazette.server.loop import loop_factory

    server_loop = loop_factory(os.environ.get("GAZETTE_EVENT_LOOP", "auto"))[0]
    print(machine_line())
    print("note: shared, noisy machine: compare the ratios of one run, not absolute figures "
          "across runs; client and servers share the same cores.")
    print(f"plan: {'quick' if args.quick else 'full'}; each append case <= {plan.seconds:g} s, "
          f"<= {plan.max_count} appends, <= {plan.max_bytes // MiB} MiB; reads <= "
          f"{plan.read_seconds:g} s. gazette client: JournalStub on a "
          f"{'grpcio' if use_grpcio() else 'gazette.rpc'} channel, one "
          f"Append RPC per append; JetStream client: nats-py, publish awaiting each ack, pull "
          f"consumer with batched fetch. Servers' event loop: {server_loop}; the client's: "
          f"asyncio.", flush=True)

    report = Report()
    started = time.monotonic()
    client_prof = cProfile.Profile() if args.profile_client else None
    with Peers(keep_dir=args.keep) as peers:
        target: str | None = None
        http_base: str | None = None
        broker = None
        nats_port: int | None = None
        tls: ClientTLS | None = None
        auth: Authorizer | None = None
        if run_gz:
            etcd_url = peers.start_etcd()
            security, ssl_context, tls, auth = _security(args, peers.root)
            port, broker = peers.start_broker(
                etcd_url, profile_out=os.path.abspath(args.profile_broker) if args.profile_broker else None,
                extra_args=security, ssl_context=ssl_context)
            target = f"127.0.0.1:{port}"
            if args.http:
                http_base = f"http://127.0.0.1:{port}"
            if args.direct:
                sock = peers.broker_grpc_socket()
                if sock is None:
                    raise SystemExit("--direct: the broker's grpc socket was not found")
                target = f"unix:{sock}"
        if run_js:
            nats_port = peers.start_nats()
        null_port = peers.start_null_journal() if baseline else None
        if args.tls or args.auth:
            print(f"gazette security: tls {'on' if args.tls else 'off'}, auth {'on' if args.auth else 'off'}")
        print(f"peers ready in {time.monotonic() - started:.1f} s (gazette via "
              f"{'its private grpc socket' if args.direct else 'its public port'})\n")
        header = HEADER + (NULL_HEADER if baseline else "")
        print(header)
        print("-" * len(header), flush=True)
        if client_prof is not None:
            client_prof.enable()
        if broker is not None and args.profile_broker:
            peers.start_profiling(broker)
        try:
            malloc.tune()  # as the broker does: large messages reuse heap buffers
            null_pid = peers.null_child.proc.pid if peers.null_child is not None else None
            broker_pid = broker.proc.pid if broker is not None else None
            asyncio.run(bench(report, plan, codecs, target, nats_port, null_port, http_base, tls, auth,
                              scratch=peers.root, pids=(broker_pid, null_pid)))
        finally:
            if client_prof is not None:
                client_prof.disable()
            if broker is not None and args.profile_broker:
                peers.stop(broker)  # writes the broker's profile
    print()
    print(summary(report))
    if baseline:
        print(acceptance(report))
    print(f"total {time.monotonic() - started:.0f} s")
    if args.json_out:
        # A child without the peer has no JetStream ratios to sum up.
        notes = ([] if args.no_peer else [summary(report)]) + \
            (acceptance(report).splitlines() if baseline else [])
        shapes = {" ".join(row.workload.split()): [row.size, row.writers, "[" not in row.workload]
                  for row in report.rows if row.is_append}
        _builds.write_result(args.json_out, figures(report), notes, {"rows": shapes})
    if client_prof is not None:
        client_prof.dump_stats(args.profile_client)
        print_profile(args.profile_client, "client")
    if args.profile_broker and os.path.exists(args.profile_broker):
        print_profile(args.profile_broker, "broker")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; every process this run started has been stopped", file=sys.stderr)
        sys.exit(130)

"""Replicated append throughput and latency: three gazette brokers beside a 3-node JetStream.

Starts its own etcd, three gazette brokers in two zones (``zone-a``: broker-1, broker-3; ``zone-b``: broker-2) and
a three-server NATS JetStream cluster (file storage), all on loopback, and drives both from this
process with asyncio clients, case by case, so each ratio compares figures taken moments apart:

* for replication 1 and 3: one journal with that replication / one stream with that many
  replicas;
* **latency**: one writer, 100-byte appends one after another (each awaited), p50 and p99 of
  the append round trip. Gazette: one ``Append`` RPC sent to the journal's primary (found from
  the route of the first response, as a routed client would); JetStream: ``js.publish``;
* **throughput**: 64 KiB and 1 MiB appends from 16 concurrent writers, MB/s.

Targets (issue "Replicated broker cluster"): p50 append latency <= 1 ms at replication 1 and
<= 2 ms at replication 3; replicated MB/s at least JetStream's. Figures are noisy on shared
machines (two cores run the client, three brokers and three nats-servers): compare the ratios
of one run. Every process started is stopped by PID on every exit path.

    python bench/replication_bench.py            # about 1-2 minutes
    python bench/replication_bench.py --quick    # about 30-40 seconds
    python bench/replication_bench.py --systems gazette --replication 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration
from nats.js.api import StorageType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _jetstream import JetStreamClient  # noqa: E402
from _peers import Peers  # noqa: E402

from gazette import malloc  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402
from gazette.protocol import protocol_pb2_grpc as pb_grpc  # noqa: E402
from gazette.rpc.channel import insecure_channel  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
BROKERS = (("broker-1", "zone-a"), ("broker-2", "zone-b"), ("broker-3", "zone-a"))
LATENCY_TARGET_MS = {1: 1.0, 3: 2.0}


class BenchError(Exception):
    """A peer answered a benchmark request with something other than success."""


@dataclass(frozen=True)
class Plan:
    seconds: float
    latency_seconds: float
    sizes: tuple[int, ...] = (64 * KiB, MiB)
    writers: int = 16


@dataclass
class Latency:
    samples: list[float] = field(default_factory=list)  # seconds

    def pct(self, q: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(q * len(s)))] * 1e3 if s else float("nan")


@dataclass
class Throughput:
    count: int
    nbytes: int
    seconds: float

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


Op = Callable[[], Awaitable[None]]


def payload(size: int) -> bytes:
    line = b'{"event":"bench","token":"' + os.urandom(24).hex().encode() + b'"}\n'
    return (line * (size // len(line) + 1))[:size]


async def measure_latency(op: Op, seconds: float) -> Latency:
    lat = Latency()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        await op()
        lat.samples.append(time.perf_counter() - t)
    return lat


async def measure_throughput(op: Op, size: int, writers: int, seconds: float) -> Throughput:
    done = 0

    async def worker(deadline: float) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await op()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(writers)))
    elapsed = time.perf_counter() - start
    return Throughput(done, done * size, elapsed)


class GazetteSide:
    """Clients (gazette.rpc channels) of every broker; appends go to the journal's primary."""

    def __init__(self, ports: list[int]) -> None:
        self.channels = {f"127.0.0.1:{p}": insecure_channel(f"127.0.0.1:{p}",
                                                                      options=CHANNEL_OPTIONS)
                         for p in ports}
        self.stubs = {k: pb_grpc.JournalStub(ch)  # type: ignore[no-untyped-call]
                      for k, ch in self.channels.items()}
        self.any = next(iter(self.stubs.values()))
        self.primary: dict[str, pb_grpc.JournalStub] = {}

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()

    async def create(self, journal: str, replication: int) -> None:
        spec = pb.JournalSpec(name=journal, replication=replication)
        spec.fragment.length = 512 * MiB
        spec.fragment.compression_codec = pb.CompressionCodec.NONE
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0)])
        resp = await self.any.Apply(req, timeout=30)
        if resp.status != pb.OK:
            raise BenchError(f"Apply of {journal}: {pb.Status.Name(resp.status)}")

    def _stub_for(self, route: pb.Route) -> pb_grpc.JournalStub | None:
        if route.primary < 0 or route.primary >= len(route.endpoints):
            return None
        endpoint = route.endpoints[route.primary]
        hostport = endpoint.split("://", 1)[-1].rstrip("/")
        return self.stubs.get(hostport)

    async def warm(self, journal: str, replication: int, patience: float = 60.0) -> None:
        """Appends through any broker until the journal is served with its full route."""
        reqs = (pb.AppendRequest(journal=journal), pb.AppendRequest(content=b"warm\n"),
                pb.AppendRequest())
        deadline = time.monotonic() + patience
        last = ""
        while time.monotonic() < deadline:
            try:
                resp = await self.any.Append(iter(reqs), timeout=10)
                last = pb.Status.Name(resp.status)
                if resp.status == pb.OK and len(resp.header.route.members) == replication:
                    stub = self._stub_for(resp.header.route)
                    if stub is not None:
                        self.primary[journal] = stub
                        return
            except grpc.aio.AioRpcError as err:
                last = str(err.code())
            await asyncio.sleep(0.05)  # a retry pause, not a synchronisation
        raise BenchError(f"{journal} not served with {replication} replicas after {patience:.0f}s: {last}")

    def append_op(self, journal: str, data: bytes) -> Op:
        reqs = (pb.AppendRequest(journal=journal), pb.AppendRequest(content=data), pb.AppendRequest())
        stub = self.primary[journal]
        size = len(data)

        async def op() -> None:
            resp = await stub.Append(iter(reqs))
            if resp.status != pb.OK or resp.commit.end - resp.commit.begin != size:
                raise BenchError(f"Append to {journal}: {pb.Status.Name(resp.status)}")

        return op


class JetStreamSide(JetStreamClient):
    """JetStream publish with acks to an R1 or R3 stream of the cluster."""

    async def create(self, stream: str, subject: str, replicas: int, patience: float = 60.0) -> None:
        deadline = time.monotonic() + patience
        while True:  # the cluster elects its meta leader after the servers report healthy
            try:
                await self.js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE,
                                         num_replicas=replicas)
                await self.js.publish(subject, b"warm", timeout=10)
                return
            except Exception as err:  # noqa: BLE001 - retried until the deadline
                if time.monotonic() >= deadline:
                    raise BenchError(f"stream {stream} (R{replicas}) not ready: {err}") from err
                await asyncio.sleep(0.2)  # a retry pause, not a synchronisation

    def publish_op(self, subject: str, data: bytes) -> Op:
        publish = self.js.publish

        async def op() -> None:
            ack = await publish(subject, data, timeout=30)
            if not ack.seq:
                raise BenchError(f"publish to {subject}: no sequence in ack")

        return op


def size_name(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


async def run(plan: Plan, replications: list[int], systems: str,
              broker_ports: list[int], nats_ports: list[int]) -> list[str]:
    gz = GazetteSide(broker_ports) if broker_ports else None
    js = JetStreamSide() if nats_ports else None
    verdicts: list[str] = []
    try:
        if js is not None:
            await js.connect(nats_ports)
        print(f"{'case':<34}| {'gazette':>26} | {'jetstream':>26} | ratio", flush=True)
        print("-" * 100, flush=True)
        for r in replications:
            journal = f"bench/r{r}/events"
            stream, subject = f"BENCH_R{r}", f"bench.r{r}"
            if gz is not None:
                await gz.create(journal, r)
                await gz.warm(journal, r)
            if js is not None:
                await js.create(stream, subject, r)
            small = payload(100)
            gl = await measure_latency(gz.append_op(journal, small), plan.latency_seconds) if gz else None
            jl = await measure_latency(js.publish_op(subject, small), plan.latency_seconds) if js else None

            def lat_cell(x: Latency | None) -> str:
                return f"p50 {x.pct(0.5):6.2f} p99 {x.pct(0.99):6.2f} ms" if x else "-"

            ratio = f"{jl.pct(0.5) / gl.pct(0.5):.2f}x" if gl and jl else "-"
            print(f"{'latency 100 B x1 R' + str(r):<34}| {lat_cell(gl):>26} | {lat_cell(jl):>26} | "
                  f"{ratio} (jetstream p50 / gazette p50)", flush=True)
            if gl is not None:
                target = LATENCY_TARGET_MS[r] if r in LATENCY_TARGET_MS else 2.0
                p50 = gl.pct(0.5)
                verdicts.append(f"R{r} p50 {p50:.2f} ms (target <= {target} ms: "
                                f"{'met' if p50 <= target else 'NOT met'})")
            for size in plan.sizes:
                data = payload(size)
                gt = await measure_throughput(gz.append_op(journal, data), size, plan.writers,
                                              plan.seconds) if gz else None
                jt = await measure_throughput(js.publish_op(subject, data), size, plan.writers,
                                              plan.seconds) if js else None

                def tp_cell(x: Throughput | None) -> str:
                    return f"{x.mbps:8.1f} MB/s {x.count / x.seconds:7.0f}/s" if x else "-"

                ratio = f"{gt.mbps / jt.mbps:.2f}x" if gt and jt and jt.mbps else "-"
                name = f"append {size_name(size)} x{plan.writers} R{r}"
                print(f"{name:<34}| {tp_cell(gt):>26} | {tp_cell(jt):>26} | {ratio}", flush=True)
                if gt and jt and r > 1:
                    verdicts.append(f"R{r} {size_name(size)} MB/s ratio {gt.mbps / jt.mbps:.2f}x "
                                    f"(target >= 1x: {'met' if gt.mbps >= jt.mbps else 'NOT met'})")
    finally:
        if gz is not None:
            await gz.close()
        if js is not None:
            await js.close()
    return verdicts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter cases")
    ap.add_argument("--systems", choices=("both", "gazette", "jetstream"), default="both")
    ap.add_argument("--replication", type=int, action="append", choices=(1, 3),
                    help="replication factors to run (repeatable; default 1 and 3)")
    ap.add_argument("--seconds", type=float, help="seconds per throughput case")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory and logs")
    args = ap.parse_args(argv)
    plan = Plan(seconds=1.0, latency_seconds=1.5) if args.quick else Plan(seconds=3.0, latency_seconds=4.0)
    if args.seconds:
        plan = Plan(seconds=args.seconds, latency_seconds=plan.latency_seconds)
    replications = args.replication or [1, 3]
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"Python {platform.python_version()}, grpcio {grpc.__version__}")
    print("topology: etcd; gazette brokers broker-1 and broker-3 (zone-a), broker-2 (zone-b); "
          "JetStream cluster of 3 nats-servers (file storage); all on loopback, sharing the cores")
    start = time.monotonic()
    with Peers(keep_dir=args.keep) as peers:
        broker_ports: list[int] = []
        nats_ports: list[int] = []
        if args.systems in ("both", "gazette"):
            etcd = peers.start_etcd()
            for bid, zone in BROKERS:
                port, _ = peers.start_broker(etcd, broker_id=bid, zone=zone)
                broker_ports.append(port)
        if args.systems in ("both", "jetstream"):
            nats_ports = peers.start_nats_cluster(3)
        malloc.tune()  # as the broker does: large messages reuse heap buffers
        verdicts = asyncio.run(run(plan, replications, args.systems, broker_ports, nats_ports))
    print()
    for v in verdicts:
        print(v)
    print(f"total {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

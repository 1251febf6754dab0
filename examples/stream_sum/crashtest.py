"""The stream-sum crash test: the whole pipeline on loopback, under random faults.

``python -m examples.stream_sum.crashtest --minutes 10`` starts etcd, four brokers in two zones
(two in each), two summer processes (``gazette consume --app
examples.stream_sum.summer:Summer``) and chunkers, applies the example's journal and shard
specs, and then, every few seconds (``--gap``, uniform), injects one fault:

* ``broker-kill``: SIGKILL of a broker; a new broker (new id, same zone and port) replaces it;
* ``broker-term``: SIGTERM (the broker drains), then a new broker as above;
* ``consumer-kill`` / ``consumer-term``: the same for a summer process (same consumer id);
* ``consumer-freeze`` / ``broker-freeze``: SIGSTOP past the process's etcd lease, then SIGCONT:
  its lease lapses, its work moves elsewhere, and the resumed zombie must not commit;
* ``etcd-restart``: etcd stops (SIGTERM) and starts again on the same data and port.

A supervisor restarts any process that exits on its own (a resumed zombie that finds its lease
gone exits, as Gazette's do) and counts it. The chunkers verify every sum as they go: a wrong
sum, a repeated or skipped sequence number, or a sum later than the SLA ends the run at once
with a failure. At the end the faults stop, the chunkers finish their open streams, and the
driver prints what it did and the verification totals; it exits 0 only if every stream
verified and no shard is FAILED.

Invariants: every child process belongs to this driver and is killed on exit, however it ends
(Ctrl-C included); the fault schedule is the only thing that sleeps; a process is never
resumed by anything but the fault that froze it (or the exit path).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aetcd.exceptions
import grpc

from examples.stream_sum.chunker import Totals, run_chunker
from examples.stream_sum.messages import StreamSumError
from gazette.client import JournalClient
from gazette.consumer.client import ShardClient
from gazette.errors import GazetteError
from gazette.etcd import connect
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import BrokerProcess, Cluster
from gazette.testing.consumer_proc import ConsumerProc, consumer_endpoints, consumer_env
from gazette.testing.etcd_process import EtcdProcess, free_port
from gazette.testing.eventually import eventually

__all__ = ["FAULTS", "CrashTest", "main"]

log = logging.getLogger("stream_sum.crashtest")

EXAMPLE = Path(__file__).resolve().parent
ROOT = EXAMPLE.parents[1]
FAULTS = ("broker-kill", "broker-term", "broker-freeze", "consumer-kill", "consumer-term",
          "consumer-freeze", "etcd-restart")
# Four brokers for journals of replication 3, as Gazette's own crash test runs: one broker down
# (killed, frozen, draining) is a failover to the spare, not an outage. With exactly three, every
# broker fault leaves journals INSUFFICIENT_JOURNAL_BROKERS until a replacement process has
# started, and a burst of faults on brokers chains those outages past the SLA: the test then
# measures how fast Python processes start, not how the cluster fails over.
ZONES = ("zone-a", "zone-a", "zone-b", "zone-b")
BROKER_PREFIX = "/gazette/cluster"
CONSUMER_PREFIX = "/gazette/consumers/stream-sum"
STALL = 20.0  # seconds without a verified stream that count as a stall
GRACE = 60.0  # seconds a SIGTERM'd process has to drain before SIGKILL


@dataclass
class _BrokerSlot:
    zone: str
    port: int
    broker: BrokerProcess


class _Service:
    """A loopback stand-in for a Kubernetes Service in front of the brokers: a TCP forwarder on
    a fixed port that sends each new connection to a live broker (round robin, skipping any
    that refuses). Clients dial it as their default address; brokers' routes name the brokers'
    own ports, as in a cluster."""

    def __init__(self, backends: Callable[[], list[int]]) -> None:
        self.backends = backends
        self.port = 0
        self._next = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in self._pipes:
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports = self.backends()
        for k in range(len(ports)):
            port = ports[(self._next + k) % len(ports)]
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self._next += k + 1
            for src, dst in ((reader, up_writer), (up_reader, writer)):
                task = asyncio.create_task(_pipe(src, dst))
                self._pipes.add(task)
                task.add_done_callback(self._pipes.discard)
            return
        writer.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(1 << 16):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        dst.close()


class CrashTest:
    """See the module docstring. ``run`` returns the verification totals or raises
    ``StreamSumError`` (a failed verification or a FAILED shard)."""

    def __init__(self, root: Path, *, seed: int, lease: float = 2.0, gap: tuple[float, float] = (4.0, 12.0),
                 faults: tuple[str, ...] = FAULTS, chunkers: int = 2, workers: int = 3, sla: float = 40.0,
                 progress: Callable[[str], None] = print) -> None:
        self.root, self.rng, self.lease, self.gap = root, random.Random(seed), lease, gap
        self.faults, self.chunkers, self.workers, self.sla = faults, chunkers, workers, sla
        self.progress = progress
        self.stats: Counter[str] = Counter()
        self.failed_shards: list[str] = []
        self.etcd = EtcdProcess(root / "etcd" / "data", unsafe_no_fsync=True)
        self.cluster: Cluster | None = None
        self.slots: list[_BrokerSlot] = []
        self.service = _Service(lambda: [s.broker.port for s in self.slots if s.broker.is_running()])
        self.consumers: list[ConsumerProc] = []
        self._consumer_seq = 0
        self._busy = asyncio.Lock()  # a fault in progress: the supervisor keeps its hands off
        self.frozen: set[int] = set()  # pids under SIGSTOP, resumed by their fault or on exit
        self.totals: list[Totals] = []

    # --- the pipeline -----------------------------------------------------------------------

    def _start_broker(self, zone: str, port: int | None) -> BrokerProcess:
        assert self.cluster is not None
        bid = f"broker-{zone[-1]}-{uuid.uuid4().hex[:6]}"
        return self.cluster.add_broker(zone, bid, port=port, extra_args=("--etcd.lease", f"{self.lease:g}s"))

    def _gazctl(self, *args: str, stdin: str | None = None) -> None:
        assert self.cluster is not None
        rc, out, err = self.cluster.gazctl(*args, stdin=stdin)
        if rc != 0:
            raise StreamSumError(f"gazctl {' '.join(args)} failed ({rc}): {err or out}")

    async def _start(self) -> None:
        await asyncio.to_thread(self.etcd.start)
        await self.service.start()
        self.cluster = Cluster(self.etcd.url, BROKER_PREFIX, self.root / "cluster", gazctl_timeout=120)
        for zone in ZONES:
            port = free_port()
            self.slots.append(_BrokerSlot(zone, port, await asyncio.to_thread(self._start_broker, zone, port)))
        await asyncio.to_thread(self._gazctl, "journals", "apply", "--specs", str(EXAMPLE / "journals.yaml"))
        for _ in range(2):
            self.consumers.append(self._new_consumer())
        etcd = await connect(self.etcd.url)
        try:
            endpoints = await eventually(lambda: consumer_endpoints(etcd, CONSUMER_PREFIX), "summers announced", 120)
        finally:
            await etcd.close()
        await asyncio.to_thread(self._gazctl, "shards", "apply", "--consumer.address", endpoints[0],
                                "--specs", str(EXAMPLE / "shards.yaml"))
        self.progress(f"started etcd, brokers {', '.join(f'{s.broker.broker_id}@{s.zone}' for s in self.slots)}, "
                      f"summers {', '.join(c.suffix for c in self.consumers)}")

    def _new_consumer(self) -> ConsumerProc:
        assert self.cluster is not None
        n = self._consumer_seq = self._consumer_seq + 1
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = consumer_env({**self.cluster.env(), "BROKER_ADDRESS": self.service.address}, PYTHONPATH=pythonpath, ETCD_ADDRESS=self.etcd.url,
                           ETCD_PREFIX=CONSUMER_PREFIX, ETCD_LEASE=f"{self.lease:g}s", LOG_FORMAT="text",
                           TMPDIR=str(self.cluster.tmp_dir))
        proc = ConsumerProc(f"summer-{n}", env, self.cluster.log_dir, app="examples.stream_sum.summer:Summer")
        proc.start()
        return proc

    def _dump_tasks(self) -> None:
        pids = [p.pid for p in self.consumers] + [s.broker.pid for s in self.slots]
        for pid in pids:
            if pid is not None and pid not in self.frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)

    def _stop_all(self) -> None:
        for pid in list(self.frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for c in self.consumers:
            c.kill()
        if self.cluster is not None:
            for b in self.cluster.brokers:
                b.kill()
        self.etcd.close()

    # --- faults -----------------------------------------------------------------------------

    async def _freeze(self, pid: int | None, what: str) -> None:
        if pid is None:
            return
        self.frozen.add(pid)
        try:
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(self.lease + 2 + self.rng.uniform(0, 2))  # past the lease: the fault itself
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.frozen.discard(pid)
        self.stats[f"{what} frozen past its lease"] += 1

    async def _inject(self, kind: str) -> str:
        if kind.startswith("broker-"):
            slot = self.rng.choice(self.slots)
            old = slot.broker
            if kind == "broker-freeze":
                await self._freeze(old.pid, "broker")
                return f"froze broker {old.broker_id}"
            if kind == "broker-kill":
                await asyncio.to_thread(old.kill)
                slot.broker = await asyncio.to_thread(self._start_broker, slot.zone, slot.port)
                return f"SIGKILL broker {old.broker_id}, replaced by {slot.broker.broker_id} on its port"
            # A rolling update's surge: the replacement joins first, so the old one can hand
            # its journals off even when another broker is down at the same moment.
            slot.broker = await asyncio.to_thread(self._start_broker, slot.zone, None)
            slot.port = slot.broker.port
            await self._drain(old.pid, lambda: asyncio.to_thread(old.stop, GRACE), old.kill, "broker")
            return f"SIGTERM broker {old.broker_id} (drained), replaced by {slot.broker.broker_id}"
        if kind.startswith("consumer-"):
            i = self.rng.randrange(len(self.consumers))
            proc = self.consumers[i]
            if kind == "consumer-freeze":
                await self._freeze(proc.pid, "consumer")
                return f"froze {proc.suffix}"
            if kind == "consumer-kill":
                await asyncio.to_thread(proc.kill)
                proc.start()
                return f"SIGKILL {proc.suffix}, restarted"
            self.consumers[i] = self._new_consumer()  # the surge, as for brokers
            await self._drain(proc.pid, lambda: asyncio.to_thread(proc.terminate, GRACE), proc.kill, "consumer")
            return f"SIGTERM {proc.suffix} (drained), replaced by {self.consumers[i].suffix}"
        await asyncio.to_thread(self.etcd.restart)
        return "restarted etcd"

    async def _drain(self, pid: int | None, stop: Callable[[], Awaitable[object]], kill: Callable[[], None],
                     what: str) -> None:
        """SIGTERM (``stop``) and a grace period, as Kubernetes gives; past it, SIGKILL, counted:
        a drain that cannot finish is a finding."""
        try:
            await stop()
        except TimeoutError:
            await asyncio.to_thread(kill)
            self.stats[f"{what} drains past the {GRACE:g}s grace"] += 1

    async def _inflict(self, until: float) -> None:
        started = time.monotonic()
        deck: list[str] = []
        while True:
            await asyncio.sleep(self.rng.uniform(*self.gap))  # the fault schedule
            if time.monotonic() >= until:
                return
            # Kinds are dealt from a shuffled deck, not drawn independently: every kind comes
            # once per len(faults) faults, in random order. Independent draws left a kind out
            # of a short run now and then (25 faults of 7 kinds: a given kind missing 2% of
            # the time), failing the run's check that each kind was injected.
            if not deck:
                deck = list(self.faults)
                self.rng.shuffle(deck)
            kind = deck.pop()
            async with self._busy:
                what = await self._inject(kind)
            self.stats[kind] += 1
            self.progress(f"[{time.monotonic() - started:6.0f}s] fault: {what}")

    # --- supervision --------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Restarts processes that exited on their own; restarts FAILED shards, noting why."""
        while True:
            await asyncio.sleep(1.0)  # polling child processes, not synchronisation
            async with self._busy:
                await self._restart_exited()
            await self._check_shards()

    async def _restart_exited(self) -> None:
        """Restarts what exited while no fault was acting on it (a resumed zombie, a crash)."""
        for slot in self.slots:
            if not slot.broker.is_running() and slot.broker.pid not in self.frozen:
                code = slot.broker.returncode()
                if code is not None:
                    self.stats["brokers that exited by themselves"] += 1
                    self.progress(f"broker {slot.broker.broker_id} exited ({code}); replacing it")
                    slot.broker = await asyncio.to_thread(self._start_broker, slot.zone, slot.port)
        for proc in self.consumers:
            if proc.proc is not None and proc.proc.poll() is not None:
                self.stats["consumers that exited by themselves"] += 1
                self.progress(f"{proc.suffix} exited ({proc.proc.returncode}); restarting it")
                proc.start()

    async def _check_shards(self) -> None:
        # etcd may be restarting (a fault, which this check does not wait for) or slow to
        # answer on a loaded machine: skip this look, the next second's will do it. (An
        # unreachable etcd here once ended a whole crash test: "connection attempt timed out
        # before receiving SETTINGS frame", right after an etcd restart.)
        try:
            etcd = await connect(self.etcd.url)
            try:
                endpoints = await consumer_endpoints(etcd, CONSUMER_PREFIX)
            finally:
                await etcd.close()
        except (aetcd.exceptions.ClientError, grpc.RpcError, GazetteError, OSError) as err:
            self.stats["shard checks skipped: etcd unreachable"] += 1
            log.debug("shard check skipped: %s", err)
            return
        for endpoint in endpoints:  # the first that answers (a dead one's key may linger)
            # A dying, or frozen-then-resumed, process may not answer: the next that does, will.
            with contextlib.suppress(GazetteError, grpc.RpcError, OSError, TimeoutError):
                async with ShardClient(endpoint) as sc:
                    async with asyncio.timeout(10):
                        resp = await sc.list()
                    failed = []
                    for s in resp.shards:
                        for st in s.status:
                            if st.code == pc.ReplicaStatus.FAILED:
                                failed.append(s.spec.id)
                                self.failed_shards.append(f"{s.spec.id}: {st.errors[0] if st.errors else '?'}")
                                self.progress(f"shard {s.spec.id} FAILED: {list(st.errors)}")
                    if failed:
                        await sc.unassign(failed, only_failed=True)
                return

    # --- the run ------------------------------------------------------------------------------

    async def run(self, minutes: float) -> list[Totals]:
        try:
            await self._start()
            assert self.cluster is not None
            stop = asyncio.Event()
            started = time.monotonic()

            async def report() -> None:
                last, stalled_since, next_line = -1, time.monotonic(), time.monotonic() + 30
                while True:
                    await asyncio.sleep(5)  # a progress line every 30 s; a stall check every 5 s
                    chunks = sum(t.chunks for t in self.totals)
                    if chunks != last:
                        last, stalled_since = chunks, time.monotonic()
                    elif time.monotonic() - stalled_since >= STALL:
                        self.stats["stalls"] += 1
                        stalled_since = time.monotonic()
                        self.progress(f"[{time.monotonic() - started:6.0f}s] no stream verified for {STALL:g}s: "
                                      "every process logs its asyncio tasks (SIGUSR1)")
                        self._dump_tasks()
                    if time.monotonic() < next_line:
                        continue
                    next_line += 30
                    streams, chunks = sum(t.streams for t in self.totals), sum(t.chunks for t in self.totals)
                    self.progress(f"[{time.monotonic() - started:6.0f}s] {sum(self.stats[k] for k in FAULTS)} "
                                  f"faults; {streams} streams ({chunks} chunks) verified; longest wait for a "
                                  f"sum {max((t.max_delay for t in self.totals), default=0.0):.2f}s")

            async def chunker(i: int) -> None:
                async with JournalClient(self.service.address) as client:
                    await run_chunker(client, streams=-1, chunks=self.rng.randrange(20, 120), workers=self.workers,
                                      sla=self.sla, seed=self.rng.randrange(1 << 30), stop=stop,
                                      totals=self.totals[i])

            self.totals = [Totals() for _ in range(self.chunkers)]
            async with asyncio.TaskGroup() as tg:
                background = [tg.create_task(self._supervise()), tg.create_task(report())]
                chunkers = [tg.create_task(chunker(i)) for i in range(self.chunkers)]
                await self._inflict(started + minutes * 60)
                self.progress(f"[{time.monotonic() - started:6.0f}s] faults stop; chunkers finish their open streams")
                stop.set()
                await asyncio.gather(*chunkers)
                for task in background:
                    task.cancel()
            if self.failed_shards:
                raise StreamSumError(f"{len(self.failed_shards)} FAILED shard(s): {self.failed_shards}")
            return self.totals
        finally:
            await asyncio.to_thread(self._stop_all)
            await self.service.close()


def _parse_gap(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        gap = (float(lo), float(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gap takes MIN,MAX seconds (got {text!r})") from None
    if not 0 < gap[0] <= gap[1]:
        raise argparse.ArgumentTypeError(f"--gap needs 0 < MIN <= MAX (got {text!r})")
    return gap


def _parse_faults(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault(s) {unknown}; choose from {', '.join(FAULTS)}")
    return kinds


def _timeline(logs: Path, last: int = 40) -> list[str]:
    """The last ``last`` warnings and errors of every process's log, merged by time, a run of
    the same message from one process collapsed to one line: what a failed run's CI output
    needs to say why (its log directory is gone with the machine)."""
    entries: list[tuple[str, str, str]] = []
    for path in sorted(logs.glob("*.log")):
        proc = path.stem.split("-", 3)[-1] if path.stem.startswith("broker-") else path.stem
        previous = ""
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith(("WARN[", "ERRO[")) or len(line) < 15:
                continue
            stamp, message = line[5:13], line[15:].strip()
            key = re.sub(r"\d+", "#", message)[:60]  # "attempt 6", "attempt 7": one line
            if key == previous:
                continue
            previous = key
            entries.append((stamp, proc, message[:220]))
    entries.sort(key=lambda e: e[0])
    return [f"{stamp} {proc}: {message}" for stamp, proc, message in entries[-last:]]


def _leaves(err: BaseException) -> list[BaseException]:
    if isinstance(err, BaseExceptionGroup):
        return [leaf for e in err.exceptions for leaf in _leaves(e)]
    return [err]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.stream_sum.crashtest", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected")
    ap.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: random)")
    ap.add_argument("--gap", type=_parse_gap, default=(4.0, 12.0), help="MIN,MAX seconds between faults")
    ap.add_argument("--faults", type=_parse_faults, default=FAULTS, help="comma-separated subset of: " + ", ".join(FAULTS))
    ap.add_argument("--lease", type=float, default=2.0, help="etcd lease of brokers and summers (seconds)")
    ap.add_argument("--chunkers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=3, help="concurrent streams' workers per chunker")
    ap.add_argument("--sla", type=float, default=40.0, help="seconds a sum may take")
    ap.add_argument("--dir", type=Path, default=None, help="keep logs and data here (default: a temporary directory)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)

    def say(line: str) -> None:
        print(f"crashtest: {line}", flush=True)

    say(f"seed {seed}; {a.minutes:g} minutes of faults ({', '.join(a.faults)}) every {a.gap[0]:g}-{a.gap[1]:g}s")
    with contextlib.ExitStack() as stack:
        root = a.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stream-sum-crashtest-")))
        root.mkdir(parents=True, exist_ok=True)
        # The driver's own clients retry through every fault, noisily: their log goes to a
        # file; the console gets the fault log and the chunkers' warnings.
        logging.basicConfig(filename=root / "driver.log", level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        console = logging.StreamHandler()
        console.setLevel(logging.WARNING)
        logging.getLogger("stream_sum").addHandler(console)
        test = CrashTest(root, seed=seed, lease=a.lease, gap=a.gap, faults=a.faults, chunkers=a.chunkers,
                         workers=a.workers, sla=a.sla, progress=say)
        started = time.monotonic()
        try:
            totals = asyncio.run(test.run(a.minutes))
        except Exception as err:  # noqa: BLE001 - every failure is reported, then the exit status
            for e in _leaves(err):
                say(f"FAILED: {type(e).__name__}: {e}")
            for line in _timeline(root / "cluster" / "logs"):
                say(f"log: {line}")
            say(f"faults injected: {dict(test.stats)}; logs were in {root}" if a.dir else
                f"faults injected: {dict(test.stats)} (keep logs with --dir)")
            return 1
        streams, chunks = sum(t.streams for t in totals), sum(t.chunks for t in totals)
        delays = sorted(d for t in totals for d in t.delays)
        p99 = delays[int(len(delays) * 0.99)] if delays else 0.0
        injected = sum(test.stats[k] for k in FAULTS)
        say(f"PASSED in {(time.monotonic() - started) / 60:.1f} min: {injected} faults injected "
            f"({', '.join(f'{k} {n}' for k, n in sorted(test.stats.items()))}); "
            f"{streams} streams and {chunks} chunks verified, 0 wrong sums, 0 lost or repeated chunks, "
            f"sum delay p99 {p99:.2f}s, max {max(delays, default=0.0):.2f}s (SLA {a.sla:g}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

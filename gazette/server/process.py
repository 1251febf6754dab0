"""The lifecycle of a member process (a broker or a consumer) over etcd and its one port.

A member process connects to etcd, mirrors its key space, serves gRPC and HTTP on one public
port, announces its member spec under a lease, runs the shared allocator over its items, and on
``stop()`` drains: it announces zero capacity so that the allocator hands its items to other
members, hands off, and revokes its lease. Gazette's ``mainboilerplate`` does the same for both
``gazette serve`` and consumer binaries; :class:`MemberProcess` is that, with hooks for what
differs (services, member spec, drain-time work).

Invariants:

* The member announces itself only after its public port is bound, so the endpoint it
  advertises always answers; ``ready`` is set once it is announced and allocating, and cleared
  before anything stops.
* At start the soft descriptor limit is raised to the hard one (logged once), and a process
  serving a non-loopback address without authorization says so in one WARNING.
* The first keyspace load is retried while etcd is transiently unavailable (up to the lease).
* Every long-lived task (keyspace watch, announcement keep-alive, allocator, the subclass's
  own) is owned by one task group: one failing stops the process; ``run()`` returns only after
  every task ended.
* ``gazette_keyspace_revision{member}`` (at ``/debug/metrics``) is the etcd revision the
  member's keyspace has applied: against etcd's revision, how far its watch trails.
* Draining: zero capacity is announced, then the process waits until it holds no item or no
  other live member has capacity; the allocator is cancelled before the subclass's ``drain``
  hook retires what is still held. Servers stop with a grace period, then the lease is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import ipaddress
import logging
import os
import random
import signal
import socket
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import aetcd
import grpc
from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gazette.allocator import Announcement, allocate, announce, desired_replication
from gazette.allocator.keys import members_key, members_prefix
from gazette.allocator.state import IsConsistentFn
from gazette.auth import NO_AUTH, KeyedAuth, Verifier
from gazette.etcd import connect as etcd_connect
from gazette.etcd.client import tls_failure
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.server import RpcServer
from gazette.rpc.tls import ClientTLS, ServerTLS
from gazette.server.fds import raise_nofile_limit
from gazette.server.grpc import GrpcServer, build_server
from gazette.server.http import debug_routes, http_protocol_factory, start_app
from gazette.server.limits import ServerLimits
from gazette.server.mux import Multiplexer

__all__ = ["MemberProcess", "is_loopback", "random_suffix", "run_until_drained", "warn_if_open"]

log = logging.getLogger(__name__)

_ADJECTIVES = ("busy", "calm", "eager", "fuzzy", "gentle", "happy", "jolly", "lively", "merry", "proud", "quiet", "swift")
_ANIMALS = ("walrus", "otter", "badger", "heron", "lynx", "marmot", "osprey", "puffin", "tapir", "wombat", "yak", "zebu")


def random_suffix() -> str:
    """A readable member suffix (``calm-otter``), as Gazette's default process IDs."""
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_ANIMALS)}"


class _Shutdown(Exception):
    pass


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``""``, ``0.0.0.0`` and ``::`` serve
    every interface; a name other than ``localhost`` may resolve to anything: not loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_open(kind: str, host: str, verifier: Verifier) -> bool:
    """Logs one WARNING when a process on a non-loopback address lets requests through
    without a token (no ``--auth-keys``, or ``AA==`` among them); returns whether it did."""
    if is_loopback(host):
        return False
    if verifier is NO_AUTH:
        why = "no --auth-keys"
    elif isinstance(verifier, KeyedAuth) and verifier.allow_missing:
        why = "--auth-keys includes AA=="
    else:
        return False
    log.warning(
        f"{kind} serves {host or 'every interface'} with authorization off ({why}): any client "
        "that reaches the port may Apply and delete journals and shards, Append, Read and "
        "Replicate; set --auth-keys (see docs/security.md)", extra={"host": host or "*"})
    return True


class _KeyspaceRevisions(Collector):
    """``gazette_keyspace_revision``: each live member's applied keyspace revision, read at
    scrape time (a member that trails etcd is still applying its watch's backlog)."""

    def __init__(self) -> None:
        self.members: weakref.WeakSet[MemberProcess] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("gazette_keyspace_revision",
                                  "The etcd revision this member's keyspace has applied.",
                                  labels=["member"])
        for m in list(self.members):
            gauge.add_metric([f"{m.local_id.zone}#{m.local_id.suffix}"], m.keyspace.revision)
        yield gauge


_KEYSPACE_REVISIONS = _KeyspaceRevisions()
REGISTRY.register(_KEYSPACE_REVISIONS)


class MemberProcess:
    """A member of a gazette cluster (see the module docstring); subclass and fill the hooks."""

    kind = "member"
    """What the process is called in its log lines (``broker started``)."""

    verifier: Verifier = NO_AUTH
    """How the process checks requests' tokens (subclasses set it from ``--auth-keys``)."""

    def __init__(self, *, zone: str, suffix: str, host: str, port: int, etcd_address: str,
                 etcd_lease: float, keyspace: KeySpace, is_consistent: IsConsistentFn,
                 advertise_host: str | None = None,
                 replication: Callable[[object], int] = desired_replication,
                 tls: ServerTLS | None = None, etcd_tls: ClientTLS | None = None,
                 limits: ServerLimits | None = None) -> None:
        self.limits = limits or ServerLimits()
        self.local_id = pb.ProcessSpec.ID(zone=zone, suffix=suffix)
        self.host, self.port, self.advertise_host = host, port, advertise_host
        self.etcd_address, self.etcd_lease = etcd_address, etcd_lease
        self.etcd_tls = etcd_tls
        self.keyspace = keyspace
        self.is_consistent = is_consistent
        self.replication = replication
        self.tls = tls
        self.endpoint = ""
        self.bound_port = 0
        self.ready = asyncio.Event()
        self.scratch_dir = tempfile.mkdtemp(prefix="gazette-member-")
        self._etcd: aetcd.Client | None = None
        self._announcement: Announcement | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._stop = asyncio.Event()
        _KEYSPACE_REVISIONS.members.add(self)

    # -- hooks ----------------------------------------------------------------------------

    def register_services(self, server: GrpcServer) -> None:
        """Registers the process's gRPC services (``gazette.server.grpc.add_service``)."""

    async def initialize(self, server: GrpcServer) -> None:
        """Runs once before the port is bound and the member announced (e.g. an application's
        own set-up: its services on ``server``, its routes through ``http_routes``)."""

    def not_serving(self) -> str:
        """Why the process is announced but not yet serving its assignments ("" when it is);
        ``/debug/ready`` answers 503 with it."""
        return ""

    def http_routes(self) -> Iterable[web.RouteDef]:
        """Routes served beside ``/debug/metrics`` and ``/debug/ready``."""
        return ()

    def member_spec(self, exiting: bool = False) -> bytes:
        """The serialized member spec to announce (zero capacity when ``exiting``)."""
        raise NotImplementedError

    def has_capacity(self, spec: Any) -> bool:
        """Whether another member's decoded spec has room for items and is not exiting."""
        raise NotImplementedError

    def holds_items(self) -> bool:
        """Whether items are still assigned to this process (draining waits while so)."""
        return False

    def start_tasks(self, tg: asyncio.TaskGroup) -> None:
        """Starts the subclass's own long-lived tasks in the process's task group."""

    async def drain(self) -> None:
        """Drain-time work once the allocator stopped: retire whatever is still held."""

    def stopping(self) -> None:
        """Called first when the process stops (refuse new work)."""

    async def closed(self) -> None:
        """Called last, after the servers stopped (close channels)."""

    # -- running --------------------------------------------------------------------------

    @property
    def etcd(self) -> aetcd.Client:
        assert self._etcd is not None, "process is not running"
        return self._etcd

    @property
    def tasks(self) -> asyncio.TaskGroup:
        """The task group owning the process's long-lived tasks (while running)."""
        assert self._tg is not None, "process is not running"
        return self._tg

    @property
    def member_key(self) -> str:
        return members_key(self.keyspace.root, self.local_id.zone, self.local_id.suffix)

    def stop(self) -> None:
        """Begins draining; ``run()`` returns once done."""
        self._stop.set()

    async def run(self) -> None:
        """Runs the process until ``stop()``; then drains and returns."""
        raise_nofile_limit()  # a connection is a descriptor: 1,024 is a login shell's default
        warn_if_open(self.kind, self.host, self.verifier)
        grpc_server = build_server(os.path.join(self.scratch_dir, "grpc.sock"), self.limits)
        self.register_services(grpc_server)
        await self.initialize(grpc_server)
        self._etcd = await etcd_connect(self.etcd_address, tls=self.etcd_tls)
        runner = await start_app([*debug_routes(self.ready, self.not_serving), *self.http_routes()])
        assert runner.server is not None
        mux = Multiplexer(os.path.join(self.scratch_dir, "grpc.sock"),
                          http_protocol_factory(runner, head_timeout=self.limits.http_head_timeout),
                          h2_protocol_factory=(grpc_server.protocol if isinstance(grpc_server, RpcServer) else None),
                          tls=self.tls, fd_reserve=self.limits.fd_reserve)
        try:
            await self._load_keyspace()
            if not isinstance(grpc_server, RpcServer):
                await grpc_server.start()
            self.bound_port = await mux.start(self.host, self.port)
            adv = self.advertise_host or (self.host if self.host not in ("", "0.0.0.0") else socket.gethostname())
            scheme = "https" if self.tls is not None else "http"
            self.endpoint = f"{scheme}://{adv}:{self.bound_port}"
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self.keyspace.watch(self.etcd), name="keyspace-watch")
                self.start_tasks(tg)
                self._announcement = await announce(
                    self.etcd, self.member_key, self.member_spec(),
                    ttl=max(1, int(self.etcd_lease)), conflict_timeout=self.etcd_lease,
                )
                tg.create_task(self._announcement.keep_alive(), name="announce")
                await self.keyspace.wait_for_revision(self._announcement.revision)
                alloc_task = tg.create_task(
                    allocate(self.etcd, self.keyspace, self.member_key, self.is_consistent,
                             replication=self.replication), name="allocator"
                )
                log.info(f"{self.kind} started", extra={
                    "id": f"{self.local_id.zone}#{self.local_id.suffix}", "endpoint": self.endpoint})
                self.ready.set()
                await self._stop.wait()
                await self._drain(alloc_task)
                raise _Shutdown()
        except* _Shutdown:
            pass
        finally:
            self.ready.clear()
            self.stopping()
            await mux.close()
            await grpc_server.stop(grace=5)
            await mux.abort()  # splices grpcio did not end, and the splice helper with them
            await runner.cleanup()
            await self.closed()
            if self._announcement is not None:
                with contextlib.suppress(Exception):
                    await self._announcement.revoke()
            with contextlib.suppress(Exception):
                await self.etcd.close()

    async def _load_keyspace(self) -> None:
        """The first load of the keyspace, retried while etcd is transiently unreachable
        (a connection refused or cut under load, a TLS handshake cut short) for up to the etcd
        lease."""
        deadline = asyncio.get_running_loop().time() + max(5.0, self.etcd_lease)
        delay = 0.05
        while True:
            try:
                await self.keyspace.load(self.etcd)
                return
            except grpc.aio.AioRpcError as err:
                if (tls_err := tls_failure(self.etcd_address, err)) is not None and (
                        not tls_err.cut_short or asyncio.get_running_loop().time() >= deadline):
                    # A refused certificate: retrying will not help. A handshake the connection
                    # cut short (etcd busy starting) is retried as etcd being unavailable.
                    raise tls_err from None
                if err.code() != grpc.StatusCode.UNAVAILABLE or asyncio.get_running_loop().time() >= deadline:
                    raise
                log.warning("etcd unavailable at start; retrying", extra={"err": err.details()})
            await asyncio.sleep(delay)  # a retry back-off, not a synchronisation
            delay = min(1.0, delay * 2)

    async def _drain(self, alloc_task: asyncio.Task[Any]) -> None:
        assert self._announcement is not None
        log.info(f"{self.kind} draining: announcing exiting with zero capacity")
        await self._announcement.update(self.member_spec(exiting=True))
        while self.holds_items() and self._others_can_take_over():
            await self.keyspace.wait_for_update()
        alloc_task.cancel()
        await self.drain()

    def _others_can_take_over(self) -> bool:
        """Whether another live member has capacity to take this one's items."""
        me = self.member_key
        return any(kv.key != me and kv.value is not None and self.has_capacity(kv.value)
                   for kv in self.keyspace.prefixed(members_prefix(self.keyspace.root)))


async def run_until_drained(proc: MemberProcess) -> None:
    """Runs ``proc``; the first SIGTERM or SIGINT drains it, a second exits at once."""
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            os._exit(1)
        logging.getLogger("gazette").info(f"caught signal; draining {proc.kind}")
        proc.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    try:
        await proc.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


def dump_tasks() -> None:
    """Logs the stack of every asyncio task (SIGUSR1, as Go's SIGQUIT dumps goroutines): what
    a process that looks stuck is waiting on."""
    out = io.StringIO()
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    for task in tasks:
        out.write(f"--- task {task.get_name()}\n")
        # Not Task.print_stack: on 3.11 a suspended frame's f_lineno may be None, and
        # linecache then raises, losing the whole dump exactly when it is needed.
        try:
            for frame in task.get_stack(limit=12):
                code = frame.f_code
                out.write(f"  {code.co_filename}:{frame.f_lineno or code.co_firstlineno} in {code.co_name}\n")
        except Exception as err:  # noqa: BLE001 - a diagnostic dump must not fail half-way
            out.write(f"  (stack unavailable: {err!r})\n")
    logging.getLogger("gazette").warning("%d asyncio tasks (SIGUSR1):\n%s", len(tasks), out.getvalue())

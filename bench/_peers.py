"""Child processes for the broker benchmark: etcd, a gazette broker, a NATS JetStream server.

Invariants:

* Every process is started in its own session (a terminal's Ctrl-C reaches only the bench,
  which then stops its children deliberately) and is stopped by its PID alone: a polite signal,
  a bounded wait, then SIGKILL. Nothing here signals a process it did not start.
* `Peers` is a context manager: on any exit (exception, KeyboardInterrupt, SystemExit) it stops
  every process it started, newest first, and removes its scratch directory.
* A start returns only once the process answers its readiness probe (broker: HTTP 200 from
  ``/debug/ready``; nats-server: ``/healthz?js-enabled-only=true`` on its monitoring port), or
  raises `PeerStartError` carrying the tail of the process's log.
* A profiled broker (`start_broker(profile_out=...)`) runs under this module's
  ``profile-broker`` entry point: SIGRTMIN starts cProfile (SIGUSR1 dumps the broker's tasks), SIGUSR2 writes the profile and exits
  at once. (A lone broker holding journals does not finish a SIGTERM drain: it waits for a hand-off
  no other broker can take; so neither ``python -m cProfile`` nor a graceful stop would write one.)
* ``null-journal`` is a grpcio server whose Append consumes the request stream and answers OK
  without storing anything: the ceiling a Python gRPC broker's Append could reach here.
* Scratch state (etcd data, the broker's fragment root and its spool directory, JetStream's
  store, logs) lives under one temporary directory owned by `Peers`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from gazette.testing.etcd_process import EtcdProcess

__all__ = ["PeerError", "PeerStartError", "ChildProcess", "Peers", "free_port", "NATS_SERVER"]

NATS_SERVER = "/usr/sbin/nats-server"
_LOG_TAIL = 3000


class PeerError(Exception):
    """Base of errors raised while running the benchmark's peer processes."""


class PeerStartError(PeerError):
    """A peer exited, or did not become ready, before its start deadline."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the usual bind-to-0 race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0, context=context) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError):
        return False


class ChildProcess:
    """One child process, logged to a file, stoppable by PID with a deadline."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.stop_signal: int = signal.SIGTERM
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()[-_LOG_TAIL:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace")

    def wait_until(self, probe: str, timeout: float, context: ssl.SSLContext | None = None) -> None:
        """Polls ``probe`` (a URL answering 200 when ready; https with ``context``) until it
        does, or raises."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while not _http_ok(probe, context):
            code = self.proc.poll()
            if code is not None:
                raise PeerStartError(
                    f"{self.name} exited with status {code} while starting; log tail:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise PeerStartError(
                    f"{self.name} not ready at {probe} after {timeout:.0f}s; log tail:\n"
                    f"{self.log_tail()}"
                )
            # The probe is the readiness condition; this pause only bounds the polling rate.
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def stop(self, grace: float = 10.0, sig: int | None = None) -> int | None:
        """Signals the process, waits up to ``grace`` seconds, then kills it. Returns its status."""
        sig = self.stop_signal if sig is None else sig
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, sig)
                try:
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
            return self.proc.returncode
        finally:
            self._log.close()


class Peers:
    """Starts etcd, gazette brokers and nats-servers under one scratch directory; stops them all."""

    def __init__(self, keep_dir: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gazette-bench-"))
        self._keep = keep_dir
        self._children: list[tuple[ChildProcess, float]] = []
        self._etcd: EtcdProcess | None = None
        self.null_child: ChildProcess | None = None  # the null-journal server, once started

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- etcd -----------------------------------------------------------------------------

    def start_etcd(self) -> str:
        """Starts a one-member etcd; returns its ``http://127.0.0.1:PORT`` URL."""
        etcd = EtcdProcess(self.root / "etcd", unsafe_no_fsync=True)
        self._etcd = etcd
        etcd.start()
        return etcd.url

    # -- gazette --------------------------------------------------------------------------

    def start_broker(self, etcd_url: str, *, profile_out: str | None = None,
                     timeout: float = 60.0, broker_id: str = "bench-broker",
                     zone: str | None = None,
                     extra_args: Sequence[str] = (),
                     ssl_context: ssl.SSLContext | None = None) -> tuple[int, ChildProcess]:
        """Starts ``gazette serve`` on a free loopback port; returns (port, process).

        With ``profile_out`` the broker runs under this module's ``profile-broker`` entry point:
        `start_profiling` begins the profile, and stopping the process writes it. Brokers of one
        `Peers` share the fragment root (one ``file:///`` store, as on a shared filesystem) and
        each has a scratch directory of its own.
        """
        port = free_port()
        file_root = self.root / "fragments"
        # Its spool directory and gRPC socket land here.
        tmp = self.root / ("broker-tmp" if broker_id == "bench-broker" else f"tmp-{broker_id}")
        file_root.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        args = [
            "serve", "--broker.host", "127.0.0.1", "--broker.port", str(port),
            "--broker.id", broker_id, "--broker.file-root", str(file_root),
            "--etcd.address", etcd_url, "--etcd.prefix", "/bench", "--log.level", "warn",
        ]
        if zone is not None:
            args += ["--broker.zone", zone]
        args += list(extra_args)
        if profile_out:
            argv = [sys.executable, str(Path(__file__).resolve()), "profile-broker", profile_out,
                    *args]
        else:
            argv = [sys.executable, "-m", "gazette.cli.serve", *args]
        env = dict(os.environ, TMPDIR=str(tmp))
        log_name = "broker.log" if broker_id == "bench-broker" else f"broker-{broker_id}.log"
        child = ChildProcess(f"gazette broker {broker_id}", argv, self.root / log_name, env=env)
        child.stop_signal = signal.SIGUSR2 if profile_out else signal.SIGTERM
        # Grace for SIGTERM is short: a lone broker holding journals never completes its drain.
        self._children.append((child, 60.0 if profile_out else 3.0))
        scheme = "https" if ssl_context is not None else "http"
        child.wait_until(f"{scheme}://127.0.0.1:{port}/debug/ready", timeout, ssl_context)
        return port, child

    @staticmethod
    def start_profiling(child: ChildProcess) -> None:
        """Begins the profile of a broker started with ``profile_out``."""
        os.kill(child.pid, signal.SIGRTMIN)

    def broker_grpc_socket(self) -> str | None:
        """The broker's private grpcio Unix socket (bypassing the public port's splice)."""
        found = glob.glob(str(self.root / "broker-tmp" / "gazette-spool-*" / "grpc.sock"))
        return found[0] if found else None

    def start_null_journal(self, timeout: float = 30.0) -> int:
        """Starts the ``null-journal`` grpcio server on a free loopback port; returns the port."""
        port = free_port()
        child = ChildProcess("null-journal", [sys.executable, str(Path(__file__).resolve()),
                                              "null-journal", str(port)],
                             self.root / "null-journal.log")
        self._children.append((child, 3.0))
        self.null_child = child
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:  # ready when it accepts connections on its port
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return port
            if child.proc.poll() is not None or time.monotonic() >= deadline:
                raise PeerStartError(f"null-journal not listening on {port}; log tail:\n"
                                     f"{child.log_tail()}")
            time.sleep(delay)  # bounds the polling rate; the connect is the condition
            delay = min(delay * 2, 0.2)

    # -- NATS JetStream -------------------------------------------------------------------

    def start_nats(self, *, max_payload: int = 8 << 20, timeout: float = 30.0) -> int:
        """Starts our own nats-server with JetStream (file store) on free loopback ports."""
        if not os.access(NATS_SERVER, os.X_OK):
            raise PeerStartError(f"nats-server not found at {NATS_SERVER}")
        port, monitor = free_port(), free_port()
        store = self.root / "jetstream"
        store.mkdir(exist_ok=True)
        conf = self.root / "nats.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{port}\n"
            f"http: 127.0.0.1:{monitor}\n"
            f"max_payload: {max_payload}\n"
            f"max_pending: {max(64 << 20, 4 * max_payload)}\n"
            f"jetstream {{\n  store_dir: {str(store)!r}\n}}\n"
        )
        child = ChildProcess("nats-server", [NATS_SERVER, "-c", str(conf)],
                             self.root / "nats.log")
        self._children.append((child, 10.0))
        child.wait_until(f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true", timeout)
        return port

    def start_nats_cluster(self, size: int = 3, *, max_payload: int = 8 << 20,
                           timeout: float = 60.0) -> list[int]:
        """Starts a JetStream cluster of ``size`` nats-servers on loopback; returns client ports.

        Each server has its own file store and routes to every other; readiness is each
        server's ``/healthz?js-enabled-only=true``. Streams may still need a moment for the
        cluster's meta leader: callers retry stream creation.
        """
        if not os.access(NATS_SERVER, os.X_OK):
            raise PeerStartError(f"nats-server not found at {NATS_SERVER}")
        ports = [free_port() for _ in range(size)]
        monitors = [free_port() for _ in range(size)]
        routes = [free_port() for _ in range(size)]
        route_urls = ", ".join(f"nats-route://127.0.0.1:{r}" for r in routes)
        children: list[tuple[ChildProcess, int]] = []
        for i in range(size):
            store = self.root / f"jetstream-{i}"
            store.mkdir(exist_ok=True)
            conf = self.root / f"nats-{i}.conf"
            conf.write_text(
                f"server_name: n{i}\n"
                f"listen: 127.0.0.1:{ports[i]}\n"
                f"http: 127.0.0.1:{monitors[i]}\n"
                f"max_payload: {max_payload}\n"
                f"max_pending: {max(64 << 20, 4 * max_payload)}\n"
                f"jetstream {{\n  store_dir: {str(store)!r}\n}}\n"
                f"cluster {{\n  name: bench\n  listen: 127.0.0.1:{routes[i]}\n"
                f"  routes: [{route_urls}]\n}}\n"
            )
            child = ChildProcess(f"nats-server n{i}", [NATS_SERVER, "-c", str(conf)],
                                 self.root / f"nats-{i}.log")
            self._children.append((child, 10.0))
            children.append((child, monitors[i]))
        for child, monitor in children:
            child.wait_until(f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true", timeout)
        return ports

    # -- teardown -------------------------------------------------------------------------

    def stop(self, child: ChildProcess) -> int | None:
        """Stops one child now (e.g. to collect a profile before the others stop)."""
        for i, (c, grace) in enumerate(self._children):
            if c is child:
                del self._children[i]
                return c.stop(grace)
        return None

    def close(self) -> None:
        errors: list[BaseException] = []
        while self._children:
            child, grace = self._children.pop()
            try:
                child.stop(grace)
            except BaseException as err:  # keep stopping the others; report at the end
                errors.append(err)
        if self._etcd is not None:
            try:
                self._etcd.close()
            except BaseException as err:
                errors.append(err)
            self._etcd = None
        if not self._keep:
            shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise errors[0]


def _profile_broker(out: str, serve_args: list[str]) -> int:
    """Runs ``gazette serve`` in this process; SIGRTMIN starts cProfile, SIGUSR2 dumps and exits."""
    import cProfile

    from gazette.cli import serve

    prof = cProfile.Profile()

    def begin(signum: int, frame: object) -> None:
        prof.enable()

    def finish(signum: int, frame: object) -> None:
        prof.disable()
        prof.dump_stats(out)
        os._exit(0)  # no drain: see the module docstring

    signal.signal(signal.SIGRTMIN, begin)
    signal.signal(signal.SIGUSR2, finish)
    return serve.main(serve_args)


def _null_journal(port: int) -> None:
    """A Journal service whose Append only consumes its stream and places it at a fake offset."""
    import asyncio
    from collections.abc import AsyncIterator
    from typing import Any

    import grpc

    from gazette import malloc
    from gazette.protocol import protocol_pb2 as pb
    from gazette.protocol import protocol_pb2_grpc as pb_grpc

    class NullJournal(pb_grpc.JournalServicer):
        def __init__(self) -> None:
            self.head = 0

        async def Append(self, requests: AsyncIterator[pb.AppendRequest],
                         context: Any) -> pb.AppendResponse:
            n = 0
            async for req in requests:
                n += len(req.content)
            resp = pb.AppendResponse(status=pb.OK)
            resp.commit.begin, resp.commit.end = self.head, self.head + n
            self.head += n
            return resp

    async def serve() -> None:
        from gazette.rpc import use_grpcio
        from gazette.rpc.server import RpcServer

        if not use_grpcio():  # the transport the broker serves with
            ours = RpcServer()
            pb_grpc.add_JournalServicer_to_server(NullJournal(), ours)  # type: ignore[no-untyped-call]
            await ours.start("127.0.0.1", port)
            await asyncio.Event().wait()
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1),
                                          ("grpc.max_send_message_length", -1)])
        pb_grpc.add_JournalServicer_to_server(NullJournal(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    malloc.tune()  # as the broker does: large messages reuse heap buffers
    # On the broker's loop (GAZETTE_EVENT_LOOP, as gazette serve reads it): the same ceiling.
    from gazette.server.loop import run as run_loop

    run_loop(serve(), os.environ.get("GAZETTE_EVENT_LOOP", "auto"))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "profile-broker":
        sys.exit(_profile_broker(sys.argv[2], sys.argv[3:]))
    if len(sys.argv) == 3 and sys.argv[1] == "null-journal":
        _null_journal(int(sys.argv[2]))
        sys.exit(0)
    sys.exit("usage: _peers.py profile-broker OUT serve [gazette serve flags...]\n"
             "       _peers.py null-journal PORT")

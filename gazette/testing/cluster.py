"""Real broker processes for end-to-end tests: `BrokerProcess` and `Cluster`.

A `Cluster` is an etcd endpoint, a key prefix of its own, a fragment file root and the
`gazette serve` processes started on them; `gazctl` runs the installed console script against
it, exactly as a user would.

Invariants:

* A broker is "started" only once its ``/debug/ready`` answers 200 and its own log says it
  started (so another process holding the port is not mistaken for it); `BrokerProcess.start`
  polls that condition against a deadline and raises `BrokerStartError` (with the tail of the
  broker's log) if the process exits or the deadline passes first. Nothing here sleeps as a
  means of synchronisation: every wait polls a condition and has a deadline.
* Ports are chosen free on loopback just before start; a start that lost its port to another
  process (bind failure in the log) is retried on a new port. Every broker logs to its own file.
* `Cluster.close` leaves no broker process behind (SIGKILL) and deletes the cluster's etcd
  prefix, whatever state the test left things in. Everything a broker writes (fragments,
  spools via TMPDIR, its log) is under the cluster's root directory.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, NamedTuple, TypeVar

from gazette.errors import GazetteError
from gazette.testing.etcd_process import free_port

__all__ = [
    "BrokerStartError",
    "BrokerProcess",
    "Cluster",
    "GazctlResult",
    "free_port",
    "console_script",
]

T = TypeVar("T")

_LOG_TAIL_BYTES = 4000
_POLL_INTERVAL = 0.05
_START_ATTEMPTS = 3
_STARTED = b"broker started"  # logged by `gazette serve` once it has announced itself


class BrokerStartError(GazetteError, RuntimeError):
    """A broker exited, or did not become ready, before its start deadline."""




def console_script(name: str) -> str:
    """Path of an installed console script: next to this interpreter, else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"console script {name!r} is not installed")
    return found


def _log_tail(path: Path, size: int = _LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def http_status(url: str, timeout: float = 1.0, context: ssl.SSLContext | None = None) -> int | None:
    """The HTTP status `url` answers with (``context`` for https), or None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310 - loopback
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, OSError):
        return None


class BrokerProcess:
    """One ``gazette serve`` child process on 127.0.0.1."""

    def __init__(
        self,
        *,
        etcd_url: str,
        etcd_prefix: str,
        file_root: Path,
        log_dir: Path,
        broker_id: str,
        zone: str = "local",
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        extra_env: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ssl_context``: the broker serves TLS (its flags in ``extra_args``); the context
        dials it (readiness checks, ``address`` is https)."""
        if len(broker_id) < 4:
            raise ValueError(f"broker id {broker_id!r} must have at least 4 characters")
        self.etcd_url = etcd_url
        self.etcd_prefix = etcd_prefix
        self.file_root = Path(file_root)
        self.broker_id = broker_id
        self.zone = zone
        self.log_path = Path(log_dir) / f"broker-{zone}-{broker_id}.log"
        self._fixed_port = port
        self.port = port or 0
        self.extra_args = extra_args
        self.extra_env = dict(extra_env or {})
        self.ssl_context = ssl_context
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        """The broker's service address, as gazctl's BROKER_ADDRESS takes it."""
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.address}/{path.lstrip('/')}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def is_ready(self) -> bool:
        return self.is_running() and http_status(self.url("/debug/ready"), context=self.ssl_context) == 200

    def _command(self) -> list[str]:
        return [
            console_script("gazette"), "serve",
            "--broker.host", "127.0.0.1",
            "--broker.port", str(self.port),
            "--broker.file-root", str(self.file_root),
            "--broker.id", self.broker_id,
            "--broker.zone", self.zone,
            "--etcd.address", self.etcd_url,
            "--etcd.prefix", self.etcd_prefix,
            *self.extra_args,
        ]

    def start(self, timeout: float = 30.0) -> None:
        """Spawns the broker and returns once it is ready (see the module invariants)."""
        if self.is_running():
            raise RuntimeError(f"broker {self.broker_id} is already running")
        self.file_root.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(_START_ATTEMPTS):
            self.port = self._fixed_port or free_port()
            try:
                self._spawn_and_wait(timeout)
                return
            except BrokerStartError as err:
                lost_port = "address already in use" in str(err)
                if not lost_port or self._fixed_port or attempt + 1 == _START_ATTEMPTS:
                    raise

    def _spawn_and_wait(self, timeout: float) -> None:
        self._close_log()
        self._log = self.log_path.open("ab")
        self._log.write(f"=== {' '.join(self._command())}\n".encode())
        self._log.flush()
        log_start = self._log.tell()
        env = {**os.environ, **self.extra_env}
        self._proc = subprocess.Popen(
            self._command(), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env,
        )
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"broker {self.broker_id} exited with status {code} while starting on port "
                    f"{self.port}; log tail:\n{_log_tail(self.log_path)}"
                )
            # Ready means *this* process says so: another process could hold the port (then
            # ours fails to bind), so its own log must show it started, too.
            if (http_status(self.url("/debug/ready"), context=self.ssl_context) == 200
                    and self._logged_start(log_start)):
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise BrokerStartError(
                    f"broker {self.broker_id} not ready on port {self.port} after {timeout}s; "
                    f"log tail:\n{_log_tail(self.log_path)}"
                )
            time.sleep(_POLL_INTERVAL)

    def _logged_start(self, offset: int) -> bool:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return _STARTED in f.read()
        except OSError:
            return False

    def stop(self, timeout: float = 30.0) -> int:
        """Sends SIGTERM (the broker drains) and waits for the exit; returns its status.
        Raises TimeoutError, leaving the process running, if it outlives `timeout`."""
        if self._proc is None:
            raise RuntimeError(f"broker {self.broker_id} was never started")
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float) -> int:
        """Waits for the process to exit (after a SIGTERM sent by someone) and returns its
        status. Raises TimeoutError, leaving the process running, if it outlives `timeout`;
        the error carries the process's asyncio tasks (dumped on SIGUSR1) and its log tail."""
        if self._proc is None:
            raise RuntimeError(f"broker {self.broker_id} was never started")
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # What is it waiting on: its tasks' stacks (SIGUSR1), then the log's tail.
            self._proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(2.0)
            raise TimeoutError(
                f"broker {self.broker_id} still running {timeout}s after SIGTERM; log tail:\n"
                f"{_log_tail(self.log_path, 40_000)}"
            ) from None
        self._close_log()
        return code

    def kill(self) -> None:
        """SIGKILL, no drain; returns once the process is reaped."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class GazctlResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str


class Cluster:
    """Brokers sharing one etcd prefix and one file root; use as a context manager."""

    def __init__(
        self, etcd_url: str, etcd_prefix: str, root: Path, *, gazctl_timeout: float = 60.0
    ) -> None:
        self.etcd_url = etcd_url if "://" in etcd_url else f"http://{etcd_url}"
        self.etcd_prefix = etcd_prefix
        self.root = Path(root)
        self.file_root = self.root / "fragments"
        self.log_dir = self.root / "logs"
        self.home = self.root / "home"  # gazctl's HOME: no user gazctl.ini leaks in
        self.tmp_dir = self.root / "tmp"
        self.brokers: list[BrokerProcess] = []
        self.gazctl_timeout = gazctl_timeout
        for d in (self.file_root, self.log_dir, self.home, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def add_broker(
        self,
        zone: str = "local",
        broker_id: str | None = None,
        *,
        port: int | None = None,
        start: bool = True,
        extra_args: tuple[str, ...] = (),
        timeout: float = 30.0,
        extra_env: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> BrokerProcess:
        """Creates (and by default starts, waiting until ready) a broker of this cluster, on
        ``port`` if given (a restarted broker keeps its address), else on a free port."""
        broker = BrokerProcess(
            etcd_url=self.etcd_url,
            etcd_prefix=self.etcd_prefix,
            file_root=self.file_root,
            log_dir=self.log_dir,
            broker_id=broker_id or f"broker-{uuid.uuid4().hex[:8]}",
            zone=zone,
            port=port,
            extra_args=extra_args,
            # Spools live in TMPDIR: keep them under the cluster's root, removed with it.
            extra_env={"TMPDIR": str(self.tmp_dir), **(extra_env or {})},
            ssl_context=ssl_context,
        )
        self.brokers.append(broker)
        if start:
            broker.start(timeout)
        return broker

    @property
    def broker(self) -> BrokerProcess:
        """The first running broker."""
        for b in self.brokers:
            if b.is_running():
                return b
        raise RuntimeError("no broker of this cluster is running")

    @property
    def address(self) -> str:
        return self.broker.address

    def env(self, broker: BrokerProcess | None = None) -> dict[str, str]:
        """The environment gazctl runs in: BROKER_ADDRESS of `broker` (default: the first)."""
        env = {k: v for k, v in os.environ.items() if k not in ("BROKER_ADDRESS", "LOG_LEVEL")}
        env["BROKER_ADDRESS"] = (broker or self.broker).address
        env["HOME"] = str(self.home)
        return env

    def gazctl(
        self,
        *args: str,
        stdin: str | bytes | None = None,
        broker: BrokerProcess | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> GazctlResult:
        """Runs the installed ``gazctl`` console script; returns (rc, stdout, stderr)."""
        data = stdin.encode() if isinstance(stdin, str) else stdin
        full_env = {**self.env(broker), **(env or {})}
        proc = subprocess.run(
            [console_script("gazctl"), *args],
            input=data if data is not None else b"",
            capture_output=True,
            env=full_env,
            timeout=timeout or self.gazctl_timeout,
            check=False,
        )
        return GazctlResult(
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    def close(self) -> None:
        """Kills every broker (SIGKILL) and deletes the cluster's etcd prefix.

        No drain: it would only persist and hand off journals the finished test no longer
        needs, at the cost of seconds per test; tests that exercise draining call `stop`."""
        for b in self.brokers:
            b.kill()
        self.delete_prefix()

    def delete_prefix(self) -> None:
        """Deletes the cluster's etcd keys through etcd's JSON gateway (best effort)."""
        key = self.etcd_prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        body = json.dumps({
            "key": base64.b64encode(key).decode(),
            "range_end": base64.b64encode(end).decode(),
        }).encode()
        req = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/deleterange", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5):  # noqa: S310 - loopback etcd
                pass
        except (urllib.error.URLError, OSError):
            pass  # a unique prefix left behind harms no other test

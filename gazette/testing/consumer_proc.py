"""Consumer processes (``gazette consume --app ...``) as children of a test or a crash test.

Invariants: a ``ConsumerProc`` owns at most one child at a time, logging (appending) to one
file across restarts; ``terminate`` resumes a stopped child before asking it to drain, so a
frozen process is never left behind; ``kill`` and ``terminate`` return only once the child is
reaped.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import TypeVar

import aetcd

from gazette.allocator.keys import members_prefix
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import console_script

__all__ = ["ConsumerProc", "consumer_endpoints", "consumer_env"]

T = TypeVar("T")


class ConsumerProc:
    """``gazette consume --app <app>`` as a child process, logging to a file."""

    def __init__(self, suffix: str, env: dict[str, str], log_dir: Path, app: str = "soakapp:App") -> None:
        self.suffix, self.env, self.app = suffix, env, app
        self.log_path = log_dir / f"consumer-{suffix}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [console_script("gazette"), "consume", "--app", self.app, "--consumer.id", self.suffix],
                env={**self.env, "CONSUMER_PORT": "0"}, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.running():
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None:
            if self.running():
                self.proc.kill()
            self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGCONT then SIGTERM (a drain); SIGKILL if it outlives ``timeout``. Its exit status."""
        if self.proc is None:
            raise RuntimeError(f"consumer {self.suffix} was never started")
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return -9

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP): its /proc state is 'T'."""
        if self.proc is None or not self.running():
            return False
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def consumer_env(base: dict[str, str], **extra: str) -> dict[str, str]:
    """``base`` without a fixed consumer port or id, plus ``extra``."""
    env = {k: v for k, v in base.items() if k not in ("CONSUMER_PORT", "CONSUMER_ID")}
    env.update(extra)
    env.setdefault("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return env


async def consumer_endpoints(etcd: aetcd.Client, prefix: str) -> list[str]:
    """The endpoints of the consumer processes announced under ``prefix`` that take shards."""
    out = []
    for kv in await etcd.get_prefix(members_prefix(prefix).encode()):
        spec = pc.ConsumerSpec.FromString(kv.value)
        if spec.shard_limit > 0:
            out.append(spec.process_spec.endpoint)
    return out


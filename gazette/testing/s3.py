"""S3 for tests: moto's S3-compatible server as a child process, and boto3 helpers for it.

moto runs in its own process (not a thread here) so that it neither competes with the tests
for the interpreter lock nor shares moto's global state with them. Credentials are dummies:
moto accepts any.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from gazette.errors import GazetteError
from gazette.testing.etcd_process import free_port

__all__ = ["MotoS3Server", "MotoStartError", "DUMMY_CREDENTIALS", "s3_client", "create_bucket"]

REGION = "us-east-1"

# The standard environment variables boto3 (and other S3 clients) read.
DUMMY_CREDENTIALS: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
}


class MotoStartError(GazetteError):
    """The moto server exited or did not answer before its start deadline."""




class MotoS3Server:
    """moto's server on 127.0.0.1 and a free port; `endpoint_url` is what S3 clients take."""

    def __init__(self, *, start_timeout: float = 30.0, attempts: int = 3) -> None:
        self._start_timeout = start_timeout
        self._attempts = attempts
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_path = Path(tempfile.mkstemp(prefix="gazette-moto-", suffix=".log")[1])
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        if not self.port:
            raise MotoStartError("moto server has not been started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        for attempt in range(self._attempts):
            self.port = free_port()
            try:
                self._spawn_and_wait()
                return
            except MotoStartError:
                # The most likely cause of an early exit is losing the free port to a race.
                if attempt + 1 == self._attempts:
                    raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        self.stop()
        self._log_path.unlink(missing_ok=True)

    def __enter__(self) -> MotoS3Server:
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

    def _spawn_and_wait(self) -> None:
        self.stop()
        self._log = self._log_path.open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **DUMMY_CREDENTIALS),
            start_new_session=True,
        )
        deadline = time.monotonic() + self._start_timeout
        delay = 0.02
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = self._log_path.read_bytes()[-3000:].decode("utf-8", "replace")
                self.stop()
                raise MotoStartError(f"moto server exited with status {code}:\n{tail}")
            if self._answers():
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise MotoStartError(f"moto server on port {self.port} did not answer in time")
            # Polling the HTTP endpoint is the readiness condition; the pause bounds the rate.
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer means the server is up
        except OSError:
            return False


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for `endpoint_url` with dummy credentials."""
    import boto3  # optional dependency (gazette[s3])

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def create_bucket(endpoint_url: str, name: str | None = None) -> str:
    """Creates a bucket (a fresh random name unless given) and returns its name."""
    bucket = name or f"gazette-test-{uuid.uuid4().hex[:20]}"
    s3_client(endpoint_url).create_bucket(Bucket=bucket)
    return bucket

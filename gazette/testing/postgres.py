"""PostgreSQL for tests: throwaway databases on an existing server, driven through `psql`.

The `psql` client is used instead of a Python driver so the harness adds no dependency. A
database made by `temporary_database` is dropped on exit, even if clients are still connected.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gazette.errors import GazetteError

__all__ = ["PostgresError", "PostgresServer", "temporary_database"]


class PostgresError(GazetteError):
    """psql is missing, the server cannot be reached, or a statement failed."""


@dataclass(frozen=True)
class PostgresServer:
    """Where a PostgreSQL server listens, and the (trust-authenticated) user to act as."""

    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    connect_timeout: int = 5

    def dsn(self, database: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"

    def psql(self, sql: str, *, database: str = "postgres", timeout: float = 60.0) -> str:
        """Runs `sql` (stopping at the first error) and returns psql's unaligned output."""
        binary = shutil.which("psql")
        if binary is None:
            raise PostgresError("the 'psql' client is not installed (needed by the test harness)")
        env = dict(os.environ, PGCONNECT_TIMEOUT=str(self.connect_timeout))
        command = [
            binary, "-X", "-q", "-t", "-A",
            "-v", "ON_ERROR_STOP=1",
            "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", database,
            "-c", sql,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as err:
            raise PostgresError(f"psql against {self.host}:{self.port} timed out") from err
        if done.returncode != 0:
            raise PostgresError(
                f"psql against {self.host}:{self.port}/{database} failed "
                f"(exit {done.returncode}): {done.stderr.strip()}"
            )
        return done.stdout

    def unavailable_reason(self) -> str | None:
        """None if the server answers a query, else why not (for a test skip message)."""
        try:
            self.psql("SELECT 1")
        except PostgresError as err:
            return str(err)
        return None


@contextmanager
def temporary_database(
    server: PostgresServer | None = None, *, name_prefix: str = "gazette_test"
) -> Iterator[str]:
    """Creates a new, empty database, yields its DSN, and drops it afterwards."""
    server = server or PostgresServer()
    name = f"{name_prefix}_{uuid.uuid4().hex[:16]}"
    server.psql(f'CREATE DATABASE "{name}"')
    try:
        yield server.dsn(name)
    finally:
        server.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

"""Shared pytest fixtures: real etcd, PostgreSQL and S3 (moto) for integration tests.

Process-owning fixtures are synchronous (they block only while starting and stopping), so a
session-scoped one is independent of the per-test event loops; fixtures holding asyncio
objects (the etcd client) are function-scoped and live on the test's own loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gazette.testing.cluster import Cluster
from gazette.testing.etcd import EtcdFixture, etcd_context, start_test_etcd, unique_prefix
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.postgres import PostgresServer, temporary_database
from gazette.testing.s3 import DUMMY_CREDENTIALS, MotoS3Server, create_bucket


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdProcess]:
    """One etcd for the whole run; tests isolate themselves by key prefix (see `etcd`)."""
    server = start_test_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def etcd(etcd_server: EtcdProcess) -> AsyncIterator[EtcdFixture]:
    """A connected client and a key prefix unique to this test (deleted afterwards)."""
    async with etcd_context(etcd_server) as ctx:
        yield ctx


@pytest.fixture
def etcd_fresh() -> Iterator[EtcdProcess]:
    """A private etcd the test may kill, restart or compact; removed afterwards."""
    server = start_test_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """DSN of a fresh database on the PostgreSQL at 127.0.0.1:5432, dropped after the run."""
    server = PostgresServer()
    reason = server.unavailable_reason()
    if reason is not None:
        pytest.skip(f"PostgreSQL at {server.host}:{server.port} is unavailable: {reason}")
    with temporary_database(server) as dsn:
        yield dsn


@pytest.fixture
def postgres_db(postgres_dsn: str) -> Iterator[str]:
    """DSN of a database of this test's own (so tables it makes leave the session's alone)."""
    with temporary_database(PostgresServer()) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a moto S3 server; dummy AWS credentials are set in the environment."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in DUMMY_CREDENTIALS.items():
            mp.setenv(name, value)
        with MotoS3Server() as server:
            yield server.endpoint_url


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """Name of a new, empty bucket on `s3_server`."""
    return create_bucket(s3_server)


@pytest.fixture
def cluster(etcd_server: EtcdProcess, tmp_path: Path) -> Iterator[Cluster]:
    """A broker cluster on the session etcd under a unique prefix, rooted in `tmp_path`.

    It starts with no broker: call ``cluster.add_broker()``. Every broker is killed and the
    prefix deleted afterwards.
    """
    with Cluster(etcd_server.url, unique_prefix(), tmp_path / "cluster") as c:
        yield c

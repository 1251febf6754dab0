"""Harnesses that run real dependencies for tests: etcd, an S3 server (moto), PostgreSQL.

Each helper owns what it starts and removes it on exit; nothing here mocks a protocol. The
pytest fixtures built on these live in the project's tests/conftest.py:

* `etcd_server` (session): a shared `gazette.etcd.EtcdProcess`.
* `etcd` (function): an `EtcdFixture` - connected client plus a key prefix unique to the test,
  deleted afterwards.
* `etcd_fresh` (function): a private `EtcdProcess`, free to be killed, restarted or compacted.
* `postgres_dsn` (session): DSN of a fresh database, dropped at the end of the run.
* `s3_server` (session) / `s3_bucket` (function): a moto S3 endpoint URL and a fresh bucket.

Names are loaded on first use: the ``gazette`` pytest plugin (``gazette.testing.pytest_plugin``)
is loaded into every pytest session of an environment with gazette installed, and importing
this package must not load etcd's client, gRPC or the consumer stack into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gazette.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gazette.testing.etcd import EtcdFixture, etcd_context, start_test_etcd, unique_prefix
    from gazette.testing.postgres import PostgresError, PostgresServer, temporary_database
    from gazette.testing.s3 import MotoS3Server, create_bucket, s3_client

_HOMES = {
    "EtcdFixture": "gazette.testing.etcd", "etcd_context": "gazette.testing.etcd",
    "start_test_etcd": "gazette.testing.etcd", "unique_prefix": "gazette.testing.etcd",
    "PostgresError": "gazette.testing.postgres", "PostgresServer": "gazette.testing.postgres",
    "temporary_database": "gazette.testing.postgres",
    "MotoS3Server": "gazette.testing.s3", "create_bucket": "gazette.testing.s3",
    "s3_client": "gazette.testing.s3",
}

__all__ = [
    "EtcdFixture",
    "etcd_context",
    "start_test_etcd",
    "unique_prefix",
    "PostgresError",
    "PostgresServer",
    "temporary_database",
    "MotoS3Server",
    "create_bucket",
    "s3_client",
]

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, __all__)

"""etcd for tests: a quickly started local server and per-test isolated key prefixes.

Tests sharing one server stay independent by writing only under their own prefix
(`/gazette-test/<random hex>`), which `etcd_context` deletes when the test ends.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aetcd

from gazette.etcd import connect
from gazette.testing.etcd_process import EtcdProcess

__all__ = ["EtcdFixture", "start_test_etcd", "unique_prefix", "etcd_context"]

log = logging.getLogger(__name__)

TEST_ROOT = "/gazette-test"


@dataclass(frozen=True)
class EtcdFixture:
    """What an etcd-using test gets: a client, its own key prefix, and the server."""

    client: aetcd.Client
    prefix: str
    endpoint: str
    server: EtcdProcess


def start_test_etcd() -> EtcdProcess:
    """Starts a throwaway etcd (fresh data dir, free ports) tuned for tests, and returns it.

    fsync is off: a test's data need not survive a machine crash, only a process kill, which
    the OS page cache already covers; this keeps etcd writes fast on slow disks.
    """
    server = EtcdProcess(unsafe_no_fsync=True)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


def unique_prefix(base: str = TEST_ROOT) -> str:
    """A key prefix no other test uses (a clean path, usable as a KeySpace root)."""
    return f"{base}/{uuid.uuid4().hex}"


@asynccontextmanager
async def etcd_context(server: EtcdProcess) -> AsyncIterator[EtcdFixture]:
    """Connects a client to `server`, yields it with a unique prefix, then cleans that prefix."""
    client = await connect(server.endpoint)
    prefix = unique_prefix()
    try:
        yield EtcdFixture(client=client, prefix=prefix, endpoint=server.endpoint, server=server)
    finally:
        try:
            if server.is_running():
                await client.delete_prefix(prefix.encode())
        except aetcd.exceptions.ClientError as err:
            # The server may have been stopped by the test itself; leftovers under a unique
            # prefix harm no other test.
            log.warning("could not delete test prefix %s: %s", prefix, err)
        finally:
            await client.close()

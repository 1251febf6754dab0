"""The announcement's keep-alive loop ends when cancelled, whatever the refresh is doing.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives while the awaited
call has just completed (it returns the call's result instead). The keep-alive loop used it for
each lease refresh, so a process whose task group cancelled it at that moment kept refreshing
forever, and its drain never ended (seen as a broker outliving SIGTERM in the rolling-restart
soak). The race is driven here deterministically with a fake client.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gazette.allocator.announce import Announcement


class _Client:
    """refresh_lease answers when the test says so."""

    def __init__(self) -> None:
        self.pending: asyncio.Future[Any] | None = None
        self.asked = asyncio.Event()

    async def refresh_lease(self, lease_id: int) -> Any:
        self.pending = asyncio.get_running_loop().create_future()
        self.asked.set()
        return await self.pending


async def test_cancelled_as_a_refresh_completes_the_loop_ends() -> None:
    client = _Client()
    ann = Announcement(client, "/members/a#b", lease_id=7, ttl=3, revision=1)  # type: ignore[arg-type]
    task = asyncio.create_task(ann.keep_alive())
    await client.asked.wait()
    assert client.pending is not None
    # The refresh completes and, before the loop resumes, its owner cancels it.
    client.pending.set_result(SimpleNamespace(TTL=3))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):  # a swallowed cancellation would loop until this
            await task


async def test_cancelled_while_refreshing_the_loop_ends() -> None:
    client = _Client()
    ann = Announcement(client, "/members/a#b", lease_id=7, ttl=3, revision=1)  # type: ignore[arg-type]
    task = asyncio.create_task(ann.keep_alive())
    await client.asked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert client.pending is not None and client.pending.cancelled()


class _FlakyClient:
    """refresh_lease fails with each of `errors` in turn, then answers with a live lease."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls = 0
        self.answered = asyncio.Event()

    async def refresh_lease(self, lease_id: int) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.answered.set()
        return SimpleNamespace(TTL=3)


async def test_an_etcd_going_away_mid_refresh_is_retried() -> None:
    # A restarting etcd tears the keep-alive stream down; gRPC's core reports that as INTERNAL
    # ("Internal error from Core"), not UNAVAILABLE. The member must ride it out (seen once in
    # the allocator's etcd-restart test, where the keep-alive ended with InternalError).
    import aetcd.exceptions

    client = _FlakyClient([
        aetcd.exceptions.InternalError("Internal error from Core"),
        aetcd.exceptions.ConnectionFailedError("failed to connect"),
        aetcd.exceptions.ConnectionTimeoutError("deadline exceeded"),
    ])
    ann = Announcement(client, "/members/a#b", lease_id=7, ttl=1, revision=1)  # type: ignore[arg-type]
    task = asyncio.create_task(ann.keep_alive())
    try:
        async with asyncio.timeout(10):
            await client.answered.wait()
        assert not task.done()
        assert client.calls == 4
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

"""``MemoryStore``: a shard's state in a dict, for tests and stateless applications.

Invariants: a commit applies after every ``wait_for`` future resolved, and records the
checkpoint it was given; ``restore_checkpoint`` returns the last one recorded. Nothing survives
the process: a shard moved elsewhere starts from an empty checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from gazette.consumer.interfaces import OpFuture, Shard
from gazette.protocol import consumer_pb2 as pc

__all__ = ["MemoryStore"]


class MemoryStore:
    """A shard's state in the dict ``state``, with the last checkpoint committed; kept in
    memory only (see the module's invariants)."""

    def __init__(self) -> None:
        self.state: dict[Any, Any] = {}
        self.checkpoint = pc.Checkpoint()
        self.commits = 0

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        if not wait_for:  # nothing to wait for: commit now, without a task
            self._apply(checkpoint)
            done: OpFuture = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return asyncio.ensure_future(self._commit(checkpoint, wait_for))

    async def _commit(self, checkpoint: pc.Checkpoint, wait_for: Sequence[Awaitable[Any]]) -> None:
        for f in wait_for:
            await f
        self._apply(checkpoint)

    def _apply(self, checkpoint: pc.Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.commits += 1

    def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        return self.checkpoint

    def destroy(self) -> None:
        self.state.clear()

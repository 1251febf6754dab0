"""What the embedded stores share: where their directory is, and committing a captured batch.

A store given a ``Recorder`` lives in the recorder's directory (the one the player recovered
into) and commits by capturing its files' changes into the recorder, synchronously inside
``start_commit`` (nothing else touches the files meanwhile), then appending the batch once the
transaction's own appends resolved. A store given no recorder lives in ``directory`` and is
durable on that host only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from gazette.consumer.errors import ConsumerError
from gazette.consumer.interfaces import OpFuture
from gazette.recoverylog import Recorder

__all__ = ["StoreOptionError", "commit_batch", "store_directory"]


class StoreOptionError(ConsumerError, ValueError):
    """A store option that would break recording into the recovery log."""


def store_directory(recorder: Recorder | None, directory: str | os.PathLike[str] | None, kind: str) -> str:
    if recorder is not None:
        if directory is not None and os.path.abspath(directory) != recorder.dir:
            raise StoreOptionError(f"{kind}: a recorded store lives in its recorder's directory "
                                   f"({recorder.dir}), not {directory}")
        return recorder.dir
    if directory is None:
        raise StoreOptionError(f"{kind}: give a recorder (the shard has a recovery log) or a directory")
    os.makedirs(directory, exist_ok=True)
    return os.fspath(directory)


def commit_batch(recorder: Recorder | None, wait_for: Sequence[Awaitable[Any]],
                 previous: OpFuture | None = None) -> OpFuture:
    """The commit's future: the recorder's batch (taken now) appended after ``wait_for`` (or,
    without a recorder, ``wait_for`` and then ``previous``, the store's previous commit).

    Either way a store's commits resolve in order, and a commit fails if an earlier one did
    (the recorder serialises its flushes and fails for good on the first that fails): the
    stores declare ``ordered_commits``, so the transaction loop may start the next commit while
    this one is outstanding."""
    if recorder is not None:
        return cast(OpFuture, recorder.start_flush(wait_for))

    async def run() -> None:
        for f in wait_for:
            await f
        if previous is not None:
            await previous
    return asyncio.ensure_future(run())

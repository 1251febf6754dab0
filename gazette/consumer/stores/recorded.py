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
from typing import Any

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


def commit_batch(recorder: Recorder | None, wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
    """The commit's future: the recorder's batch appended after ``wait_for`` (or just
    ``wait_for`` without a recorder)."""
    async def run() -> None:
        if recorder is not None:
            await recorder.flush(wait_for)
        else:
            for f in wait_for:
                await f
    return asyncio.ensure_future(run())

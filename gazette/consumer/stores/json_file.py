"""``JSONFileStore``: a shard's state as one JSON document in a file, committed with its
checkpoint (Gazette's ``store_json_file.go``, same file layout).

``state.json`` holds three JSON values, one per line: the sources' read-through offsets, the
application's ``state`` (anything ``json`` serialises: a dict of counts, say), and the
checkpoint (protobuf JSON). A commit writes ``next.json``, fsyncs it and renames it over
``state.json``, then fsyncs the directory: a crash leaves either the old or the new file.

Invariants:

* ``start_commit`` serialises ``state`` synchronously, so the next transaction may mutate it
  while this one is written (pipelining); the file is written only after every ``wait_for``
  future (the transaction's appends) resolved, so a checkpoint never runs ahead of its output.
* Opening a directory that has ``state.json`` restores its state and checkpoint; the read-through
  offsets line wins over the checkpoint's, as in Gazette (operators may edit it to rewind).
* With a ``recorder`` (the shard has a recovery log) the store lives in the recorder's
  directory, recovered from the log: ``start_commit`` writes ``next.json`` and renames it over
  ``state.json`` at once, recording the same create, write and rename into the recorder, whose
  batch is appended (and so made durable) only after ``wait_for``. No fsync: the log is what is
  durable, and the local directory is discarded with the shard. ``destroy`` removes it.
* Without a recorder the store is durable on this host only: the directory is kept, so a
  restart on the same host resumes where it left off.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gazette.consumer.errors import ConsumerError
from gazette.consumer.interfaces import OpFuture, Shard
from gazette.consumer.stores.recorded import commit_batch, store_directory
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import Recorder

__all__ = ["JSONFileStore", "StateFileError"]

CURRENT = "state.json"
NEXT = "next.json"


class StateFileError(ConsumerError):
    """The state file exists but does not decode."""


class JSONFileStore:
    """A shard's ``state`` (anything ``json`` serialises) committed with its checkpoint as
    one file, ``state.json``, in ``directory`` (see the module's invariants)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, state: Any = None, *,
                 recorder: Recorder | None = None) -> None:
        self.dir = Path(store_directory(recorder, directory, "JSONFileStore"))
        self.state: Any = {} if state is None else state
        self.checkpoint = pc.Checkpoint()
        self.recorder = recorder
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / CURRENT
        if path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        lines = path.read_text().splitlines()
        try:
            offsets = json.loads(lines[0])
            self.state = json.loads(lines[1])
            if len(lines) > 2 and lines[2].strip():
                json_format.Parse(lines[2], self.checkpoint)
        except (IndexError, ValueError, json_format.ParseError) as err:
            raise StateFileError(f"{path}: cannot decode state file: {err}") from None
        for journal, offset in offsets.items():
            self.checkpoint.sources[journal].read_through = int(offset)

    def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        return self.checkpoint

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        self.checkpoint = checkpoint
        offsets = {j: s.read_through for j, s in checkpoint.sources.items()}
        doc = (json.dumps(offsets, sort_keys=True) + "\n" + json.dumps(self.state) + "\n"
               + json_format.MessageToJson(checkpoint, indent=None) + "\n").encode()
        if self.recorder is not None:
            self._write_recorded(self.recorder, doc)
            return commit_batch(self.recorder, wait_for)
        return asyncio.ensure_future(self._commit(doc, wait_for))

    def _write_recorded(self, recorder: Recorder, doc: bytes) -> None:
        nxt, cur = self.dir / NEXT, self.dir / CURRENT
        with open(nxt, "wb") as f:
            f.write(doc)
        os.replace(nxt, cur)
        recorder.write_at(recorder.create(NEXT), doc, 0)
        recorder.rename(NEXT, CURRENT)

    async def _commit(self, doc: bytes, wait_for: Sequence[Awaitable[Any]]) -> None:
        for f in wait_for:
            await f
        await asyncio.to_thread(self._write, doc)

    def _write(self, doc: bytes) -> None:
        nxt, cur = self.dir / NEXT, self.dir / CURRENT
        with open(nxt, "wb") as f:
            f.write(doc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(nxt, cur)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def destroy(self) -> None:
        if self.recorder is not None:  # the recovery log holds it: the local copy may go
            shutil.rmtree(self.dir, ignore_errors=True)

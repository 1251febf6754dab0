"""``SQLiteStore``: a shard's state in an embedded SQLite database (stdlib ``sqlite3``),
recorded into the shard's recovery log by WAL-frame capture (Gazette's ``store-sqlite``, by
other means).

The application uses ``conn`` with ordinary SQL inside the transaction the store keeps open;
``start_commit`` writes the checkpoint row into the same SQL transaction and commits it, so
state and checkpoint commit together; then the WAL's committed frames are captured (and, past
``checkpoint_bytes`` of WAL, the store checkpoints the WAL into the database and records the
pages) and appended as one fenced batch.

Invariants:

* The connection runs ``locking_mode=EXCLUSIVE``, ``journal_mode=WAL``, ``synchronous=OFF``
  (durability is the log's) and ``wal_autocheckpoint=0`` (checkpoints are the store's). An
  authorizer notes any statement setting one of them, and the next commit then checks them and
  fails naming the pragma if it changed, as capture would silently lose writes otherwise.
* The checkpoint is the single row of table ``gazette_checkpoint``.

``page_size`` applies to a new database (an existing one keeps its own). The log records whole
pages, so it sets the write amplification of random writes: 100 upserts of random keys rewrite
about 100 pages, some 500 KB of WAL per commit with SQLite's default 4 KiB pages and about 200 KB
with 1 KiB pages, at about the same unrecorded speed (``bench/recoverylog_bench.py``).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Awaitable, Sequence
from typing import Any

from gazette.consumer.interfaces import OpFuture, Shard
from gazette.consumer.stores.recorded import StoreOptionError, commit_batch, store_directory
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import Recorder
from gazette.recoverylog.capture import WalCapture

__all__ = ["SQLiteStore"]

_PRAGMAS = (("locking_mode", "exclusive"), ("journal_mode", "wal"), ("synchronous", "0"),
            ("wal_autocheckpoint", "0"))
_PINNED = frozenset(name for name, _ in _PRAGMAS)


class SQLiteStore:
    """A shard's state in an embedded SQLite database (``conn``), recorded into the shard's
    recovery log by ``recorder`` (see the module's invariants)."""

    ordered_commits = True  # see commit_batch

    def __init__(self, recorder: Recorder | None, *, directory: str | None = None,
                 filename: str = "db.sqlite", checkpoint_bytes: int = 4 << 20,
                 page_size: int | None = None) -> None:
        if page_size is not None and (page_size < 512 or page_size > 65536 or page_size & (page_size - 1)):
            raise StoreOptionError(f"SQLiteStore: page_size {page_size} is not a power of two "
                                   "from 512 to 65536")
        self.recorder = recorder
        self.dir = store_directory(recorder, directory, "SQLiteStore")
        self._last_commit: OpFuture | None = None
        self.path = os.path.join(self.dir, filename)
        self.checkpoint_bytes = checkpoint_bytes
        self.conn = sqlite3.connect(self.path, isolation_level="DEFERRED", check_same_thread=False)
        if page_size is not None:  # before WAL mode, which fixes it
            self.conn.execute(f"PRAGMA page_size={page_size}")
        for name, value in _PRAGMAS:
            self.conn.execute(f"PRAGMA {name}={value}")
        self._check_pragmas()
        # A statement setting a pinned pragma marks the next commit to check them (reading the
        # pragmas on every commit would cost more than many a transaction's writes).
        self._pragmas_set = False
        self.conn.set_authorizer(self._authorize)
        # Opening in WAL mode leaves a recovered database's files as recorded: learn them now.
        self.capture = WalCapture(recorder, self.path) if recorder is not None else None
        self.conn.execute("CREATE TABLE IF NOT EXISTS gazette_checkpoint "
                          "(id INTEGER PRIMARY KEY CHECK (id = 0), checkpoint BLOB NOT NULL)")
        self.conn.commit()

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None,
                   source: str | None) -> int:
        if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() in _PINNED:
            self._pragmas_set = True
        return sqlite3.SQLITE_OK

    def _check_pragmas(self) -> None:
        for name, want in _PRAGMAS:
            got = str(self.conn.execute(f"PRAGMA {name}").fetchone()[0]).lower()
            if got != want:
                raise StoreOptionError(
                    f"SQLiteStore: PRAGMA {name} is {got}, but recording needs {want} "
                    "(the store captures committed WAL frames and runs its own checkpoints)")

    def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        cp = pc.Checkpoint()
        row = self.conn.execute("SELECT checkpoint FROM gazette_checkpoint WHERE id = 0").fetchone()
        if row is not None:
            cp.ParseFromString(row[0])
        return cp

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        self.conn.execute("INSERT OR REPLACE INTO gazette_checkpoint (id, checkpoint) VALUES (0, ?)",
                          (checkpoint.SerializeToString(),))
        self.conn.commit()
        if self.capture is not None:
            if self._pragmas_set:
                self._check_pragmas()
                self._pragmas_set = False
            self.capture.capture_commit()
            if self.capture.wal_recorded >= self.checkpoint_bytes:
                self.capture.checkpoint(self.conn)
        self._last_commit = commit_batch(self.recorder, wait_for, self._last_commit)
        return self._last_commit

    def destroy(self) -> None:
        self.conn.close()
        if self.recorder is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

"""``RocksDBStore``: a shard's state in an embedded RocksDB (rocksdict), recorded into the
shard's recovery log by directory scan (Gazette's ``store-rocksdb``).

The application reads and writes through the store: ``get``/``put``/``delete`` buffer the
transaction's writes in an overlay (reads see them), and ``start_commit`` writes the overlay
and the checkpoint in *one* ``WriteBatch``, so state and checkpoint commit together; then the
directory's changes are captured (stable-MANIFEST rule) and appended as one fenced batch.
``db`` is the underlying ``Rdict`` (raw bytes keys and values) for scans of committed data.

Invariants:

* Options that keep RocksDB's files append-only are pinned (no WAL recycling, no mmap writes,
  no direct I/O for flushes and compactions, no WAL archive, the WAL in the store directory);
  passing one of them with another value raises ``StoreOptionError`` saying why.
* The checkpoint lives under the key ``CHECKPOINT_KEY``, which the application must not use.
* Background flushes and compactions run freely; capture runs between ``db.write`` and the next
  transaction's writes, on the shard's one thread of writes.
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Any, cast

from gazette.consumer.errors import MissingExtraError

try:
    import rocksdict
except ModuleNotFoundError as err:
    raise MissingExtraError(
        "RocksDBStore needs rocksdict: pip install 'gazette[rocksdb]'") from err

from gazette.consumer.interfaces import OpFuture, Shard
from gazette.consumer.stores.recorded import StoreOptionError, commit_batch, store_directory
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import Recorder
from gazette.recoverylog.capture import DirCapture, rocksdb_stable

__all__ = ["CHECKPOINT_KEY", "RocksDBStore"]

CHECKPOINT_KEY = b"\x00gazette.checkpoint"

_PINNED: dict[str, tuple[Any, str]] = {
    "recycle_log_file_num": (0, "recycled WAL files are overwritten in place, which a recorder "
                                "of appended bytes cannot capture"),
    "allow_mmap_writes": (False, "mmap writes change files in place"),
    "use_direct_io_for_flush_and_compaction": (False, "direct I/O bypasses the page cache the capture reads"),
    "wal_ttl_seconds": (0, "archived WALs move out of the store directory"),
    "wal_size_limit_mb": (0, "archived WALs move out of the store directory"),
    "wal_dir": (None, "the WAL must live in the store directory to be recorded"),
    "db_log_dir": (None, "fine to set, but LOG files are never recorded anyway"),
}


class RocksDBStore:
    ordered_commits = True  # see commit_batch

    def __init__(self, recorder: Recorder | None, *, directory: str | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        self.recorder = recorder
        self.dir = store_directory(recorder, directory, "RocksDBStore")
        self._last_commit: OpFuture | None = None
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_max_manifest_file_size(64 << 20)
        for name, value in (options or {}).items():
            if name in _PINNED:
                pinned, why = _PINNED[name]
                if value != pinned:
                    raise StoreOptionError(f"RocksDBStore option {name}={value!r} is refused: {why}")
                continue
            setter = getattr(opts, f"set_{name}", None) or getattr(opts, name, None)
            if setter is None:
                raise StoreOptionError(f"RocksDBStore: unknown RocksDB option {name!r}")
            setter(value)
        opts.set_recycle_log_file_num(0)
        opts.set_allow_mmap_writes(False)
        opts.set_use_direct_io_for_flush_and_compaction(False)
        opts.set_wal_ttl_seconds(0)
        opts.set_wal_size_limit_mb(0)
        # Learn the recovered files before RocksDB's open changes them (new MANIFEST, CURRENT).
        self.capture = DirCapture(recorder, stable=rocksdb_stable) if recorder is not None else None
        self.db = rocksdict.Rdict(self.dir, opts)
        self._overlay: dict[bytes, bytes | None] = {}
        self._write_opts = rocksdict.WriteOptions()
        if self.capture is not None:
            self.capture.capture()  # what opening the database changed

    # -- the application's reads and writes ----------------------------------------------

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        if key in self._overlay:
            v = self._overlay[key]
            return default if v is None else v
        v = self.db.get(key)
        return default if v is None else bytes(v)

    def put(self, key: bytes, value: bytes) -> None:
        self._overlay[key] = value

    def delete(self, key: bytes) -> None:
        self._overlay[key] = None

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Committed items whose key begins with ``prefix``, in key order (not this
        transaction's writes)."""
        for k, v in self.db.items(from_key=prefix):
            key, value = cast(bytes, k), cast(bytes, v)
            if not key.startswith(prefix):
                break
            if key != CHECKPOINT_KEY:
                yield key, value

    # -- Store -----------------------------------------------------------------------------

    def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        cp = pc.Checkpoint()
        raw = self.db.get(CHECKPOINT_KEY)
        if raw is not None:
            cp.ParseFromString(bytes(raw))
        return cp

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, v in self._overlay.items():
            if v is None:
                wb.delete(k)
            else:
                wb.put(k, v)
        wb.put(CHECKPOINT_KEY, checkpoint.SerializeToString())
        self.db.write(wb, self._write_opts)
        self._overlay = {}
        if self.capture is not None:
            self.capture.capture()
        self._last_commit = commit_batch(self.recorder, wait_for, self._last_commit)
        return self._last_commit

    def destroy(self) -> None:
        self.db.close()
        if self.capture is not None:
            self.capture.close()
        if self.recorder is not None:  # the recovery log holds it
            shutil.rmtree(self.dir, ignore_errors=True)

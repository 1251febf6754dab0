"""Captures: turning a store directory's changes into recorder calls, for stores whose file
I/O cannot be intercepted from Python (RocksDB through rocksdict, SQLite through ``sqlite3``).

``DirCapture`` scans a directory after each commit. Files matching ``append_only`` (RocksDB's
SSTs, WALs and MANIFESTs) are recorded as the bytes appended since the last scan; any other file
is small and recorded whole when its content changes; a name whose inode changed, a file that
shrank or whose recorded head or tail bytes changed is recorded as unlink + create + full
write; vanished names as unlinks. With ``stable`` (RocksDB's CURRENT inode, the MANIFEST it
names and that MANIFEST's size), the scan repeats until a whole round saw ``stable`` unchanged:
a MANIFEST that did not grow during a round describes a version whose every file the round saw
complete (background compactions cannot have added or deleted any of them).

Where Linux's inotify is at hand, ``DirCapture`` watches the directory and skips the scan when
the events since the last capture show only appends to files it already knows (a commit's WAL
record; an SST a flush is still writing): it reads those files' new bytes and nothing else.
Any other event (a file created, deleted or renamed; a MANIFEST or a small file changed; the
event queue overflowed) means a full scan with the stable rule. This is sound because the
kernel reports every change made through the file system (mmap writes, which it does not
report, are pinned off), and a capture that records no MANIFEST change leaves the recorded
version as the last full scan recorded it, stable, with every file it names.

``WalCapture`` records a SQLite database in WAL mode, with the store owning checkpoints: after
each commit, the WAL's new frames up to the *last commit frame* (frames past it belong to a
rolled-back transaction and are overwritten in place later); at a checkpoint, the database
pages those frames named (read back after ``wal_checkpoint(TRUNCATE)``), then the emptied WAL
as a new file. A database that shrank, or a WAL checkpointed behind the store's back, is
rebased: the whole database recorded as a new file.

Invariants:

* After ``capture()``, replaying the log reproduces the directory as of the last commit, up to
  files nothing references (half-written SSTs, which RocksDB deletes on open).
* Ops within a batch are ordered data files, MANIFEST, CURRENT, other files, unlinks; the batch
  is appended atomically anyway.
* Files named by ``exclude`` (RocksDB's LOG and LOCK, the player's staging directory) are never
  recorded.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sqlite3
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gazette.recoverylog.errors import RecoveryLogError
from gazette.recoverylog.recorder import Recorder

try:  # Linux only; elsewhere every capture scans
    import inotify_simple
except ImportError:  # pragma: no cover
    inotify_simple = None

log = logging.getLogger(__name__)

__all__ = ["CaptureError", "DirCapture", "WalCapture", "rocksdb_stable"]

_GUARD = 512
_READ_CHUNK = 4 << 20


class CaptureError(RecoveryLogError):
    """The store's files changed in a way its capture cannot record."""


@dataclass(slots=True)
class _Known:
    ino: int
    size: int
    mtime: int
    head: bytes  # first bytes of the recorded content (append-only files)
    tail: bytes  # last bytes of the recorded content (append-only files)
    content: bytes | None  # whole content (other files)


def _pread(path: str, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _rank(name: str) -> int:
    if name.startswith("MANIFEST-"):
        return 1
    if name == "CURRENT":
        return 2
    return 0


class DirCapture:
    def __init__(self, recorder: Recorder, *, append_only: str = r"^(\d+\.(sst|log|blob)|MANIFEST-\d+)$",
                 exclude: str = r"^(LOG.*|LOCK|\.fnodes)$",
                 stable: Callable[[str], Hashable] | None = None, max_rounds: int = 1000) -> None:
        self.recorder = recorder
        self.dir = recorder.dir
        self._append_only = re.compile(append_only)
        self._exclude = re.compile(exclude)
        self._stable = stable
        self._max_rounds = max_rounds
        self._known: dict[str, _Known] = {}
        self.rounds = 0  # scan rounds of the last capture (0: only appends, read without a scan)
        self.scans = 0  # captures that scanned the directory (the rest read appends only)
        self._watch = _watch(self.dir)
        self._seed()

    def _seed(self) -> None:
        """Learns the files the recorder's FSM already holds (a recovered directory)."""
        for path in list(self.recorder.fsm.links):
            name = path.lstrip("/")
            full = os.path.join(self.dir, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                continue  # recorded but gone: the next scan records the unlink
            if self._append_only.match(name):
                self._known[name] = _Known(st.st_ino, st.st_size, st.st_mtime_ns, _pread(full, 0, _GUARD),
                                           _pread(full, max(0, st.st_size - _GUARD), _GUARD), None)
            else:
                with open(full, "rb") as f:
                    self._known[name] = _Known(st.st_ino, st.st_size, st.st_mtime_ns, b"", b"", f.read())
        for name in [p.lstrip("/") for p in self.recorder.fsm.links]:
            if name not in self._known:
                self._known[name] = _Known(-1, -1, -1, b"", b"", None)

    def close(self) -> None:
        """Releases the directory's watch (captures after this scan)."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def capture(self) -> None:
        """Records every change since the last capture (see the module docstring)."""
        if self._only_appends():
            self.rounds = 0
            return
        self.scans += 1
        for rounds in range(1, self._max_rounds + 1):
            before = self._stable(self.dir) if self._stable else None
            self._scan()
            if self._stable is None or self._stable(self.dir) == before:
                self.rounds = rounds
                return
        raise CaptureError(f"{self.dir}: the directory did not settle in {self._max_rounds} scans")

    def _only_appends(self) -> bool:
        """Reads the watch's events; when they show only appends to known append-only files,
        records those and returns True (no scan needed)."""
        if self._watch is None:
            return False
        try:
            raw = os.read(self._watch.fileno(), _EVENTS_READ)
        except BlockingIOError:
            return True  # no event: nothing changed
        except OSError:
            self.close()
            return False
        grown: set[str] = set()
        for ev in inotify_simple.parse_events(raw):
            if ev.mask & ~_MODIFY or not ev.name:  # created, deleted, moved; queue overflow
                if ev.name and self._exclude.match(ev.name):
                    continue
                return False
            if self._exclude.match(ev.name):
                continue
            k = self._known.get(ev.name)
            if k is None or k.content is not None or ev.name.startswith("MANIFEST-"):
                return False  # a new or small file, or a new version: the stable rule applies
            grown.add(ev.name)
        for name in sorted(grown):
            full = os.path.join(self.dir, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                return False
            k = self._known[name]
            if st.st_ino != k.ino or st.st_size < k.size:
                return False
            if st.st_size > k.size and not self._appended(name, full, st, k):
                return False
        return True

    def _appended(self, name: str, full: str, st: os.stat_result, k: _Known) -> bool:
        """Records the bytes appended to a known file since ``k``, read with its recorded tail
        in one read: False (nothing recorded) if that tail changed. (The head guard of a scan
        is left to scans: with RocksDB's files append-only, a rewrite from the start that kept
        the inode and the tail is not something the pinned options let happen.)"""
        fnode = self.recorder.fnode_of(name)
        if fnode is None or st.st_size - k.size > _READ_CHUNK:
            return False
        try:
            fd = os.open(full, os.O_RDONLY)
        except FileNotFoundError:
            # Deleted since its stat (RocksDB drops an obsolete WAL from a background thread):
            # the scan records the unlink.
            return False
        try:
            at = k.size - len(k.tail)
            data = os.pread(fd, st.st_size - at, at)
        finally:
            os.close(fd)
        view = memoryview(data)
        if view[:len(k.tail)] != k.tail or len(data) <= len(k.tail):
            return False
        added = view[len(k.tail):]
        self.recorder.write_at(fnode, added, k.size)
        if len(k.head) < _GUARD:
            k.head = (k.head + bytes(added))[:_GUARD]
        k.tail = data[-_GUARD:]
        k.size = k.size + len(added)
        k.mtime = st.st_mtime_ns if k.size == st.st_size else -1
        return True

    def _scan(self) -> None:
        rec = self.recorder
        found: list[tuple[int, str, os.stat_result]] = []
        with os.scandir(self.dir) as it:
            for entry in it:
                if self._exclude.match(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    found.append((_rank(entry.name), entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
        seen = set()
        for _, name, st in sorted(found):
            seen.add(name)
            k = self._known.get(name)
            if k is not None and (k.ino, k.size, k.mtime) == (st.st_ino, st.st_size, st.st_mtime_ns):
                continue
            full = os.path.join(self.dir, name)
            try:
                if self._append_only.match(name):
                    self._append_only_file(name, full, st, k)
                else:
                    with open(full, "rb") as f:
                        content = f.read()
                    if k is not None and k.ino == st.st_ino and k.content == content:
                        k.size, k.mtime = st.st_size, st.st_mtime_ns
                        continue
                    fnode = rec.create(name)
                    rec.write_at(fnode, content, 0)
                    self._known[name] = _Known(st.st_ino, len(content), st.st_mtime_ns, b"", b"", content)
            except FileNotFoundError:
                seen.discard(name)  # deleted while we looked: recorded as gone below
        for name in [n for n in self._known if n not in seen]:
            del self._known[name]
            if rec.fnode_of(name) is not None:
                rec.unlink(name)

    def _append_only_file(self, name: str, full: str, st: os.stat_result, k: _Known | None) -> None:
        rec = self.recorder
        fd = os.open(full, os.O_RDONLY)
        try:
            whole = k is None or k.ino != st.st_ino or st.st_size < k.size
            if not whole and k is not None and k.size > 0:
                whole = (os.pread(fd, min(_GUARD, k.size), 0) != k.head[:min(_GUARD, k.size)]
                         or os.pread(fd, len(k.tail), k.size - len(k.tail)) != k.tail)
            if whole:
                fnode, start, head, tail = rec.create(name), 0, b"", b""
            else:
                assert k is not None
                fnode, start, head, tail = rec.fnode_of(name), k.size, k.head, k.tail  # type: ignore[assignment]
            assert fnode is not None
            end = start
            while end < st.st_size:
                data = os.pread(fd, min(_READ_CHUNK, st.st_size - end), end)
                if not data:
                    break
                rec.write_at(fnode, data, end)
                if len(head) < _GUARD:
                    head = (head + data)[:_GUARD]
                tail = (tail + data)[-_GUARD:]
                end += len(data)
        finally:
            os.close(fd)
        self._known[name] = _Known(st.st_ino, end, st.st_mtime_ns if end == st.st_size else -1, head, tail, None)


_MODIFY = inotify_simple.flags.MODIFY if inotify_simple is not None else 0
_EVENTS_READ = 64 << 10  # bytes of events read at once (a commit's are a few dozen)


def _inotify_watch(directory: str) -> inotify_simple.INotify | None:
    """An inotify watch of ``directory``'s entries and writes, or None where there is none
    (not Linux; the user's limit of inotify instances reached: then every capture scans)."""
    if inotify_simple is None:
        return None
    fl = inotify_simple.flags
    try:
        watch = inotify_simple.INotify(nonblocking=True)
    except OSError as err:
        log.warning("no inotify watch for a store directory: every capture scans it",
                    extra={"dir": directory, "err": str(err)})
        return None
    try:
        watch.add_watch(directory, fl.MODIFY | fl.CREATE | fl.DELETE | fl.MOVED_FROM | fl.MOVED_TO
                        | fl.ATTRIB | fl.DELETE_SELF | fl.MOVE_SELF)
    except OSError as err:
        watch.close()
        log.warning("no inotify watch for a store directory: every capture scans it",
                    extra={"dir": directory, "err": str(err)})
        return None
    return watch


# A module attribute, looked up at each use (compiled too): tests replace it to run captures
# without a watch, as where inotify is missing.
_watch: Callable[[str], inotify_simple.INotify | None] = _inotify_watch


def rocksdb_stable(directory: str) -> Hashable:
    """RocksDB's stability key: (CURRENT's inode, the MANIFEST it names, that MANIFEST's size)."""
    current = os.path.join(directory, "CURRENT")
    try:
        st = os.stat(current)
        manifest = _manifest_named(current, st.st_ino, st.st_mtime_ns, st.st_size)
        return st.st_ino, manifest, os.stat(os.path.join(directory, manifest)).st_size
    except FileNotFoundError:
        return None


@functools.lru_cache(maxsize=64)
def _manifest_named(current: str, ino: int, mtime_ns: int, size: int) -> str:
    """What CURRENT names; read once per version of it (RocksDB replaces CURRENT by rename,
    never in place, so its inode, mtime and size identify its content)."""
    with open(current) as f:
        return f.read().strip()


_WAL_HEADER = 32
_FRAME_HEADER = 24
_U32 = struct.Struct(">I")


class WalCapture:
    def __init__(self, recorder: Recorder, db_path: str) -> None:
        self.recorder = recorder
        self.db_path = db_path
        self.wal_path = db_path + "-wal"
        self.db_name = os.path.basename(db_path)
        self.wal_name = self.db_name + "-wal"
        self.wal_recorded = 0  # WAL bytes recorded (through the last commit frame)
        self.db_recorded = 0  # size of the recorded database file
        self.page_size = 0
        self._salts = b""
        self._pages: set[int] = set()  # pages named by recorded frames since the last checkpoint
        self.rebases = 0
        self.checkpoints = 0
        self._seed()

    def _size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return -1

    def _seed(self) -> None:
        rec = self.recorder
        if rec.fnode_of(self.db_name) is None:
            self._record_whole_db()
        else:  # recovered: the file is what the log holds
            self.db_recorded = max(0, self._size(self.db_path))
        if rec.fnode_of(self.wal_name) is not None and self._size(self.wal_path) >= 0:
            self.wal_recorded, _ = self._walk(0, self._size(self.wal_path))
        else:
            self._new_wal()
            self.capture_commit()

    def _record_whole_db(self) -> None:
        rec = self.recorder
        fnode = rec.create(self.db_name)
        size = 0
        if os.path.exists(self.db_path):
            with open(self.db_path, "rb") as f:
                while data := f.read(_READ_CHUNK):
                    rec.write_at(fnode, data, size)
                    size += len(data)
        self.db_recorded = size
        self.rebases += 1

    def _new_wal(self) -> None:
        self.recorder.create(self.wal_name)
        self.wal_recorded = 0
        self._salts = b""
        self._pages.clear()

    def _walk(self, start: int, end: int) -> tuple[int, memoryview]:
        """Reads the WAL's [start, end) once and walks its frames, noting the pages of committed
        ones; returns the end of the last commit frame (``start`` when there is none) and the
        bytes from ``start`` to it."""
        fd = os.open(self.wal_path, os.O_RDONLY)
        try:
            data = os.pread(fd, max(0, end - start), start)
        finally:
            os.close(fd)
        pos = 0
        if start == 0:
            if len(data) < _WAL_HEADER:
                return 0, memoryview(b"")
            self.page_size = _U32.unpack_from(data, 8)[0]
            self._salts = data[16:24]
            pos = _WAL_HEADER
        frame = _FRAME_HEADER + self.page_size
        committed, pages = 0, []
        while pos + frame <= len(data):
            if data[pos + 8:pos + 16] != self._salts:
                break  # a stale frame of an earlier WAL generation
            pages.append(_U32.unpack_from(data, pos)[0])
            if _U32.unpack_from(data, pos + 4)[0]:  # a commit frame (database size in pages)
                committed = pos + frame
                self._pages.update(pages)
                pages = []
            pos += frame
        return start + committed, memoryview(data)[:committed]

    def _wal_was_reset(self, size: int) -> bool:
        if size < self.wal_recorded:
            return True
        if not self.wal_recorded:
            return False
        fd = os.open(self.wal_path, os.O_RDONLY)
        try:
            return os.pread(fd, 8, 16) != self._salts
        finally:
            os.close(fd)

    def capture_commit(self) -> None:
        """Records the WAL's frames up to its last commit frame (after each COMMIT)."""
        size = self._size(self.wal_path)
        if self._wal_was_reset(size):
            # checkpointed behind the store's back: which pages moved is unknown, so rebase
            self._record_whole_db()
            self._new_wal()
        if size <= self.wal_recorded:
            return
        start = self.wal_recorded
        end, data = self._walk(start, size)
        if end <= start:
            return
        fnode = self.recorder.fnode_of(self.wal_name)
        if fnode is None:
            fnode = self.recorder.create(self.wal_name)
        self.recorder.write_at(fnode, data, start)
        self.wal_recorded = end

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        """Checkpoints the WAL into the database and records the pages it wrote."""
        self.capture_commit()
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise CaptureError(f"{self.db_path}: wal_checkpoint(TRUNCATE) was blocked")
        size = self._size(self.db_path)
        if size < self.db_recorded or not self.page_size:
            self._record_whole_db()
        else:
            fnode = self.recorder.fnode_of(self.db_name)
            assert fnode is not None
            fd = os.open(self.db_path, os.O_RDONLY)
            try:
                for first, count in _runs(sorted(self._pages)):
                    offset = (first - 1) * self.page_size
                    data = os.pread(fd, count * self.page_size, offset)
                    self.recorder.write_at(fnode, data, offset)
            finally:
                os.close(fd)
            self.db_recorded = max(self.db_recorded, size)
        self._new_wal()
        self.checkpoints += 1


def _runs(pages: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p in pages:
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out

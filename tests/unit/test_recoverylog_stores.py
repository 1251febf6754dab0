"""Round trips of the embedded stores through the recovery log: at every commit point, the
log replayed into an empty directory opens to exactly the committed contents.

RocksDB runs with tiny memtables, level-0 compaction after two files and a second thread
compacting at random, so commit points fall during background flushes and compactions; SQLite
runs with a small page cache (rolled-back transactions spill frames), VACUUM now and then, and
a small checkpoint threshold, so commit points follow store checkpoints and rebases. The log is
an in-memory journal here (the broker path is covered by the integration tests); playback is
the real FSM and playback rules, re-enacted into real files.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
import rocksdict
from test_recoverylog_fsm import LOG, MemLog

from gazette.consumer.stores.json_file import JSONFileStore
from gazette.consumer.stores.recorded import StoreOptionError
from gazette.consumer.stores.rocksdb import RocksDBStore
from gazette.consumer.stores.sqlite import SQLiteStore
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.recoverylog import FSM, FSMHints, Recorder
from gazette.recoverylog import capture as capture_module
from gazette.recoverylog.player import apply_for_playback


def replay(log: MemLog, upto: int, into: Path) -> None:
    """Plays ``log`` up to offset ``upto`` into ``into`` (fnodes staged, then linked)."""
    fsm = FSM.from_hints(FSMHints(log=LOG))
    staged = into / ".fnodes"
    staged.mkdir(parents=True)
    for e in log.entries:
        if e.offset >= upto:
            break
        if not apply_for_playback(fsm, e.op, e.message, e.offset):
            continue
        if e.op.HasField("create"):
            (staged / str(e.op.seq_no)).touch()
        elif e.op.HasField("write"):
            with open(staged / str(e.op.write.fnode), "r+b") as f:
                f.seek(e.op.write.offset)
                f.write(e.data)
        elif e.op.HasField("unlink") and e.op.unlink.fnode not in fsm.live_nodes:
            (staged / str(e.op.unlink.fnode)).unlink()
    for fnode, node in fsm.live_nodes.items():
        for path in node.links:
            os.link(staged / str(fnode), into / path.lstrip("/"))
        (staged / str(fnode)).unlink()
    staged.rmdir()


async def commit(store: RocksDBStore | SQLiteStore | JSONFileStore, rec: Recorder, log: MemLog, n: int) -> int:
    cp = pc.Checkpoint()
    cp.sources["in"].read_through = n
    async def to_log(chunks: list[bytes | memoryview]) -> pb.AppendResponse:
        begin = log.head
        log.append(b"".join(bytes(c) for c in chunks))
        return pb.AppendResponse(commit=pb.Fragment(journal=LOG, begin=begin, end=log.head))
    rec.append_via = to_log
    await store.start_commit(None, cp, [])  # type: ignore[arg-type]
    return log.head


def recorder(directory: Path) -> Recorder:
    return Recorder(None, LOG, FSM(LOG), 1, str(directory))  # type: ignore[arg-type]


@pytest.mark.parametrize("watched", [True, False], ids=["inotify", "scan-only"])
async def test_rocksdb_every_commit_point_replays(tmp_path: Path, watched: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(7)
    rec = recorder(tmp_path / "db")
    os.makedirs(rec.dir)
    if not watched:  # as where inotify is missing or its instances ran out: every capture scans
        monkeypatch.setattr(capture_module, "_watch", lambda directory: None)
    store = RocksDBStore(rec, options={"write_buffer_size": 16 << 10, "level_zero_file_num_compaction_trigger": 2,
                                       "max_background_jobs": 4})
    log = MemLog()
    stop = threading.Event()

    def compactor() -> None:
        while not stop.wait(rnd.random() * 0.02):
            store.db.compact_range(None, None, rocksdict.CompactOptions())

    model: dict[bytes, bytes] = {}
    points: list[tuple[int, dict[bytes, bytes]]] = []
    t = threading.Thread(target=compactor)
    t.start()
    try:
        for n in range(1, 151):
            for _ in range(rnd.randint(1, 60)):
                k = b"k%04d" % rnd.randrange(400)
                if rnd.random() < 0.15:
                    store.delete(k)
                    model.pop(k, None)
                else:
                    v = rnd.randbytes(rnd.randint(10, 200))
                    store.put(k, v)
                    model[k] = v
            if rnd.random() < 0.1:
                store.db.flush(False)
            points.append((await commit(store, rec, log, n), dict(model)))
    finally:
        stop.set()
        t.join()
    sst_unlinks = [e for e in log.entries if e.op.HasField("unlink") and e.op.unlink.path.endswith(".sst")]
    assert len(sst_unlinks) >= 3  # compactions replaced SSTs while commit points were taken
    assert store.capture is not None
    if watched:  # both paths ran: appends read without a scan, and scans on new versions
        assert 0 < store.capture.scans < 150, store.capture.scans
    else:
        assert store.capture.scans == 151  # opening, then every commit
    for i, (upto, want) in enumerate(points):
        d = tmp_path / f"replay-{i}"
        replay(log, upto, d)
        db = rocksdict.Rdict(str(d), rocksdict.Options(raw_mode=True))
        try:
            got = {bytes(k): bytes(v) for k, v in db.items() if k != b"\x00gazette.checkpoint"}
            cp = pc.Checkpoint.FromString(bytes(db[b"\x00gazette.checkpoint"]))
        finally:
            db.close()
        assert got == want, f"commit point {i + 1}"
        assert cp.sources["in"].read_through == i + 1
        shutil.rmtree(d)
    store.destroy()


@pytest.mark.parametrize(("seed", "page_size"), [(1, None), (2, 1024)])
async def test_sqlite_every_commit_point_replays(tmp_path: Path, seed: int, page_size: int | None) -> None:
    rnd = random.Random(seed)
    rec = recorder(tmp_path / "db")
    os.makedirs(rec.dir)
    store = SQLiteStore(rec, checkpoint_bytes=64 << 10, page_size=page_size)
    assert store.conn.execute("PRAGMA page_size").fetchone()[0] == (page_size or 4096)
    store.conn.execute("PRAGMA cache_size=10")
    store.conn.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB, tag TEXT)")
    store.conn.execute("CREATE INDEX kv_tag ON kv (tag)")
    log = MemLog()
    model: dict[int, bytes] = {}
    points: list[tuple[int, dict[int, bytes]]] = []
    for n in range(1, 121):
        if rnd.random() < 0.2:  # a transaction that spills and rolls back
            for _ in range(50):
                store.conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)",
                                   (rnd.randrange(2000), rnd.randbytes(300), str(rnd.random())))
            store.conn.rollback()
        for _ in range(rnd.randint(1, 40)):
            k = rnd.randrange(2000)
            if rnd.random() < 0.2:
                store.conn.execute("DELETE FROM kv WHERE k = ?", (k,))
                model.pop(k, None)
            else:
                v = rnd.randbytes(rnd.randint(10, 400))
                store.conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (k, v, str(rnd.random())))
                model[k] = v
        if rnd.random() < 0.03:
            await commit(store, rec, log, n)
            store.conn.execute("VACUUM")
        points.append((await commit(store, rec, log, n), dict(model)))
    assert store.capture is not None and store.capture.checkpoints > 0
    for i, (upto, want) in enumerate(points):
        d = tmp_path / f"replay-{i}"
        replay(log, upto, d)
        conn = sqlite3.connect(d / "db.sqlite")
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            got = dict(conn.execute("SELECT k, v FROM kv").fetchall())
            cp = pc.Checkpoint.FromString(conn.execute("SELECT checkpoint FROM gazette_checkpoint").fetchone()[0])
        finally:
            conn.close()
        assert got == want, f"commit point {i + 1}"
        assert cp.sources["in"].read_through == i + 1
        shutil.rmtree(d)
    store.destroy()


def test_stores_refuse_options_that_break_capture(tmp_path: Path) -> None:
    rec = recorder(tmp_path / "r")
    os.makedirs(rec.dir)
    with pytest.raises(StoreOptionError, match="recycle_log_file_num=4 is refused: recycled WAL"):
        RocksDBStore(rec, options={"recycle_log_file_num": 4})
    with pytest.raises(StoreOptionError, match="page_size 1000 is not a power of two"):
        SQLiteStore(rec, page_size=1000)
    store = SQLiteStore(rec)
    store.conn.execute("PRAGMA wal_autocheckpoint=1000")
    with pytest.raises(StoreOptionError, match="PRAGMA wal_autocheckpoint is 1000, but recording needs 0"):
        store.start_commit(None, pc.Checkpoint(), [])  # type: ignore[arg-type]
    store.destroy()
    assert not os.path.exists(rec.dir)


async def test_json_file_store_every_commit_point_replays(tmp_path: Path) -> None:
    rnd = random.Random(3)
    rec = recorder(tmp_path / "js")
    store = JSONFileStore(recorder=rec)
    log = MemLog()
    for n in range(1, 30):
        for _ in range(rnd.randrange(1, 5)):
            store.state[f"k{rnd.randrange(10)}"] = rnd.randrange(1000)
        if rnd.random() < 0.2:
            store.state.pop(next(iter(store.state)), None)
        want = dict(store.state)
        head = await commit(store, rec, log, n)
        into = tmp_path / f"replay-{n}"
        replay(log, head, into)
        assert sorted(os.listdir(into)) == ["state.json"]  # next.json was renamed over it
        again = JSONFileStore(into)
        assert again.state == want and again.checkpoint.sources["in"].read_through == n

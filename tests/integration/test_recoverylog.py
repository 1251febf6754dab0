"""Recovery logs on a real broker: the recorder's fenced appends, the player's recovery into an
empty directory and hand-off (which fences the previous owner), hints in etcd, and shards on
RocksDBStore and SQLiteStore that recover their state from the log when they restart."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import rocksdict
from consumer_support import derived_docs, journal_tree, journals_yaml, shards_yaml

from gazette.client import JournalClient, append
from gazette.consumer.stores.json_file import JSONFileStore
from gazette.consumer.stores.rocksdb import RocksDBStore
from gazette.consumer.stores.sqlite import SQLiteStore
from gazette.journalspace import apply_request as journal_apply_request
from gazette.message import Envelope, JSONMessage
from gazette.message.uuid import ACK_TXN, get_flags
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import (
    FSM,
    FSMHints,
    LogFencedError,
    PlaybackError,
    Player,
    Recorder,
    new_author,
    take_over,
)
from gazette.recoverylog.player import PlaybackProgress
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix

RECOVERY_YAML = ("name: recovery/\nreplication: 1\nlabels:\n- name: content-type\n"
                 "  value: application/x-gazette-recoverylog\nfragment:\n  length: 262144\n"
                 "  compression_codec: NONE\n  stores: [file:///]\n  refresh_interval: 1s\n"
                 "children:\n")


def _exists(path: str) -> bool:
    return os.path.exists(path)


def recovery_yaml(*logs: str) -> str:
    return RECOVERY_YAML + "".join(f"- name: recovery/{name}\n" for name in logs)


async def _record(store: RocksDBStore, rec: Recorder, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        for j in range(100):
            store.put(b"k%05d" % (i * 100 + j % 300), b"v%d" % i)
        cp = pc.Checkpoint()
        cp.sources["in"].read_through = i + 1
        await store.start_commit(None, cp, [])  # type: ignore[arg-type]
        if i % 50 == 49:
            store.db.flush(True)


@pytest.mark.timeout(120)
async def test_recover_into_empty_dir_hand_off_fences_the_old_owner(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_broker("a")
    async with JournalClient(cluster.address) as client:
        await client.apply(journal_apply_request(recovery_yaml("rocks")))
        log = "recovery/rocks"
        # A first owner takes over an empty log (as a new shard does) and records.
        rec1 = await take_over(Player(client, FSMHints(log=log), str(tmp_path / "one")))
        store1 = RocksDBStore(rec1)
        await _record(store1, rec1, 200)
        hints = rec1.build_hints()
        await _record(store1, rec1, 20, start=200)  # more, beyond the hints
        want = dict(store1.items())

        # A new owner recovers from the hints into an empty directory, reporting progress.
        seen: list[PlaybackProgress] = []
        p2 = Player(client, FSMHints.from_json(hints.to_json()), str(tmp_path / "two"),
                    on_progress=seen.append, progress_interval=0.0)
        a2 = new_author()
        task = asyncio.ensure_future(p2.play())
        await asyncio.wait_for(p2.tailing.wait(), 30)
        p2.inject_handoff(a2)
        fsm2 = await task
        assert not _exists(os.path.join(p2.dir, ".fnodes"))
        assert seen and seen[-1].remaining_bytes == 0 and seen[-1].read_bytes > 0
        rec2 = Recorder(client, log, fsm2, a2, p2.dir, write_head=p2.write_head)
        store2 = RocksDBStore(rec2)
        assert dict(store2.items()) == want
        assert store2.restore_checkpoint(None).sources["in"].read_through == 220  # type: ignore[arg-type]

        # The zombie's next commit is refused, and it stays refused.
        store1.put(b"zombie", b"1")
        with pytest.raises(LogFencedError, match="fenced by another author"):
            await store1.start_commit(None, pc.Checkpoint(), [])  # type: ignore[arg-type]
        await _record(store2, rec2, 10, start=220)
        want = dict(store2.items())

        # Playback from scratch yields the new owner's history, without the zombie's write.
        p3 = Player(client, FSMHints(log=log), str(tmp_path / "three"))
        task = asyncio.ensure_future(p3.play())
        p3.finish_at_write_head()
        fsm3 = await task
        assert sorted(fsm3.links) == sorted(rec2.fsm.links)
        db = rocksdict.Rdict(p3.dir, rocksdict.Options(raw_mode=True))
        try:
            assert {bytes(k): bytes(v) for k, v in db.items() if k != b"\x00gazette.checkpoint"} == want
        finally:
            db.close()
        store1.db.close()
        store2.destroy()


@pytest.mark.timeout(120)
async def test_corrupt_log_fails_playback_naming_the_offset(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_broker("a")
    async with JournalClient(cluster.address) as client:
        await client.apply(journal_apply_request(recovery_yaml("bad")))
        log = "recovery/bad"
        rec = Recorder(client, log, FSM(log), 9, str(tmp_path / "s"))
        rec.write_at(rec.create("/f"), b"data", 0)
        await rec.flush()
        head = rec.write_head
        await append(client, log, b"\x66\x33\x93\x36\x05\x00\x00\x00garbage")  # a bad op
        player = Player(client, FSMHints(log=log), str(tmp_path / "p"))
        player.finish_at_write_head()
        with pytest.raises(PlaybackError, match=f"recovery log {log} at offset {head}: not a RecordedOp"):
            await player.play()
        assert not _exists(player.dir)  # nothing partially recovered is left


class StoreCountingApp:
    """Counts messages by key in an embedded store chosen by the shard's ``store`` label."""

    def __init__(self) -> None:
        self.recovered_hints: dict[str, list[FSMHints | None]] = {}  # seen by new_store, by shard

    def new_store(self, shard: Any, recorder: Any) -> Any:
        self.recovered_hints.setdefault(shard.spec.id, []).append(shard.recovered_hints)
        kind = {lbl.name: lbl.value for lbl in shard.spec.labels.labels}.get("store", "rocksdb")
        if kind == "sqlite":
            store = SQLiteStore(recorder)
            store.conn.execute("CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n INTEGER)")
            return store
        if kind == "json":
            return JSONFileStore(recorder=recorder)
        return RocksDBStore(recorder)

    def new_message(self, spec: Any) -> type[JSONMessage]:
        return JSONMessage

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Any) -> None:
        if get_flags(env.message.get_uuid()) == ACK_TXN:
            return
        key = env.message.doc["key"]
        if isinstance(store, SQLiteStore):
            store.conn.execute("INSERT INTO counts VALUES (?, 1) ON CONFLICT (k) DO UPDATE SET n = n + 1", (key,))
        elif isinstance(store, JSONFileStore):
            store.state[key] = store.state.get(key, 0) + 1
        else:
            store.put(key.encode(), b"%d" % (int(store.get(key.encode(), b"0")) + 1))

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


def counts_of(store: Any) -> dict[str, int]:
    if isinstance(store, SQLiteStore):
        return dict(store.conn.execute("SELECT k, n FROM counts").fetchall())
    if isinstance(store, JSONFileStore):
        return dict(store.state)
    return {k.decode(): int(v) for k, v in store.items()}


@pytest.mark.timeout(180)
async def test_shards_recover_their_embedded_stores_from_the_log(gazette_consumer: Any) -> None:
    ids = ("count-000", "count-001", "count-002")  # RocksDB, SQLite and JSON file stores
    journals = journals_yaml("part-000", "part-001", "part-002") + "\n---\n" + recovery_yaml(*ids)
    shards = shards_yaml("part-000", "part-001", "part-002",
                         common="  recovery_log_prefix: recovery\n  hint_prefix: /gazette/hints\n"
                                "  hint_backups: 2\n")
    for sid, kind in (("count-001", "sqlite"), ("count-002", "json")):
        shards = shards.replace(f"- id: {sid}\n", f"- id: {sid}\n  labels:\n  - name: store\n    value: {kind}\n")
    app = StoreCountingApp()
    async with gazette_consumer(app, journals=journals, shards=shards) as h:
        for round_ in range(3):
            await h.append_lines("in/part-000", [{"key": k} for k in "aab"] * 10)
            await h.append_lines("in/part-001", [{"key": k} for k in "xyy"] * 10)
            await h.append_lines("in/part-002", [{"key": k} for k in "pq"] * 10)
            await h.read_through()
            wants = [{"a": 20 * (round_ + 1), "b": 10 * (round_ + 1)},
                     {"x": 10 * (round_ + 1), "y": 20 * (round_ + 1)},
                     {"p": 10 * (round_ + 1), "q": 10 * (round_ + 1)}]
            assert [counts_of(h.store(s)) for s in ids] == wants
            dirs = [h.runtime(s).recorder.dir for s in ids]  # type: ignore[union-attr]
            # The shards restart: their stores come back from the recovery log alone.
            await h.shards.unassign(list(ids))  # type: ignore[union-attr]
            await h.wait_serving()
            assert all(h.runtime(s).recorder.dir not in dirs for s in ids)  # type: ignore[union-attr]
            assert all(not _exists(d) for d in dirs)
            assert [counts_of(h.store(s)) for s in ids] == wants
        # new_store saw the hints each start recovered from (docs/consumers.md: Shard members):
        # the log's, empty at the first start, then naming the files the restarts played back.
        for sid in ids:
            seen = app.recovered_hints[sid]
            assert len(seen) == 4 and all(r is not None and r.log == f"recovery/{sid}" for r in seen), seen
            assert all(r is not None and r.live_nodes for r in seen[1:]), seen
        hints = await h.shards.get_hints("count-001")  # type: ignore[union-attr]
        assert hints.status == pc.Status.OK and hints.primary_hints.hints.log == "recovery/count-001"
        assert len(hints.backup_hints) == 2 and all(b.hints.live_nodes for b in hints.backup_hints)
        assert json.loads(FSMHints.from_proto(hints.primary_hints.hints).to_json())["live_nodes"]


def _rocks_items(path: str) -> dict[bytes, bytes]:
    db = rocksdict.Rdict(path, access_type=rocksdict.AccessType.read_only())
    try:
        return {bytes(k): bytes(v) for k, v in db.items()}
    finally:
        db.close()


async def _persisted(client: Any, log: str) -> None:
    """Waits (on the broker's listing) until every fragment of ``log`` but the open one is
    persisted: prune deletes only what is in a fragment store."""
    async with asyncio.timeout(60):
        while True:
            frags = (await client.list_fragments(log)).fragments
            if len(frags) > 1 and all(f.spec.backing_store for f in frags[:-1]):
                return
            await asyncio.sleep(0.2)  # polling the broker's persister, not synchronisation


def _fragment_files(root: Path, log: str) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and f"/{log}/" in p.as_posix())


@pytest.mark.timeout(240)
async def test_gazctl_recovers_a_shard_store_and_prunes_its_log(gazette_consumer: Any, tmp_path: Path) -> None:
    """``gazctl shards recover`` plays the log to a directory matching the live store;
    ``gazctl shards prune`` deletes the fragments no hints need (compactions made most of the
    log dead), and the shard still recovers its exact state from what is left."""
    journals = journals_yaml("part-000") + "\n---\n" + recovery_yaml("count-000").replace(
        "length: 262144", "length: 65536")
    # (hints under a prefix of this test's own: etcd outlives each test's broker)
    shards = shards_yaml("part-000", common=f"  recovery_log_prefix: recovery\n  hint_prefix: {unique_prefix('/hints')}\n"
                                            "  hint_backups: 1\n")
    app = StoreCountingApp()
    async with gazette_consumer(app, journals=journals, shards=shards) as h:
        assert h.cluster is not None and h.shards is not None
        env = {"CONSUMER_ADDRESS": h.processes[0].endpoint}
        for round_ in range(6):  # each round: writes, a flush and a compaction of the whole DB
            if round_ == 3:  # a restart: the reopened DB starts a new MANIFEST, so the files
                await h.shards.unassign(["count-000"])  # live after the next compaction were
                await h.wait_serving()  # all written after it
            await h.append_lines("in/part-000", [{"key": f"k{i % 400:03d}" + "-" * 200} for i in range(2000)])
            await h.read_through()
            store = h.store("count-000")
            store.db.flush(True)
            store.db.compact_range(None, None)
        await h.append_lines("in/part-000", [{"key": "last"}])
        await h.read_through()
        want = counts_of(h.store("count-000"))
        assert want["last"] == 1 and sum(want.values()) == 12001 and len(want) == 401

        # recover: an existing non-empty --dir is refused; an empty one gets the live store.
        (tmp_path / "busy").mkdir()
        (tmp_path / "busy" / "f").write_text("x")
        rc, _, err = await asyncio.to_thread(h.cluster.gazctl, "shards", "recover", "--id", "count-000", "--dir", str(tmp_path / "busy"), env=env)
        assert rc == 1 and "--dir exists and is not an empty directory" in err
        rc, _, err = await asyncio.to_thread(h.cluster.gazctl, "shards", "recover", "--id", "nope", "--dir", str(tmp_path / "r0"), env=env)
        assert rc == 1 and "no shard exists with the given id" in err
        rc, _, err = await asyncio.to_thread(h.cluster.gazctl, "shards", "recover", "--id", "count-000", "--dir", str(tmp_path / "r1"), env=env)
        assert rc == 0, err
        assert "recovered shard store" in err and "playing recovery log" in err
        recovered = {k.decode(): int(v) for k, v in _rocks_items(str(tmp_path / "r1")).items()
                     if not k.startswith(b"\x00")}
        assert recovered == want

        # prune: write the shard's hints now (they name only live files), then prune.
        rt = h.runtime("count-000")
        assert rt is not None and rt.recorder is not None and rt.hints is not None
        # (pushed into the backup, too: the one from the shard's first recovery had no files).
        assert await rt.hints.store_recovered(rt.recorder.build_hints(), rt.assignment)
        await _persisted(h.client, "recovery/count-000")
        before = _fragment_files(h.cluster.file_root, "recovery/count-000")
        rc, _, err = await asyncio.to_thread(h.cluster.gazctl, "shards", "prune", "-l", "id=count-000", "--dry-run",
                                      "--file-root", str(h.cluster.file_root), env=env)
        assert rc == 0, err
        assert _fragment_files(h.cluster.file_root, "recovery/count-000") == before
        rc, _, err = await asyncio.to_thread(h.cluster.gazctl, "shards", "prune", "-l", "id=count-000",
                                      "--file-root", str(h.cluster.file_root), env=env)
        assert rc == 0, err
        after = _fragment_files(h.cluster.file_root, "recovery/count-000")
        assert len(after) < len(before), err
        print(f"\nprune: {len(before)} → {len(after)} recovery-log fragments")

        # The shard restarts from the pruned log with its exact state.
        await h.shards.unassign(["count-000"])
        await h.wait_serving()
        assert counts_of(h.store("count-000")) == want


@pytest.mark.timeout(120)
async def test_a_corrupt_log_fails_the_shard_naming_the_offset(gazette_consumer: Any) -> None:
    """A shard whose recovery log holds a corrupt op goes FAILED with an error naming the log
    and offset, and never serves a partially recovered store."""
    journals = journals_yaml("part-000") + "\n---\n" + recovery_yaml("count-000")
    shards = shards_yaml("part-000", common="  recovery_log_prefix: recovery\n"
                                            f"  hint_prefix: {unique_prefix('/hints')}\n")
    async with gazette_consumer(StoreCountingApp(), journals=journals, shards=shards) as h:
        assert h.client is not None and h.shards is not None
        await h.append_lines("in/part-000", [{"key": "a"}] * 10)
        await h.read_through()
        bad = (await append(h.client, "recovery/count-000", b"\x66\x33\x93\x36\x05\x00\x00\x00garbage")).commit
        await h.shards.unassign(["count-000"])

        async def failed() -> pc.ReplicaStatus | None:
            (sh,) = (await h.shards.list()).shards  # type: ignore[union-attr]
            return next((st for st in sh.status if st.code == pc.ReplicaStatus.FAILED), None)

        async with asyncio.timeout(60):
            while True:
                status = await failed()
                if status is not None:
                    break
                await asyncio.sleep(0.1)  # polling the shard's status through the Shard API
        assert f"recovery log recovery/count-000 at offset {bad.begin}: not a RecordedOp" in status.errors[0]
        assert h.runtime("count-000") is None  # nothing serves


class PublishingCountingApp(StoreCountingApp):
    """StoreCountingApp that also publishes each input's key to one journal all shards share."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[str, list[str]] = {}

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Any) -> None:
        super().consume_message(shard, store, env, pub)
        if get_flags(env.message.get_uuid()) != ACK_TXN:
            self.pending.setdefault(shard.spec.id, []).append(env.message.doc["key"])

    async def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:  # type: ignore[override]
        keys = self.pending.pop(shard.spec.id, [])
        if keys:
            await pub.publish_uncommitted_many(lambda m: ("out/all", "application/x-ndjson"),
                                               [JSONMessage(key=k) for k in keys])


@pytest.mark.timeout(120)
async def test_a_fenced_shard_fails_alone(gazette_consumer: Any, tmp_path: Path) -> None:
    """Two shards of one process publish to one journal; one shard's recovery log is taken over
    by another owner (as a new primary's hand-off does). Its next commit is fenced and the shard
    goes FAILED; the other shard goes on committing and publishing to the shared journal (its
    appends do not inherit the fenced shard's failed ones)."""
    journals = (journals_yaml("part-000", "part-001") + "\n---\n" + recovery_yaml("count-000", "count-001")
                + "\n---\n" + journal_tree("out/", "application/x-ndjson", "all"))
    shards = shards_yaml("part-000", "part-001", common="  recovery_log_prefix: recovery\n"
                                                        f"  hint_prefix: {unique_prefix('/hints')}\n")
    async with gazette_consumer(PublishingCountingApp(), journals=journals, shards=shards) as h:
        assert h.client is not None and h.shards is not None
        await h.append_lines("in/part-000", [{"key": "a"}] * 5)
        await h.append_lines("in/part-001", [{"key": "x"}] * 5)
        await h.read_through()
        # Another owner takes the log of count-000 over: the running shard is now a zombie.
        usurper = await take_over(Player(h.client, FSMHints(log="recovery/count-000"), str(tmp_path / "usurper")))
        for round_ in range(1, 4):
            await h.append_lines("in/part-000", [{"key": "a"}] * 5)
            await h.append_lines("in/part-001", [{"key": "x"}] * 5)
            await h.read_through(["count-001"])
            assert counts_of(h.store("count-001")) == {"x": 5 + 5 * round_}

        async def status(sid: str) -> pc.ReplicaStatus:
            (sh,) = [s for s in (await h.shards.list()).shards if s.spec.id == sid]  # type: ignore[union-attr]
            return sh.status[0]

        async with asyncio.timeout(60):
            while True:
                if (await status("count-000")).code == pc.ReplicaStatus.FAILED:
                    break
                await asyncio.sleep(0.1)  # polling the shard's status through the Shard API
        assert "fenced by another author" in (await status("count-000")).errors[0]
        assert (await status("count-001")).code == pc.ReplicaStatus.PRIMARY
        await h.append_lines("in/part-001", [{"key": "x"}] * 5)
        await h.read_through(["count-001"])
        assert counts_of(h.store("count-001")) == {"x": 25}
        keys = [d["key"] for d in await derived_docs(h.client)]
        assert keys.count("x") == 25 and keys.count("a") == 5
        usurper.fsm  # noqa: B018 - held until here: the log stays taken over

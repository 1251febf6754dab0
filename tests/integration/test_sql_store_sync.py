"""SyncSQLStore (a synchronous SQLAlchemy ``Engine``, plain callbacks) on real PostgreSQL and
SQLite files: the same fencing as SQLStore (a zombie's commit fails whole), commits applied in
order, the store's own I/O off the event loop (the loop keeps running while a commit waits on
a lock), no deadlock when consecutive transactions of the real transaction loop update the same
row, and a synchronous app end to end under the consumer harness."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from consumer_support import journals_yaml, shards_yaml
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import create_async_engine

from gazette.client import AppendService
from gazette.consumer.errors import ConsumerError
from gazette.consumer.stores.sql import (
    CheckpointFencedError,
    EngineKindError,
    PreviousCommitFailed,
    SQLStore,
    SyncSQLStore,
)
from gazette.consumer.transaction import TransactionLoop, TxnConfig
from gazette.message import Envelope, JSONMessage, ProducerState, Publisher
from gazette.message.publisher import AckIntent
from gazette.message.uuid import ACK_TXN, get_flags
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.eventually import eventually

FQN = "/gazette/consumers/test/items/shard-000"
DEADLINE = 60.0  # generous: a busy 2-core machine
DOC = Path(__file__).resolve().parents[2] / "docs" / "consumers.md"


class _Shard:
    fqn = FQN


def _cp(offset: int) -> pc.Checkpoint:
    cp = pc.Checkpoint()
    cp.sources["in/part-000"].read_through = offset
    return cp


def _postgres_engine(dsn: str) -> Engine:
    # A bounded lock wait: a regression that blocks the loop on a row lock fails, not hangs.
    return create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1),
                         connect_args={"options": "-c lock_timeout=30s"})


@pytest.fixture(params=["postgres", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "postgres":
        eng = _postgres_engine(request.getfixturevalue("postgres_dsn"))
    else:
        eng = create_engine(f"sqlite:///{tmp_path / 'store.sqlite'}", connect_args={"timeout": 30.0})
    SyncSQLStore.create_tables(eng)
    with eng.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS counts"))
        conn.execute(text("CREATE TABLE counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL)"))
        conn.execute(text("DELETE FROM gazette_checkpoints"))
    yield eng
    eng.dispose()


def _count(store: SyncSQLStore, key: str) -> None:
    conn = store.connection()
    if conn.execute(text("UPDATE counts SET n = n + 1 WHERE k = :k"), {"k": key}).rowcount == 0:
        conn.execute(text("INSERT INTO counts (k, n) VALUES (:k, 1)"), {"k": key})


def _counts(engine: Engine, query: str = "SELECT k, n FROM counts") -> dict[str, int]:
    with engine.connect() as conn:
        return {k: n for k, n in conn.execute(text(query)).all()}


async def _read_through(engine: Engine) -> int:
    store = SyncSQLStore(engine)
    try:
        return (await store.restore_checkpoint(_Shard())).sources["in/part-000"].read_through  # type: ignore[arg-type]
    finally:
        store.destroy()


async def _until(cond: Any, what: str, run: asyncio.Task[None] | None = None) -> None:
    """Waits for ``cond`` (with a deadline); a failed ``run`` raises its error at once."""

    def met() -> bool:
        if run is not None and run.done():
            run.result()
            raise AssertionError(f"the transaction loop ended before: {what}")
        return bool(cond())

    await eventually(met, what, DEADLINE, interval=0.001)


async def test_commit_restore_and_fence(engine: Engine) -> None:
    shard: Any = _Shard()
    a = SyncSQLStore(engine)
    assert await a.restore_checkpoint(shard) == pc.Checkpoint()
    _count(a, "x")
    await a.start_commit(shard, _cp(100), [])
    assert _counts(engine) == {"x": 1}

    # A commit waits for its appends.
    _count(a, "x")
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = a.start_commit(shard, _cp(200), [dep])
    await asyncio.sleep(0)
    assert not commit.done()
    dep.set_result(None)
    await commit
    assert _counts(engine) == {"x": 2}

    # A new primary restores: it sees the checkpoint and moves the fence.
    b = SyncSQLStore(engine)
    assert (await b.restore_checkpoint(shard)).sources["in/part-000"].read_through == 200
    assert b.fence == a.fence + 1

    # The zombie's next commit fails, and its writes are rolled back with it.
    _count(a, "x")
    _count(a, "zombie")
    with pytest.raises(CheckpointFencedError):
        await a.start_commit(shard, _cp(300), [])
    assert _counts(engine) == {"x": 2}

    # The new primary commits on.
    _count(b, "y")
    await b.start_commit(shard, _cp(300), [])
    assert _counts(engine) == {"x": 2, "y": 1}
    assert await _read_through(engine) == 300
    for s in (a, b):
        s.destroy()


async def test_engine_of_the_other_kind(tmp_path: Path) -> None:
    sync, aio = create_engine(f"sqlite:///{tmp_path / 'a'}"), create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'a'}")
    with pytest.raises(EngineKindError, match="use SyncSQLStore"):
        SQLStore(sync)  # type: ignore[arg-type]
    with pytest.raises(EngineKindError, match="use SQLStore"):
        SyncSQLStore(aio)  # type: ignore[arg-type]
    store = SyncSQLStore(sync)
    store.destroy()
    with pytest.raises(ConsumerError, match="destroyed"):
        store.connection()
    await aio.dispose()
    sync.dispose()


async def test_first_checkpoint_races(engine: Engine) -> None:
    """Two primaries of a new shard: the second to insert the first checkpoint is fenced."""
    shard: Any = _Shard()
    a, b = SyncSQLStore(engine), SyncSQLStore(engine)
    # b read no row (fence 0) before a's restore inserted the shard's first checkpoint row:
    # b's first commit inserts too, and must fail whole.
    assert await a.restore_checkpoint(shard) == pc.Checkpoint()
    assert b.fence == 0
    _count(b, "b")
    with pytest.raises(CheckpointFencedError):
        await b.start_commit(shard, _cp(5), [])
    assert _counts(engine) == {}
    for s in (a, b):
        s.destroy()


async def test_failed_dependency_rolls_back(engine: Engine) -> None:
    shard: Any = _Shard()
    s = SyncSQLStore(engine)
    await s.restore_checkpoint(shard)
    _count(s, "x")
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    dep.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await s.start_commit(shard, _cp(1), [dep])
    assert _counts(engine) == {}
    s.destroy()


async def test_destroy_ends_the_worker_after_the_last_commit(engine: Engine) -> None:
    """A commit in flight when the shard leaves still completes (as with SQLStore); the open
    transaction is rolled back; then the store's worker thread ends."""
    shard: Any = _Shard()
    s = SyncSQLStore(engine)
    await s.restore_checkpoint(shard)
    workers = set(s._worker._threads)  # the stdlib executor's threads
    assert workers
    _count(s, "x")
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = s.start_commit(shard, _cp(10), [dep])
    if engine.dialect.name == "postgresql":  # (SQLite has one writer: the committing one)
        _count(s, "open")
    s.destroy()
    dep.set_result(None)
    await commit
    await _until(lambda: not any(t.is_alive() for t in workers), "the worker thread ends")
    assert _counts(engine) == {"x": 1}
    assert await _read_through(engine) == 10


@pytest.mark.parametrize("first_fails", [False, True])
async def test_pipelined_commits_apply_in_order(engine: Engine, first_fails: bool) -> None:
    """A second commit started while the first still waits for its appends applies after it
    (the checkpoint never goes back), and fails without applying if the first failed."""
    shard: Any = _Shard()
    s = SyncSQLStore(engine)
    await s.restore_checkpoint(shard)
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _count(s, "y")
    first = s.start_commit(shard, _cp(100), [dep])
    # Checkpoint only: a write here would wait on the first's locks (as the transaction loop
    # would not let it: prepare_txn), and on SQLite hold the only write lock the first needs.
    second = s.start_commit(shard, _cp(200), [])
    for _ in range(20):  # nothing the second waits for can resolve: it must stay pending
        await asyncio.sleep(0)
    assert not first.done() and not second.done()
    if first_fails:
        dep.set_exception(RuntimeError("append failed"))
        with pytest.raises(RuntimeError, match="append failed"):
            await first
        with pytest.raises(PreviousCommitFailed):
            await second
        assert _counts(engine) == {}
        assert await _read_through(engine) == 0
    else:
        dep.set_result(None)
        await second
        assert first.done() and first.exception() is None
        assert _counts(engine) == {"y": 1}
        assert await _read_through(engine) == 200
    s.destroy()


async def test_commit_waits_off_the_event_loop(engine: Engine, tmp_path: Path) -> None:
    """Another connection holds the lock the commit's checkpoint write needs: the commit waits
    for it on the store's worker thread while the event loop keeps running (a task keeps
    ticking; the test itself releases the lock from the loop), then completes."""
    shard: Any = _Shard()
    s = SyncSQLStore(engine)
    await s.restore_checkpoint(shard)

    writing = threading.Event()
    threads: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE GAZETTE_CHECKPOINTS"):
            threads.append(threading.current_thread().name)
            writing.set()

    event.listen(engine, "before_cursor_execute", before)
    blocker: Any
    if engine.dialect.name == "postgresql":
        blocker = engine.connect()
        blocker.begin()
        blocker.execute(text("SELECT fence FROM gazette_checkpoints WHERE shard_fqn = :f FOR UPDATE"), {"f": FQN})
    else:
        blocker = sqlite3.connect(str(tmp_path / "store.sqlite"), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the write lock

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        if engine.dialect.name == "postgresql":  # (SQLite has one writer: the blocker)
            _count(s, "x")
        commit = s.start_commit(shard, _cp(7), [])
        await _until(writing.is_set, "the commit writes its checkpoint")
        at_write = ticks
        await _until(lambda: ticks >= at_write + 2000, "the loop ticks while the commit waits")
        assert not commit.done()  # still waiting for the lock, yet the loop ran 2000 ticks
        blocker.rollback()
        await commit
    finally:
        task.cancel()
        event.remove(engine, "before_cursor_execute", before)
        blocker.close()
    assert threads and all(t.startswith("sql-store") for t in threads)
    assert await _read_through(engine) == 7
    s.destroy()


# -- the real transaction loop ------------------------------------------------------------------


class _Source:
    """Batches of one message each, put by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Sequence[Envelope] | None] = asyncio.Queue()
        self.offset = 0
        self.sequenced = 0

    def put(self) -> None:
        self.queue.put_nowait([Envelope("in/part-000", self.offset, self.offset + 10, JSONMessage(key="x"))])
        self.offset += 10

    async def read(self) -> Sequence[Envelope] | None:
        return await self.queue.get()

    async def sequence(self, batch: Sequence[Envelope]) -> Sequence[Envelope]:
        self.sequenced += 1
        return batch

    def has_pending(self) -> bool:
        return False

    def sequenced_through(self) -> Mapping[str, int]:
        return {"in/part-000": self.offset}

    def checkpoint(self, prune_horizon_ns: int) -> tuple[Mapping[str, int], Sequence[ProducerState]]:
        return {"in/part-000": self.offset}, []


class _SyncApp:
    """Plain callbacks: counts each message's key through the store's synchronous connection."""

    def __init__(self) -> None:
        self.consumed = 0

    def new_store(self, shard: Any, recorder: Any) -> SyncSQLStore:
        raise AssertionError("not used")

    def new_message(self, spec: Any) -> Any:
        return JSONMessage

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Any) -> None:
        _count(store, env.message.doc["key"])
        self.consumed += 1

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


class _Pub:
    def build_ack_intents(self) -> list[AckIntent]:
        return []


async def test_transaction_loop_consecutive_txns_same_row(engine: Engine) -> None:
    """Transaction 2 updates the row transaction 1 updated, while 1's commit still waits for
    its appends. A synchronous statement would wait on that row's lock (PostgreSQL) or the
    write lock (SQLite) holding the loop, which 1's appends need: the store holds transaction
    2's first message until 1 committed (``prepare_txn``), so neither waits on the other."""
    shard: Any = _Shard()
    store = SyncSQLStore(engine)
    await store.restore_checkpoint(shard)
    source, app = _Source(), _SyncApp()
    appends: list[asyncio.Future[None]] = []

    def pending_appends() -> Sequence[asyncio.Future[None]]:
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        appends.append(f)
        return [f]

    loop = TransactionLoop(shard, app, store, _Pub(), source,
                           config=TxnConfig(min_duration=0.0, max_duration=30.0),
                           write_acks=lambda intents, after: [], pending_appends=pending_appends)
    run = asyncio.create_task(loop.run())
    try:
        source.put()
        await _until(lambda: len(appends) == 1, "transaction 1 commits", run)
        source.put()
        await _until(lambda: source.sequenced == 2, "transaction 2 takes its message", run)
        for _ in range(20):
            await asyncio.sleep(0)
        assert app.consumed == 1  # held until 1 committed
        appends[0].set_result(None)
        await _until(lambda: len(appends) == 2, "transaction 2 commits", run)
        assert app.consumed == 2
        appends[1].set_result(None)
        source.queue.put_nowait(None)  # input ends: the loop returns once all resolved
        async with asyncio.timeout(DEADLINE):
            await run
    finally:
        run.cancel()
        store.destroy()
    assert _counts(engine) == {"x": 2}
    assert await _read_through(engine) == 20


# -- a synchronous app end to end -----------------------------------------------------------------


class _SyncCountingApp:
    """What a team with synchronous SQLAlchemy code writes: plain callbacks, one upsert per
    message through ``store.connection()``."""

    UPSERT = text("INSERT INTO sync_counts (k, n) VALUES (:k, 1) "
                  "ON CONFLICT (k) DO UPDATE SET n = sync_counts.n + 1")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def new_store(self, shard: Any, recorder: Any) -> SyncSQLStore:
        return SyncSQLStore(self.engine)

    def new_message(self, spec: Any) -> type[JSONMessage]:
        return JSONMessage

    def consume_message(self, shard: Any, store: SyncSQLStore, env: Envelope, pub: Any) -> None:
        if get_flags(env.message.get_uuid()) == ACK_TXN:
            return
        store.connection().execute(self.UPSERT, {"k": env.message.doc["key"]})

    def finalize_txn(self, shard: Any, store: SyncSQLStore, pub: Any) -> None:
        pass


@pytest.mark.timeout(180)
async def test_sync_app_end_to_end(gazette_consumer: Any, postgres_dsn: str) -> None:
    """A plain-callback app under the consumer harness (etcd, a broker, a consumer process)
    counts every message of several appends into PostgreSQL, one key throughout, so
    consecutive transactions update the same row; the checkpoint row commits with them."""
    engine = _postgres_engine(postgres_dsn)
    SyncSQLStore.create_tables(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS sync_counts"))
        conn.execute(text("CREATE TABLE sync_counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL)"))
        conn.execute(text("DELETE FROM gazette_checkpoints"))
    try:
        app = _SyncCountingApp(engine)
        async with gazette_consumer(app, journals=journals_yaml("part-000"),
                                    shards=shards_yaml("part-000")) as h:
            for i in range(8):
                await h.publish("in/part-000", *[{"key": "a"}] * 3, {"key": f"k{i % 2}"})
                await h.append_lines("in/part-000", [{"key": "a"}])
            await h.read_through()
            fqn = h.runtime("count-000").fqn
        counts = _counts(engine, "SELECT k, n FROM sync_counts")
        with engine.connect() as conn:
            fence, data = conn.execute(text("SELECT fence, checkpoint FROM gazette_checkpoints "
                                            "WHERE shard_fqn = :f"), {"f": fqn}).one()
        assert counts == {"a": 32, "k0": 4, "k1": 4}
        assert fence == 1  # one primary restored the shard
        assert pc.Checkpoint.FromString(bytes(data)).sources["in/part-000"].read_through > 0
    finally:
        engine.dispose()


@pytest.mark.timeout(180)
async def test_the_guides_sync_app_runs(gazette_consumer: Any, tmp_path: Path) -> None:
    """docs/consumers.md's "Synchronous SQL" app, as written, on a SQLite file."""
    doc = DOC.read_text()
    code = re.search(r"```python\n(# sync_wordcount.py\n.*?)```", doc, re.S)
    assert code is not None
    module = types.ModuleType("sync_wordcount")
    exec(compile(code.group(1), "sync_wordcount.py", "exec"), module.__dict__)  # noqa: S102 - our own doc
    engine = create_engine(f"sqlite:///{tmp_path / 'words.sqlite'}", connect_args={"timeout": 30.0})
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE words (w TEXT PRIMARY KEY, n INTEGER NOT NULL)"))
    try:
        app = module.SyncWordCount(engine)
        async with gazette_consumer(app, journals=journals_yaml("part-000"),
                                    shards=shards_yaml("part-000")) as h:
            for _ in range(3):
                await h.publish("in/part-000", {"word": "a"}, {"word": "b"}, {"word": "a"})
            # A producer's transaction, committed by its ACK: the app (receive_acks = False)
            # never sees the acknowledgement, which has no "word".
            assert h.client is not None
            async with AppendService(h.client) as svc:
                txn = Publisher(svc)
                for w in "cab":
                    await txn.publish_uncommitted(lambda m: ("in/part-000", "application/x-ndjson"),
                                                  JSONMessage(word=w))
                for intent in txn.build_ack_intents():
                    await svc.append(intent.journal, intent.intent)
                await svc.flush()
            await h.read_through()
        assert _counts(engine, "SELECT w, n FROM words") == {"a": 7, "b": 4, "c": 1}
    finally:
        engine.dispose()


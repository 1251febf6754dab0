"""SQL stores: a shard's state in a SQL database, committed atomically with its checkpoint, as
Gazette's ``store_sql.go``. Two front ends over one fencing implementation:

* ``SQLStore`` takes an ``AsyncEngine`` (PostgreSQL through psycopg 3, SQLite through
  aiosqlite) for ``async`` callbacks: ``conn = await store.transaction()``.
* ``SyncSQLStore`` takes a synchronous ``Engine`` (``postgresql+psycopg://...``,
  ``sqlite:///file``) for plain callbacks and existing synchronous SQLAlchemy code:
  ``conn = store.connection()`` is a ``sqlalchemy.Connection`` in the consumer transaction's
  SQL transaction. Its own I/O (restore, the checkpoint write, COMMIT, ROLLBACK, closing) runs
  on the store's one worker thread, never on the event loop; the app's statements run where
  the app calls them (a plain callback: on the loop, one round trip each, as any synchronous
  code in a callback).

The application does its work inside the consumer transaction's own SQL transaction (begun
on first use, on its own connection); the store commits it together with the checkpoint row
of ``gazette_checkpoints(shard_fqn, fence, checkpoint)``.

Invariants (both stores):

* ``restore_checkpoint`` bumps the shard's fence (``fence = fence + 1``) and remembers it.
  Every commit updates the checkpoint only ``WHERE fence = <remembered>``: once a newer
  primary restored, a zombie's commit updates no row, fails with ``CheckpointFencedError`` and is rolled
  back whole, its state changes with it (nothing of it becomes visible). The fencing is
  ``_restore`` and ``_write_checkpoint``, written once against a synchronous ``Connection``;
  ``SQLStore`` runs them through ``AsyncConnection.run_sync``.
* A commit first waits for every ``wait_for`` future (the transaction's appends); a failed
  one fails the commit, which is rolled back.
* ``start_commit`` takes the current SQL transaction synchronously: the next consumer
  transaction begins a new one while this one commits.

``SQLStore`` pipelines: the next transaction's statements run while the previous one commits
(an ``await`` on a row the commit still locks yields the loop, so the commit, which needs the
loop for its appends, completes). ``SyncSQLStore`` cannot: a synchronous statement waiting on
such a lock would hold the loop the commit needs, for good (PostgreSQL row locks) or until
SQLite's busy timeout. So it begins each transaction (``prepare_txn``, which the transaction
loop awaits before the first message reaches the app) only once the previous commit resolved;
its commits also apply strictly in order on its worker thread, a commit failing when the one
before it failed (its state was built on the failed one's). A synchronous app's callbacks may
still block the loop on locks other connections hold (a frozen zombie's transaction, another
app's): set ``lock_timeout``/``statement_timeout`` (PostgreSQL) or a busy ``timeout``
(SQLite) on the engine. SQLite needs a file database (``:memory:`` is per thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from gazette.consumer.errors import ConsumerError, MissingExtraError

try:
    from sqlalchemy import (
        Column,
        Connection,
        Engine,
        Integer,
        LargeBinary,
        MetaData,
        Table,
        Text,
        select,
        update,
    )
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
except ModuleNotFoundError as err:
    raise MissingExtraError(
        "SQLStore needs SQLAlchemy and a driver: pip install 'gazette[postgres]' (psycopg) or "
        "'gazette[sql-sqlite]' (aiosqlite)") from err

from gazette.consumer.interfaces import OpFuture, Shard
from gazette.protocol import consumer_pb2 as pc

__all__ = [
    "CHECKPOINTS",
    "CheckpointFencedError",
    "EngineKindError",
    "PreviousCommitFailed",
    "SQLStore",
    "SyncSQLStore",
]

_METADATA = MetaData()
CHECKPOINTS = Table(
    "gazette_checkpoints", _METADATA,
    Column("shard_fqn", Text, primary_key=True, nullable=False),
    Column("fence", Integer, nullable=False),
    Column("checkpoint", LargeBinary, nullable=False),
)
"""Gazette's checkpoint table."""

_P = ParamSpec("_P")
_T = TypeVar("_T")


class CheckpointFencedError(ConsumerError):
    """The checkpoint's fence moved: another primary restored this shard since. (Not the
    recovery log's ``LogFencedError``: that fence is the log's author.)"""



class EngineKindError(ConsumerError, TypeError):
    """An engine of the other kind: ``SQLStore`` takes an ``AsyncEngine``, ``SyncSQLStore`` an
    ``Engine``."""


class PreviousCommitFailed(ConsumerError):
    """A ``SyncSQLStore`` commit was not attempted: the one before it failed."""


# -- fencing: the one implementation, on a synchronous connection ------------------------------


def _restore(conn: Connection, fqn: str) -> tuple[int, bytes]:
    """Bumps the shard's fence in ``conn``'s transaction: (the fence now held, the checkpoint
    bytes); (0, empty) for a shard without a checkpoint row."""
    conn.execute(update(CHECKPOINTS).where(CHECKPOINTS.c.shard_fqn == fqn)
                 .values(fence=CHECKPOINTS.c.fence + 1))
    row = conn.execute(select(CHECKPOINTS.c.fence, CHECKPOINTS.c.checkpoint)
                       .where(CHECKPOINTS.c.shard_fqn == fqn)).first()
    return (0, b"") if row is None else (int(row[0]), bytes(row[1]))


def _write_checkpoint(conn: Connection, fqn: str, data: bytes, fence: int) -> int:
    """Writes the checkpoint in ``conn``'s transaction if ``fence`` still holds, and returns
    the fence now held; raises ``CheckpointFencedError`` (the caller rolls back) if it does not."""
    if fence == 0:  # the shard's first checkpoint: a racing primary's insert conflicts
        try:
            conn.execute(CHECKPOINTS.insert().values(shard_fqn=fqn, checkpoint=data, fence=1))
        except IntegrityError as err:
            raise CheckpointFencedError(f"checkpoint of {fqn} was created by another primary") from err
        return 1
    result = conn.execute(update(CHECKPOINTS)
                          .where(CHECKPOINTS.c.shard_fqn == fqn, CHECKPOINTS.c.fence == fence)
                          .values(checkpoint=data))
    if result.rowcount != 1:
        raise CheckpointFencedError(f"checkpoint fence of {fqn} was updated (by a new primary)")
    return fence


def _decode(data: bytes) -> pc.Checkpoint:
    cp = pc.Checkpoint()
    cp.ParseFromString(data)
    return cp


# -- asyncio ----------------------------------------------------------------------------------


class SQLStore:
    """See the module docstring. ``create_tables`` makes ``gazette_checkpoints`` if absent."""

    def __init__(self, engine: AsyncEngine) -> None:
        if not isinstance(engine, AsyncEngine):
            raise EngineKindError(f"SQLStore takes an AsyncEngine (create_async_engine), not {engine!r}; "
                                  "for a synchronous Engine, use SyncSQLStore")
        self.engine = engine
        self.fence = 0
        self._txn: AsyncConnection | None = None
        self._closing: asyncio.Task[None] | None = None  # the close destroy() started

    @staticmethod
    async def create_tables(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            await conn.run_sync(_METADATA.create_all)

    async def transaction(self) -> AsyncConnection:
        """The current consumer transaction's SQL transaction (begun on first use)."""
        if self._txn is None:
            conn = await self.engine.connect()
            await conn.begin()
            self._txn = conn
        return self._txn

    async def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        conn = await self.transaction()
        self.fence, data = await conn.run_sync(_restore, shard.fqn)
        cp = _decode(data)
        await self.start_commit(shard, cp, ())
        return cp

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        conn, self._txn = self._txn, None  # the next transaction begins its own
        return asyncio.ensure_future(self._commit(shard.fqn, checkpoint.SerializeToString(), conn, wait_for))

    async def _commit(self, fqn: str, data: bytes, conn: AsyncConnection | None,
                      wait_for: Sequence[Awaitable[Any]]) -> None:
        if conn is None:
            conn = await self.engine.connect()
            await conn.begin()
        try:
            for f in wait_for:
                await f
            self.fence = await conn.run_sync(_write_checkpoint, fqn, data, self.fence)
            await conn.commit()
        except BaseException:
            await asyncio.shield(conn.rollback())
            raise
        finally:
            await asyncio.shield(conn.close())

    def destroy(self) -> asyncio.Task[None] | None:
        """Closes the open transaction's connection (rolled back as it closes): the close in
        progress is returned, for the shard to await (``destroy`` is synchronous, as Gazette's)."""
        conn, self._txn = self._txn, None
        if conn is None:
            return None
        self._closing = asyncio.ensure_future(conn.close())  # referenced until it ends
        return self._closing


# -- synchronous SQLAlchemy -------------------------------------------------------------------


class SyncSQLStore:
    """See the module docstring. ``create_tables`` (blocking) makes ``gazette_checkpoints``
    if absent.

    Every DB call of the store's own runs on its single worker thread, in submission order;
    ``fence`` is read and written only there (and read by the loop once a call resolved)."""

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Engine):
            raise EngineKindError(f"SyncSQLStore takes a synchronous Engine (create_engine), not {engine!r}; "
                                  "for an AsyncEngine, use SQLStore")
        self.engine = engine
        self.fence = 0
        self._txn: Connection | None = None
        self._last: OpFuture | None = None  # the latest commit: the next one applies after it
        self._destroyed = False
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sql-store")

    @staticmethod
    def create_tables(engine: Engine) -> None:
        with engine.begin() as conn:
            _METADATA.create_all(conn)

    def connection(self) -> Connection:
        """The current consumer transaction's SQL transaction, begun on first use in the
        calling thread (a checkout from the engine's pool, where the worker returns the
        connections it commits)."""
        if self._txn is None:
            if self._destroyed:
                raise ConsumerError("SyncSQLStore.connection(): the store was destroyed (its shard left)")
            conn = self.engine.connect()
            conn.begin()
            self._txn = conn
        return self._txn

    async def prepare_txn(self, shard: Shard) -> None:
        """Awaited by the transaction loop before a transaction's first message: returns once
        the previous commit resolved (see the module docstring). Its failure is not raised
        here: the transaction loop reports it as the commit's."""
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait([last])

    async def restore_checkpoint(self, shard: Shard) -> pc.Checkpoint:
        data = await self._on_worker(self._restore_on_worker, shard.fqn)
        return _decode(data)

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        conn, self._txn = self._txn, None  # the next transaction begins its own
        commit = asyncio.ensure_future(
            self._commit(shard.fqn, checkpoint.SerializeToString(), conn, wait_for, self._last))
        self._last = commit
        return commit

    async def _commit(self, fqn: str, data: bytes, conn: Connection | None,
                      wait_for: Sequence[Awaitable[Any]], prev: OpFuture | None) -> None:
        try:
            if prev is not None:
                await asyncio.wait([prev])
                if prev.cancelled() or prev.exception() is not None:
                    cause = None if prev.cancelled() else prev.exception()
                    raise PreviousCommitFailed(f"checkpoint of {fqn} not committed: the previous "
                                               f"commit failed ({cause!r})") from cause
            for f in wait_for:
                await f
        except BaseException:
            if conn is not None:  # rolled back as it closes, after what the worker runs now
                self._worker.submit(conn.close)
            raise
        await self._on_worker(self._commit_on_worker, conn, fqn, data)

    def _restore_on_worker(self, fqn: str) -> bytes:
        conn = self.engine.connect()
        try:
            conn.begin()
            self.fence, data = _restore(conn, fqn)
        except BaseException:
            conn.close()  # rolled back as it closes
            raise
        self._commit_on_worker(conn, fqn, data)  # the bumped fence, with the same checkpoint
        return data

    def _commit_on_worker(self, conn: Connection | None, fqn: str, data: bytes) -> None:
        if conn is None:
            conn = self.engine.connect()
            conn.begin()
        try:
            self.fence = _write_checkpoint(conn, fqn, data, self.fence)
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):  # the error that failed the commit is the one to raise
                conn.rollback()
            raise
        finally:
            conn.close()

    async def _on_worker(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Runs ``fn`` on the store's worker thread. A cancelled caller stops waiting, but the
        call still runs to its end (its connection is closed either way): shielded, so a call
        queued behind another is not dropped."""
        done = asyncio.wrap_future(self._worker.submit(fn, *args, **kwargs))
        done.add_done_callback(_retrieve)
        return await asyncio.shield(done)

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        conn, self._txn = self._txn, None
        if conn is not None:  # rolled back as it closes
            self._worker.submit(conn.close)
        # The worker ends once what was submitted ran; a commit still waiting for its appends
        # submits later, so the shutdown waits for the last commit.
        last = self._last
        if last is None or last.done():
            self._worker.shutdown(wait=False)
        else:
            last.add_done_callback(lambda _: self._worker.shutdown(wait=False))


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Marks a worker call's outcome as seen: a cancelled caller no longer awaits it."""
    if not f.cancelled():
        f.exception()

"""``SQLStore``: a shard's state in a SQL database (PostgreSQL through psycopg 3, or SQLite
through aiosqlite), committed atomically with its checkpoint, as Gazette's ``store_sql.go``.

The application does its work inside the consumer transaction's own SQL transaction
(``await store.transaction()``: begun on first use, on its own connection); the store commits
it together with the checkpoint row of ``gazette_checkpoints(shard_fqn, fence, checkpoint)``.

Invariants:

* ``restore_checkpoint`` bumps the shard's fence (``fence = fence + 1``) and remembers it.
  Every commit updates the checkpoint only ``WHERE fence = <remembered>``: once a newer
  primary restored, a zombie's commit updates no row and is rolled back whole, its state
  changes with it (nothing of it becomes visible).
* A commit first waits for every ``wait_for`` future (the transaction's appends); a failed
  one fails the commit, which is rolled back.
* ``start_commit`` takes the current SQL transaction synchronously: the next consumer
  transaction begins a new one while this one commits (pipelining); the transaction loop
  guarantees commits apply in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from sqlalchemy import Column, Integer, LargeBinary, MetaData, Table, Text, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gazette.consumer.errors import ConsumerError
from gazette.consumer.interfaces import OpFuture, Shard
from gazette.protocol import consumer_pb2 as pc
from gazette.tasks import Supervisor

__all__ = ["CHECKPOINTS", "FencedError", "SQLStore"]

_METADATA = MetaData()
CHECKPOINTS = Table(
    "gazette_checkpoints", _METADATA,
    Column("shard_fqn", Text, primary_key=True, nullable=False),
    Column("fence", Integer, nullable=False),
    Column("checkpoint", LargeBinary, nullable=False),
)
"""Gazette's checkpoint table."""


class FencedError(ConsumerError):
    """The checkpoint's fence moved: another primary restored this shard since."""


class SQLStore:
    """See the module docstring. ``create_tables`` makes ``gazette_checkpoints`` if absent."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.fence = 0
        self._txn: AsyncConnection | None = None

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
        await conn.execute(update(CHECKPOINTS).where(CHECKPOINTS.c.shard_fqn == shard.fqn)
                           .values(fence=CHECKPOINTS.c.fence + 1))
        row = (await conn.execute(select(CHECKPOINTS.c.fence, CHECKPOINTS.c.checkpoint)
                                  .where(CHECKPOINTS.c.shard_fqn == shard.fqn))).first()
        cp = pc.Checkpoint()
        if row is None:
            self.fence = 0
        else:
            self.fence = int(row[0])
            cp.ParseFromString(bytes(row[1]))
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
            if self.fence == 0:  # the shard's first checkpoint: a racing primary's insert conflicts
                try:
                    await conn.execute(CHECKPOINTS.insert().values(shard_fqn=fqn, checkpoint=data, fence=1))
                except IntegrityError as err:
                    raise FencedError(f"checkpoint of {fqn} was created by another primary") from err
                self.fence = 1
            else:
                result = await conn.execute(
                    update(CHECKPOINTS).where(CHECKPOINTS.c.shard_fqn == fqn, CHECKPOINTS.c.fence == self.fence)
                    .values(checkpoint=data))
                if result.rowcount != 1:
                    raise FencedError(f"checkpoint fence of {fqn} was updated (by a new primary)")
            await conn.commit()
        except BaseException:
            await asyncio.shield(conn.rollback())
            raise
        finally:
            await asyncio.shield(conn.close())

    def destroy(self) -> None:
        conn, self._txn = self._txn, None
        if conn is not None:  # rolled back as the connection closes
            _CLOSING.spawn("close", conn.close())


_CLOSING = Supervisor("sql store: closing connections", "log")
"""Owns the closes ``destroy`` (synchronous, as Gazette's) starts."""

"""SQLStore on real PostgreSQL and SQLite files: checkpoints commit atomically with the app's
own writes, restore bumps the fence, and a zombie primary's commit fails whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gazette.consumer.stores.sql import CheckpointFencedError, SQLStore
from gazette.protocol import consumer_pb2 as pc


class _Shard:
    fqn = "/gazette/consumers/test/items/shard-000"


def _cp(offset: int) -> pc.Checkpoint:
    cp = pc.Checkpoint()
    cp.sources["in/part-000"].read_through = offset
    return cp


@pytest.fixture(params=["postgres", "sqlite"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        eng = create_async_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    else:
        eng = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'store.sqlite'}")
    await SQLStore.create_tables(eng)
    async with eng.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS counts"))
        await conn.execute(text("CREATE TABLE counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL)"))
        await conn.execute(text("DELETE FROM gazette_checkpoints"))
    yield eng
    await eng.dispose()


async def _count(store: SQLStore, key: str) -> None:
    conn = await store.transaction()
    updated = await conn.execute(text("UPDATE counts SET n = n + 1 WHERE k = :k"), {"k": key})
    if updated.rowcount == 0:
        await conn.execute(text("INSERT INTO counts (k, n) VALUES (:k, 1)"), {"k": key})


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {k: n for k, n in (await conn.execute(text("SELECT k, n FROM counts"))).all()}


async def test_commit_restore_and_fence(engine: AsyncEngine) -> None:
    shard: Any = _Shard()
    a = SQLStore(engine)
    assert await a.restore_checkpoint(shard) == pc.Checkpoint()
    await _count(a, "x")
    await a.start_commit(shard, _cp(100), [])
    assert await _counts(engine) == {"x": 1}

    # A pipelined transaction waits for its appends before committing.
    await _count(a, "x")
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = a.start_commit(shard, _cp(200), [dep])
    await asyncio.sleep(0)
    assert not commit.done()
    dep.set_result(None)
    await commit
    assert await _counts(engine) == {"x": 2}

    # A new primary restores: it sees the checkpoint and moves the fence.
    b = SQLStore(engine)
    assert (await b.restore_checkpoint(shard)).sources["in/part-000"].read_through == 200
    assert b.fence == a.fence + 1

    # The zombie's next commit fails, and its writes are rolled back with it.
    await _count(a, "x")
    await _count(a, "zombie")
    with pytest.raises(CheckpointFencedError):
        await a.start_commit(shard, _cp(300), [])
    assert await _counts(engine) == {"x": 2}

    # The new primary commits on.
    await _count(b, "y")
    await b.start_commit(shard, _cp(300), [])
    assert await _counts(engine) == {"x": 2, "y": 1}
    assert (await SQLStore(engine).restore_checkpoint(shard)).sources["in/part-000"].read_through == 300


async def test_failed_dependency_rolls_back(engine: AsyncEngine) -> None:
    shard: Any = _Shard()
    s = SQLStore(engine)
    await s.restore_checkpoint(shard)
    await _count(s, "x")
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    dep.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await s.start_commit(shard, _cp(1), [dep])
    assert await _counts(engine) == {}

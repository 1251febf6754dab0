"""A consumer app written from ``gazette.consumer`` and ``gazette.message`` names alone: typed
messages, per-shard state, every callback typed against the framework's roles (mypy strict
checks it with the rest of ``examples``).

It counts ``Input`` messages by key into PostgreSQL (``SQLStore``; the ``counts`` table,
``k TEXT PRIMARY KEY, n BIGINT``) and publishes one ``Output`` per input into
``out/part-00{0,1}`` (by key), uncommitted, so counts, checkpoint and outputs commit together:
the exactly-once soak (tests/integration/test_consumer_exactly_once.py) runs it beside its own
untyped app. Run it with ``STORE_DSN=postgresql+psycopg://... gazette consume --app
examples.typed_counter:TypedCounter`` (the repository root on ``PYTHONPATH``).

Invariants: the shard's state holds only the inputs of its current transaction (emptied by
``finalize_txn``); the framework drops it with the shard, so a failed transaction's inputs
never reach a later one.
"""

from __future__ import annotations

import os
import zlib
from collections import Counter

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gazette.consumer import (
    InitArgs,
    Recorder,
    Shard,
    ShardPublisher,
    SQLStore,
    StatefulApplication,
)
from gazette.message import Envelope, TypedMessage

__all__ = ["Input", "Output", "TypedCounter"]

UPSERT = text("INSERT INTO counts (k, n) VALUES (:k, :n) ON CONFLICT (k) DO UPDATE SET n = counts.n + EXCLUDED.n")


class Input(TypedMessage):
    """``{"key": ..., "seq": ...}``: one occurrence of ``key``; ``seq`` numbers the inputs."""

    key: str
    seq: int


class Output(TypedMessage):
    """The derived message of one input."""

    key: str
    seq: int


Pending = list[Input]
"""A shard's state: the inputs of its current transaction, in order."""


def to_outputs(msg: Output) -> tuple[str, str]:
    return f"out/part-00{zlib.crc32(msg.key.encode()) % 2}", "application/x-ndjson"


class TypedCounter(StatefulApplication[SQLStore, Input, Pending]):
    receive_acks = False  # acknowledgements are not inputs

    def __init__(self) -> None:
        self.engine: AsyncEngine | None = None

    def init_application(self, args: InitArgs) -> None:
        self.engine = create_async_engine(os.environ["STORE_DSN"], pool_size=16)

    def new_store(self, shard: Shard[Pending], recorder: Recorder | None) -> SQLStore:
        assert self.engine is not None, "init_application runs first"
        return SQLStore(self.engine)

    def new_shard_state(self, shard: Shard[Pending], store: SQLStore) -> Pending:
        return []

    def new_message(self, spec: object) -> type[Input]:
        return Input

    def consume_message(self, shard: Shard[Pending], store: SQLStore, envelope: Envelope[Input],
                        publisher: ShardPublisher) -> None:
        shard.state.append(envelope.message)

    async def finalize_txn(self, shard: Shard[Pending], store: SQLStore, publisher: ShardPublisher) -> None:
        inputs = list(shard.state)
        shard.state.clear()
        if not inputs:
            return
        conn = await store.transaction()
        # Sorted keys: shards sharing keys lock their rows in one order (no deadlocks).
        counts = sorted(Counter(m.key for m in inputs).items())
        await conn.execute(UPSERT, [{"k": k, "n": n} for k, n in counts])
        await publisher.publish_uncommitted_many(to_outputs, [Output(key=m.key, seq=m.seq) for m in inputs])

"""An async application with BeginFinisher over MemoryStore, through the transaction loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from gazette.consumer.stores.memory import MemoryStore
from gazette.consumer.transaction import TransactionLoop, TxnConfig
from gazette.message import Envelope, ProducerState
from gazette.message.publisher import AckIntent


class Source:
    def __init__(self, batches: list[list[Envelope]]) -> None:
        self.batches = batches
        self.offset = 0

    async def read(self) -> list[Envelope] | None:
        return self.batches.pop(0) if self.batches else None

    async def sequence(self, batch: list[Envelope]) -> Sequence[Envelope]:
        self.offset = batch[-1].end
        return batch

    def has_pending(self) -> bool:
        return False

    def sequenced_through(self) -> Mapping[str, int]:
        return {"in": self.offset}

    def checkpoint(self, prune_horizon_ns: int) -> tuple[Mapping[str, int], Sequence[ProducerState]]:
        return {"in": self.offset}, []


class CountingApp:
    def __init__(self) -> None:
        self.events: list[str] = []

    def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore()

    def new_message(self, spec: Any) -> Any:
        return None

    async def consume_message(self, shard: Any, store: MemoryStore, env: Envelope, pub: Any) -> None:
        await asyncio.sleep(0)  # an async callback may await (here: yield the loop)
        store.state[env.message] = store.state.get(env.message, 0) + 1

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        self.events.append("finalize")

    async def begin_txn(self, shard: Any, store: Any) -> None:
        self.events.append("begin")

    def finished_txn(self, shard: Any, store: Any, committed: Any) -> None:
        self.events.append("finished")


class NoAcks:
    def build_ack_intents(self) -> list[AckIntent]:
        return []


async def test_async_app_counts_into_memory_store() -> None:
    batches = [[Envelope("in", i * 10, i * 10 + 10, k) for i, k in enumerate("abca")]]
    app, store = CountingApp(), MemoryStore()
    loop = TransactionLoop(object(), app, store, NoAcks(), Source(batches),  # type: ignore[arg-type]
                           config=TxnConfig(max_duration=1), write_acks=lambda i, a: [])
    await asyncio.wait_for(loop.run(), 5)
    assert store.state == {"a": 2, "b": 1, "c": 1}
    assert store.commits == 1 and store.checkpoint.sources["in"].read_through == 40
    assert app.events == ["begin", "finalize", "finished"]

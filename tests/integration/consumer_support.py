"""Shared pieces of the consumer integration tests: source journal specs and a counting app."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from gazette.consumer.stores.memory import MemoryStore
from gazette.message import Envelope, JSONMessage
from gazette.message.uuid import ACK_TXN, get_flags


def journals_yaml(*parts: str) -> str:
    """A journal spec tree of framed (ndjson) journals ``in/<part>`` for ``gazctl journals apply``."""
    children = "".join(f"- name: in/{p}\n" for p in parts)
    return ("name: in/\nreplication: 1\nlabels:\n- name: content-type\n  value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [file:///]\n"
            "  refresh_interval: 1s\nchildren:\n" + children)


class CountingApp:
    """Counts messages by their ``key`` field (ACKs skipped); ``fail(shard, env)`` may raise."""

    def __init__(self, fail: Callable[[Any, Envelope], None] | None = None) -> None:
        self.counts: Counter[str] = Counter()
        self.fail = fail

    def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore()

    def new_message(self, spec: Any) -> type[JSONMessage]:
        return JSONMessage

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Any) -> None:
        if get_flags(env.message.get_uuid()) == ACK_TXN:
            return  # transaction acknowledgements are delivered too, as in Gazette
        if self.fail is not None:
            self.fail(shard, env)
        self.counts[env.message.doc["key"]] += 1

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass

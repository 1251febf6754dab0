"""The summer: a consumer application keeping each open stream's running sum.

Run it with ``gazette consume --app examples.stream_sum.summer:Summer`` (the repository root on
``PYTHONPATH``). A shard's ``store`` label picks its embedded store, ``rocksdb`` or ``sqlite``;
both are recorded to the shard's recovery log.

Invariants:

* A chunk whose sequence number is not the stream's last plus one fails the transaction (and
  the shard), naming the stream: nothing is skipped or applied twice silently.
* State is read through a per-transaction cache, written back in ``finalize_txn`` into the
  store's transaction, so it commits with the checkpoint; a finished stream's state is
  deleted and its ``Sum`` published in the same transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from examples.stream_sum.messages import SUMS_JOURNAL, ZERO, Chunk, StreamSumError, Sum, update
from gazette.consumer import RocksDBStore, SQLiteStore
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSet

__all__ = ["Summer"]

_SQL = ("CREATE TABLE IF NOT EXISTS sums (id BLOB PRIMARY KEY, seq INTEGER NOT NULL, "
        "value BLOB NOT NULL) WITHOUT ROWID")


def _sums_mapping(msg: Any) -> tuple[str, str]:
    return SUMS_JOURNAL, "application/x-ndjson"



class _State:
    __slots__ = ("done", "seq", "value")

    def __init__(self, seq: int, value: bytes) -> None:
        self.seq, self.value, self.done = seq, value, False


class Summer:
    receive_acks = False  # transaction acknowledgements are not chunks: not handed over

    def __init__(self) -> None:
        self._cache: dict[str, dict[bytes, _State]] = {}  # shard id -> this transaction's streams

    def new_store(self, shard: Any, recorder: Any) -> RocksDBStore | SQLiteStore:
        self._cache.pop(shard.spec.id, None)  # what a failed transaction of an earlier run left
        kind = (LabelSet.from_proto(shard.spec.labels).value_of("store") or "").lower()
        if kind == "rocksdb":
            return RocksDBStore(recorder)
        if kind == "sqlite":
            store = SQLiteStore(recorder)
            store.conn.execute(_SQL)
            return store
        raise StreamSumError(f"shard {shard.spec.id}: label 'store' must be 'rocksdb' or 'sqlite' (got {kind!r})")

    def new_message(self, spec: pb.JournalSpec) -> type[Chunk]:
        return Chunk

    def consume_message(self, shard: Any, store: Any, env: Any, publisher: Any) -> None:
        chunk: Chunk = env.message
        sid = bytes.fromhex(chunk.id)
        cache = self._cache.setdefault(shard.spec.id, {})
        state = cache.get(sid)
        if state is None:
            state = cache[sid] = _load(store, sid)
        if state.done or chunk.seq != state.seq + 1:
            raise StreamSumError(f"stream {chunk.id}: chunk {chunk.seq} after chunk {state.seq}"
                                 f"{' (the stream had ended)' if state.done else ''}, at "
                                 f"{env.journal}:{env.begin}")
        state.seq, state.value, state.done = chunk.seq, update(state.value, chunk.data), not chunk.data

    async def finalize_txn(self, shard: Any, store: Any, publisher: Any) -> None:
        cache = self._cache.pop(shard.spec.id, {})
        sums = []
        for sid, state in cache.items():
            _save(store, sid, state)
            if state.done:
                sums.append(Sum(id=sid.hex(), seq=state.seq, sum=state.value.hex()))
        if sums:
            await publisher.publish_uncommitted_many(_sums_mapping, sums)


def _load(store: Any, sid: bytes) -> _State:
    if isinstance(store, SQLiteStore):
        row = store.conn.execute("SELECT seq, value FROM sums WHERE id = ?", (sid,)).fetchone()
        return _State(0, ZERO) if row is None else _State(row[0], bytes(row[1]))
    raw = store.get(sid)
    return _State(0, ZERO) if raw is None else _State(int.from_bytes(raw[:8], "big"), raw[8:])


def _save(store: Any, sid: bytes, state: _State) -> None:
    if isinstance(store, SQLiteStore):
        conn: sqlite3.Connection = store.conn
        if state.done:
            conn.execute("DELETE FROM sums WHERE id = ?", (sid,))
        else:
            conn.execute("INSERT INTO sums VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE "
                         "SET seq = excluded.seq, value = excluded.value", (sid, state.seq, state.value))
    elif state.done:
        store.delete(sid)
    else:
        store.put(sid, state.seq.to_bytes(8, "big") + state.value)

"""The summer: a consumer application keeping each open stream's running sum.

Run it with ``gazette consume --app examples.stream_sum.summer:Summer`` (the repository root on
``PYTHONPATH``). A shard's ``store`` label picks its embedded store, ``rocksdb`` or ``sqlite``;
both are recorded to the shard's recovery log.

Invariants:

* A chunk whose sequence number is not the stream's last plus one fails the transaction (and
  the shard), naming the stream: nothing is skipped or applied twice silently.
* State is read through a per-transaction cache (the shard's state, ``shard.state``: made by
  the framework per shard, dropped when the shard leaves or fails), written back in
  ``finalize_txn`` into the store's transaction, so it commits with the checkpoint; a finished
  stream's state is deleted and its ``Sum`` published in the same transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from examples.stream_sum.messages import SUMS_JOURNAL, ZERO, Chunk, StreamSumError, Sum, update
from gazette.consumer import RocksDBStore, Shard, ShardPublisher, SQLiteStore, StatefulApplication
from gazette.message import Envelope
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSet
from gazette.recoverylog import Recorder

__all__ = ["Summer"]

_SQL = ("CREATE TABLE IF NOT EXISTS sums (id BLOB PRIMARY KEY, seq INTEGER NOT NULL, "
        "value BLOB NOT NULL) WITHOUT ROWID")


def _sums_mapping(msg: Any) -> tuple[str, str]:
    return SUMS_JOURNAL, "application/x-ndjson"



class _State:
    __slots__ = ("done", "seq", "value")

    def __init__(self, seq: int, value: bytes) -> None:
        self.seq, self.value, self.done = seq, value, False


Store = RocksDBStore | SQLiteStore
Streams = dict[bytes, _State]
"""A shard's state: the streams its current transaction touched, by stream id."""


class Summer(StatefulApplication[Store, Chunk, Streams]):
    receive_acks = False  # transaction acknowledgements are not chunks: not handed over

    def new_store(self, shard: Shard[Streams], recorder: Recorder | None) -> Store:
        kind = (LabelSet.from_proto(shard.spec.labels).value_of("store") or "").lower()
        if kind == "rocksdb":
            return RocksDBStore(recorder)
        if kind == "sqlite":
            store = SQLiteStore(recorder)
            store.conn.execute(_SQL)
            return store
        raise StreamSumError(f"shard {shard.spec.id}: label 'store' must be 'rocksdb' or 'sqlite' (got {kind!r})")

    def new_shard_state(self, shard: Shard[Streams], store: Store) -> Streams:
        return {}

    def new_message(self, spec: pb.JournalSpec) -> type[Chunk]:
        return Chunk

    def consume_message(self, shard: Shard[Streams], store: Store, env: Envelope[Chunk],
                        publisher: ShardPublisher) -> None:
        chunk = env.message
        sid = bytes.fromhex(chunk.id)
        cache = shard.state
        state = cache.get(sid)
        if state is None:
            state = cache[sid] = _load(store, sid)
        if state.done or chunk.seq != state.seq + 1:
            raise StreamSumError(f"stream {chunk.id}: chunk {chunk.seq} after chunk {state.seq}"
                                 f"{' (the stream had ended)' if state.done else ''}, at "
                                 f"{env.journal}:{env.begin}")
        state.seq, state.value, state.done = chunk.seq, update(state.value, chunk.data), not chunk.data

    async def finalize_txn(self, shard: Shard[Streams], store: Store, publisher: ShardPublisher) -> None:
        cache = shard.state
        sums = []
        for sid, state in cache.items():
            _save(store, sid, state)
            if state.done:
                sums.append(Sum(id=sid.hex(), seq=state.seq, sum=state.value.hex()))
        cache.clear()
        if sums:
            await publisher.publish_uncommitted_many(_sums_mapping, sums)


def _load(store: Store, sid: bytes) -> _State:
    if isinstance(store, SQLiteStore):
        row = store.conn.execute("SELECT seq, value FROM sums WHERE id = ?", (sid,)).fetchone()
        return _State(0, ZERO) if row is None else _State(row[0], bytes(row[1]))
    raw = store.get(sid)
    return _State(0, ZERO) if raw is None else _State(int.from_bytes(raw[:8], "big"), raw[8:])


def _save(store: Store, sid: bytes, state: _State) -> None:
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

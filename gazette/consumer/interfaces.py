"""The roles of the consumer framework, as Gazette's ``consumer/interfaces.go``: an
``Application`` processes messages of a ``Shard`` into a ``Store``, in transactions.

Callbacks are async-native: each may be a plain function or an ``async def`` (awaited on the
shard's event loop). A plain ``consume_message`` is called for a whole ready batch without an
await between messages; an ``async`` one is awaited per message, at the app's choice.

Invariants (what the framework guarantees the roles):

* ``consume_message`` is called for each committed message of the shard's sources exactly once
  per transaction that commits; ``finalize_txn`` once per transaction, after its last message
  and before its checkpoint is taken; ``begin_txn``/``finished_txn`` (optional) bracket each.
* ``Store.start_commit`` is called with the transaction's checkpoint once the previous
  transaction's commit and ACKs resolved; the store must persist its state and the checkpoint
  atomically, after every future in ``wait_for`` (the transaction's own appends) resolved.
* Transaction acknowledgements (messages whose UUID flags carry ACK_TXN; see
  ``gazette.consumer.is_ack``) are committed messages too and reach ``consume_message``, as in
  Gazette. An application that has no use for them sets the class attribute
  ``receive_acks = False`` (read once, when a shard starts; absent means True): they are then
  still sequenced (they commit their producers' messages) but never handed over.
* A shard leaving this process (``Shard.stopping``) cancels its loops; a store is destroyed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from gazette.message import Envelope, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "Application",
    "BeginFinisher",
    "MaybeAwaitable",
    "MessageProducer",
    "OpFuture",
    "PreparingStore",
    "Shard",
    "Store",
]

OpFuture: TypeAlias = "asyncio.Future[Any]"
"""An operation's eventual outcome (a commit, an append): resolved, or failed with its error."""

MaybeAwaitable: TypeAlias = "Any | Awaitable[Any]"


class Shard(Protocol):
    """One shard as the application sees it."""

    @property
    def fqn(self) -> str:
        """Fully qualified name: ``{etcd prefix}/items/{shard id}``."""
        ...

    @property
    def spec(self) -> pc.ShardSpec: ...

    @property
    def stopping(self) -> asyncio.Event:
        """Set when the shard leaves this process (its primary loop ends): tasks the app
        starts for a shard end on it. (``ShardRuntime.done`` is a deprecated alias.)"""
        ...

    @property
    def journal_client(self) -> Any:
        """The process's ``JournalClient`` (to read or append journals from the app)."""
        ...

    @property
    def assignment(self) -> Any:
        """The keyspace entry of this process's assignment of the shard (its ``ReplicaStatus``)."""
        ...

    @property
    def recovered_hints(self) -> Any:
        """The recovery log hints the shard's store was recovered from (None without one)."""
        ...

    def progress(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(read-through offsets of sources, publish-at offsets of written journals) of the
        last completed transaction."""
        ...


class Store(Protocol):
    """Where a shard keeps its state, committed atomically with its checkpoint."""

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[Any]]) -> OpFuture:
        """Begins committing; the future resolves once durable (or fails with why)."""
        ...

    def restore_checkpoint(self, shard: Shard) -> MaybeAwaitable:
        """The last committed checkpoint (an empty one for a new store)."""
        ...

    def destroy(self) -> None:
        """Releases the store's resources (the shard left, or failed)."""
        ...


class Application(Protocol):
    """What a user writes: see the module docstring.

    Optional attributes, read when a shard starts: ``receive_acks`` (default True): False
    keeps acknowledgement messages from ``consume_message``."""

    def new_store(self, shard: Shard, recorder: Any) -> MaybeAwaitable:
        """The shard's Store (``recorder`` records its files into the recovery log, if any)."""
        ...

    def new_message(self, spec: pb.JournalSpec) -> Any:
        """The message type of a source journal (e.g. ``JSONMessage`` or a subclass)."""
        ...

    def consume_message(self, shard: Shard, store: Store, envelope: Envelope,
                        publisher: Publisher[Any]) -> MaybeAwaitable:
        """Processes one committed message within the current transaction."""
        ...

    def finalize_txn(self, shard: Shard, store: Store, publisher: Publisher[Any]) -> MaybeAwaitable:
        """Last call of a transaction: flush what it buffered into the store and publisher."""
        ...


@runtime_checkable
class MessageProducer(Protocol):
    """Optional: an Application that produces its shards' messages itself (Gazette's
    ``MessageProducer``), e.g. from something other than plain journal messages.

    * ``start_reading_messages`` yields batches of *uncommitted* envelopes (in each journal's
      order) from the checkpoint on; the framework sequences them (transactions, ACKs) and the
      checkpoint records each envelope's journal offsets as usual. Its end ends the shard.
    * ``replay_range`` returns the envelopes of ``journal`` over ``[begin, end)`` again, for a
      sequencer's replay of messages evicted from its ring.
    * ``read_through`` maps the offsets a read-your-writes request asks for to the offsets the
      shard must have read through (by default: those of its source journals)."""

    def start_reading_messages(self, shard: Shard, store: Store,
                               checkpoint: pc.Checkpoint) -> AsyncIterator[Sequence[Envelope]]: ...

    def replay_range(self, shard: Shard, store: Store, journal: str, begin: int,
                     end: int) -> MaybeAwaitable: ...

    def read_through(self, shard: Shard, store: Store,
                     offsets: Mapping[str, int]) -> Mapping[str, int]: ...


class PreparingStore(Protocol):
    """Optional: a Store with ``prepare_txn``, awaited as each transaction begins, before its
    first message reaches the app. A store whose transactions must not overlap
    (``SyncSQLStore``: a synchronous statement blocked on a row the previous commit still locks
    would hold the event loop that commit needs) returns once the previous commit resolved;
    pipelining stores need not."""

    def prepare_txn(self, shard: Shard) -> Awaitable[None] | None: ...


@runtime_checkable
class BeginFinisher(Protocol):
    """Optional: an Application told when each transaction begins and finishes."""

    def begin_txn(self, shard: Shard, store: Store) -> MaybeAwaitable: ...

    def finished_txn(self, shard: Shard, store: Store, committed: OpFuture) -> None: ...

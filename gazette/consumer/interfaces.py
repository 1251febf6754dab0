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
  transaction's commit resolved (its ACKs may still be in flight: their intents are carried in
  this checkpoint), or, for a store declaring ``ordered_commits = True``, once the commit
  before the previous one resolved; the store must persist its state and the checkpoint
  atomically, after every future in ``wait_for`` (the transaction's own appends) resolved.
* Transaction acknowledgements (messages whose UUID flags carry ACK_TXN; see
  ``gazette.consumer.is_ack``) are committed messages too and reach ``consume_message``, as in
  Gazette. An application that has no use for them sets the class attribute
  ``receive_acks = False`` (read once, when a shard starts; absent means True): they are then
  still sequenced (they commit their producers' messages) but never handed over.
* Per-shard state: an application with ``new_shard_state(shard, store)`` (see
  ``StatefulApplication``) gets it called once per start of a shard in this process, after the
  shard's store is built and its checkpoint restored and before any other callback of that
  start; what it returns is ``shard.state`` in every later callback of that start (the same
  object), and is dropped when the shard leaves this process or fails. A shard started again
  (another process, or this one after a failure) gets a new state: it may cache what the
  store holds, but what only it holds is lost with the shard. Without the method,
  ``shard.state`` is None.
* ``Shard.assignment`` follows this process's assignment of the shard in the keyspace (its
  ``ReplicaStatus``, revisions), refreshed as the keyspace changes.
* A shard leaving this process (``Shard.stopping``) cancels its loops; a store is destroyed.

Typing: the roles are generic, so mypy checks an app's callbacks against them. ``Shard[S]``
carries the state type (``shard.state: S``); ``Application[StoreT, M, S]`` the store, the
message type (``new_message`` returns ``type[M]``, ``consume_message`` gets ``Envelope[M]``)
and the state; ``StatefulApplication[StoreT, M, S]`` adds ``new_shard_state``. An app declares
itself as one (``class Counter(StatefulApplication[RocksDBStore, Word, Counts])``) and mypy
checks each callback's signature.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, cast, runtime_checkable

from typing_extensions import TypeVar

from gazette.client import AsyncAppend, JournalClient
from gazette.message import Envelope, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.recoverylog import FSMHints, Recorder

__all__ = [
    "Application",
    "Assignment",
    "BeginFinisher",
    "MaybeAwaitable",
    "MessageProducer",
    "OpFuture",
    "PreparingStore",
    "Shard",
    "ShardPublisher",
    "StatefulApplication",
    "Store",
    "maybe_await",
]

OpFuture: TypeAlias = "asyncio.Future[None]"
"""An operation's eventual outcome (a commit, an append): resolved, or failed with its error."""

T = TypeVar("T")
MaybeAwaitable: TypeAlias = "T | Awaitable[T]"
"""What a callback returns: a plain function's value, or an ``async def``'s awaitable of it."""


async def maybe_await(result: MaybeAwaitable[T]) -> T:
    """A callback's value: ``result`` awaited if it is awaitable (any awaitable: a coroutine, a
    future, an object with ``__await__``), else ``result`` itself. The one test of it."""
    if inspect.isawaitable(result):
        return cast(T, await result)
    return result

ShardPublisher: TypeAlias = "Publisher[AsyncAppend]"
"""The publisher handed to callbacks: a publish returns the append's handle (await it for the
commit; the transaction waits for its own appends anyway)."""

S_co = TypeVar("S_co", covariant=True, default=object)
S_contra = TypeVar("S_contra", contravariant=True, default=None)
S = TypeVar("S", default=None)
M = TypeVar("M", default=object)
StoreT = TypeVar("StoreT", bound="Store", default="Store")
StoreT_contra = TypeVar("StoreT_contra", bound="Store", contravariant=True, default="Store")


@dataclass(frozen=True, slots=True)
class Assignment:
    """This process's assignment of a shard, as the keyspace holds it (its etcd key and
    revisions, the replica slot: 0 is the primary, and the ``ReplicaStatus`` written there)."""

    key: str = ""
    slot: int = 0
    status: pc.ReplicaStatus = field(default_factory=pc.ReplicaStatus)
    create_revision: int = 0
    mod_revision: int = 0


class Shard(Protocol[S_co]):
    """One shard as the application sees it; ``S_co`` is its state's type."""

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
    def journal_client(self) -> JournalClient:
        """The process's ``JournalClient`` (to read or append journals from the app)."""
        ...

    @property
    def assignment(self) -> Assignment:
        """This process's assignment of the shard, as the keyspace holds it now."""
        ...

    @property
    def recovered_hints(self) -> FSMHints | None:
        """The recovery log hints the shard's store was recovered from (None without one)."""
        ...

    @property
    def state(self) -> S_co:
        """What ``new_shard_state`` returned for this start of the shard (None without it).
        Read before it exists (in ``new_store``, or ``new_shard_state`` itself) it raises
        ``ShardStateError``."""
        ...

    def progress(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(read-through offsets of sources, publish-at offsets of written journals) of the
        last completed transaction."""
        ...


class Store(Protocol):
    """Where a shard keeps its state, committed atomically with its checkpoint.

    Optional capability: a class attribute ``ordered_commits = True`` declares that the
    store's commits resolve in the order they started, and that a commit fails if an earlier
    one failed (the embedded stores: their recorder appends one batch at a time and fails for
    good). The transaction loop then starts a commit while the previous one is outstanding."""

    def start_commit(self, shard: Shard, checkpoint: pc.Checkpoint,
                     wait_for: Sequence[Awaitable[object]]) -> OpFuture:
        """Begins committing; the future resolves once durable (or fails with why)."""
        ...

    def restore_checkpoint(self, shard: Shard) -> MaybeAwaitable[pc.Checkpoint]:
        """The last committed checkpoint (an empty one for a new store)."""
        ...

    def destroy(self) -> Awaitable[None] | None:
        """Releases the store's resources (the shard left, or failed). It may return the release
        still in progress (an asynchronous close), which the shard awaits as it ends (for up to
        5 s, then cancels it)."""
        ...


class Application(Protocol[StoreT, M, S_contra]):
    """What a user writes: see the module docstring. ``StoreT`` is its stores' type, ``M`` its
    messages' and ``S_contra`` its shards' state (None without ``new_shard_state``).

    Optional attributes, read when a shard starts: ``receive_acks`` (default True): False
    keeps acknowledgement messages from ``consume_message``."""

    def new_store(self, shard: Shard[S_contra], recorder: Recorder | None) -> MaybeAwaitable[StoreT]:
        """The shard's Store (``recorder`` records its files into the recovery log, if any)."""
        ...

    def new_message(self, spec: pb.JournalSpec) -> type[M]:
        """The message type of a source journal (e.g. a ``TypedMessage`` subclass)."""
        ...

    def consume_message(self, shard: Shard[S_contra], store: StoreT, envelope: Envelope[M],
                        publisher: ShardPublisher) -> MaybeAwaitable[None]:
        """Processes one committed message within the current transaction."""
        ...

    def finalize_txn(self, shard: Shard[S_contra], store: StoreT,
                     publisher: ShardPublisher) -> MaybeAwaitable[None]:
        """Last call of a transaction: flush what it buffered into the store and publisher."""
        ...


class StatefulApplication(Application[StoreT, M, S], Protocol[StoreT, M, S]):
    """An Application keeping per-shard state through the framework: ``new_shard_state`` is
    called once per start of a shard, with its ready store (its checkpoint restored), and what
    it returns is ``shard.state`` until the shard leaves or fails (see the module docstring)."""

    def new_shard_state(self, shard: Shard[S], store: StoreT) -> MaybeAwaitable[S]: ...


@runtime_checkable
class MessageProducer(Protocol[StoreT_contra, S_contra, M]):
    """Optional: an Application that produces its shards' messages itself (Gazette's
    ``MessageProducer``), e.g. from something other than plain journal messages.

    * ``start_reading_messages`` yields batches of *uncommitted* envelopes (in each journal's
      order) from the checkpoint on; the framework sequences them (transactions, ACKs) and the
      checkpoint records each envelope's journal offsets as usual. Its end ends the shard.
    * ``replay_range`` returns the envelopes of ``journal`` over ``[begin, end)`` again, for a
      sequencer's replay of messages evicted from its ring.
    * ``read_through`` maps the offsets a read-your-writes request asks for to the offsets the
      shard must have read through (by default: those of its source journals)."""

    def start_reading_messages(self, shard: Shard[S_contra], store: StoreT_contra,
                               checkpoint: pc.Checkpoint) -> AsyncIterator[Sequence[Envelope[M]]]: ...

    def replay_range(self, shard: Shard[S_contra], store: StoreT_contra, journal: str, begin: int,
                     end: int) -> MaybeAwaitable[Sequence[Envelope[M]]]: ...

    def read_through(self, shard: Shard[S_contra], store: StoreT_contra,
                     offsets: Mapping[str, int]) -> Mapping[str, int]: ...


class PreparingStore(Protocol):
    """Optional: a Store with ``prepare_txn``, awaited as each transaction begins, before its
    first message reaches the app. A store whose transactions must not overlap
    (``SyncSQLStore``: a synchronous statement blocked on a row the previous commit still locks
    would hold the event loop that commit needs) returns once the previous commit resolved;
    pipelining stores need not."""

    def prepare_txn(self, shard: Shard) -> Awaitable[None] | None: ...


@runtime_checkable
class BeginFinisher(Protocol[StoreT_contra, S_contra]):
    """Optional: an Application told when each transaction begins and finishes."""

    def begin_txn(self, shard: Shard[S_contra], store: StoreT_contra) -> MaybeAwaitable[None]: ...

    def finished_txn(self, shard: Shard[S_contra], store: StoreT_contra, committed: OpFuture) -> None: ...

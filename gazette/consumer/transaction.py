"""Consumer transactions, with Gazette's semantics (``consumer/transaction.go``).

A shard processes its committed messages in transactions. A transaction begins at the first
ready message, consumes ready messages for at least ``min_txn_duration`` and at most
``max_txn_duration``, and closes once input stalls (no message is ready) and the commit
barrier (below) allows. Closing it calls ``finalize_txn``, takes the checkpoint (the sources'
read-through offsets and producer states, from the sequencer, plus ACK intents), and hands it
to ``Store.start_commit`` with the transaction's pending appends as ``wait_for``; its ACKs are
queued at once, each written once the commit resolved.

Pipelining: the next transaction consumes while the previous one commits. Its commit waits
for the previous *commit* (not that commit's ACKs: Gazette waits for those too), or, with a
store whose commits are ordered (``ordered_commits``: a commit resolves only after every
earlier one did, and fails if one did), for the one before it, so that one commit's write
overlaps the previous one's append. At most ``depth + 1`` transactions are outstanding (commit
started, not done). If the maximum duration elapses first, the transaction stops reading and
is *stalled* until the barrier lifts. A store with ``prepare_txn`` (``PreparingStore``) is
awaited before each transaction's first message reaches the app, and may hold it there
(``SyncSQLStore`` does, until the previous commit resolved).

ACKs not yet written are carried: a checkpoint's ACK intents are its own transaction's over
those of every outstanding transaction whose ACKs have not all resolved (per journal, the
later intent supersedes: an ACK commits its producer's messages up to its clock). Recovered
from, such a checkpoint writes them; one that was written already is a duplicate, which
readers' sequencers ignore. Each journal still sees a transaction's data, then its ACK, then
the next transaction's data: ACKs are queued as their commit starts, and the append service
keeps a journal's appends in order.

States, one step each (``TxnState``): IDLE (nothing consumed: wait for a message, the
previous barrier or the end of input) → CONSUMING (consume ready batches; wait while a close
condition is unmet) → STALLED (max duration elapsed, waiting for the barrier) → COMMIT
(finalize, checkpoint, start_commit, ACKs) → the next transaction's IDLE.

Invariants:

* Messages are consumed in batches (a chunk's committed messages): no await and no task per
  message unless the application's ``consume_message`` is itself ``async``.
* ``start_commit`` of a transaction is called only once fewer than ``depth`` earlier commits
  are unresolved (1 unless the store's commits are ordered) and the transaction before the
  previous one is done; a failed commit or ACK fails the loop. Progress is reported in
  transaction order.
* The checkpoint of a transaction reflects exactly the messages it consumed: reading (I/O)
  may run one item ahead, but sequencing happens only as the transaction consumes
  (``MessageSource.read`` vs ``sequence``); the outstanding read is kept across transactions.
* Progress (read-through, publish-at) is reported when a transaction's commit and ACKs
  resolved, and also when input that began no transaction was sequenced while idle (messages
  the sequencer discards: a duplicate re-append, a rolled-back transaction): read-through then
  reaches the end of input even when its tail commits nothing, so a Stat waiting on it answers
  (Gazette's ``txnRead``). Such idle progress is never persisted and never changes a
  checkpoint handed to the store; reported read-through never goes backwards.
* Time is read only from the injected ``Clock``: tests drive every close condition without
  sleeping.
* Acknowledgement messages (ACK_TXN) reach ``consume_message`` as in Gazette, unless the
  application's ``receive_acks`` attribute is false: then they are sequenced but not handed
  over, and a batch of acknowledgements alone begins no transaction.
* Any error of the application, store or ACKs ends ``run()`` with a ``TransactionError``
  naming the phase (the shard is then FAILED); nothing of the failed transaction commits.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from gazette.consumer.envelopes import is_ack
from gazette.consumer.errors import TransactionError
from gazette.consumer.interfaces import (
    Application,
    BeginFinisher,
    OpFuture,
    Shard,
    Store,
    maybe_await,
)
from gazette.durations import ns_from_pb
from gazette.message import Envelope, ProducerState, build_checkpoint
from gazette.message.publisher import AckIntent
from gazette.protocol import consumer_pb2 as pc
from gazette.tasks import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = [
    "PRODUCER_PRUNE_HORIZON_NS",
    "Clock",
    "LoopClock",
    "MessageSource",
    "TransactionLoop",
    "TxnConfig",
    "TxnPublisher",
    "TxnState",
]

PRODUCER_PRUNE_HORIZON_NS = 24 * 3600 * 10**9
"""Producers silent this long are pruned from checkpoints (Gazette's 24 h horizon)."""


class Clock(Protocol):
    """The transaction loop's time: seconds on a monotonic scale."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class LoopClock:
    """The event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self.now()))


class MessageSource(Protocol):
    """A shard's messages, in two halves: ``read`` does the I/O (raw, uncommitted content of
    its sources, with no effect on sequencing) and may run ahead of the transaction; ``sequence``
    turns what was read into ready committed messages, advancing the sequencer, and is called
    only when the transaction consumes them. So a checkpoint never covers messages read ahead."""

    async def read(self) -> Any | None:
        """The next read-uncommitted content (e.g. a chunk); None once input ended."""
        ...

    async def sequence(self, item: Any) -> Sequence[Envelope]:
        """The committed messages ``item`` makes ready, in order (possibly none)."""
        ...

    def has_pending(self) -> bool:
        """Whether a transaction of some producer began but is not yet acknowledged."""
        ...

    # Optional: ``sequence_without_acks(item)``, as ``sequence`` less the acknowledgements
    # (ACK_TXN), for an application with ``receive_acks = False``; a source that knows its
    # batches' UUID flags skips the per-message check the loop otherwise makes (``is_ack``).

    def sequenced_through(self) -> Mapping[str, int]:
        """Read-through offsets of everything sequenced so far (no side effect): what the
        loop reports as progress when sequenced input made no message ready."""
        ...

    def checkpoint(self, prune_horizon_ns: int) -> tuple[Mapping[str, int], Sequence[ProducerState]]:
        """Read-through offsets and producer states reflecting every message sequenced."""
        ...


class TxnPublisher(Protocol):
    """What the loop asks of the shard's publisher (a ``Publisher``, which the application is
    handed): the ACK intents of what the transaction published, taken as it commits."""

    def build_ack_intents(self) -> list[AckIntent]: ...


WriteAcks = Callable[[Sequence[AckIntent], OpFuture], Sequence[Awaitable[Any]]]
"""Appends ACK intents once ``after`` (the commit) resolved; the appends' futures."""


@dataclass(frozen=True)
class TxnConfig:
    """A shard's transaction bounds (seconds) and ACK policy, from its ShardSpec."""

    min_duration: float = 0.0
    max_duration: float = 1.0
    wait_for_ack: bool = True
    prune_horizon_ns: int = PRODUCER_PRUNE_HORIZON_NS

    @classmethod
    def from_spec(cls, spec: pc.ShardSpec) -> TxnConfig:
        return cls(min_duration=ns_from_pb(spec.min_txn_duration) / 1e9,
                   max_duration=ns_from_pb(spec.max_txn_duration) / 1e9,
                   wait_for_ack=not spec.disable_wait_for_ack)


class TxnState(enum.StrEnum):
    """Where a shard's transaction loop is: idle, consuming, stalled (max duration elapsed,
    waiting for the previous barrier) or committing."""

    IDLE = "idle"
    CONSUMING = "consuming"
    STALLED = "stalled"
    COMMIT = "commit"


@dataclass
class Txn:
    """One transaction's record (what metrics and Stat report)."""

    consumed: int = 0
    consumed_bytes: int = 0
    reading: bool = True
    began_at: float = 0.0
    stalled_at: float | None = None
    committed_at: float | None = None
    checkpoint: pc.Checkpoint = field(default_factory=pc.Checkpoint)
    commit: OpFuture | None = None
    acks: list[asyncio.Future[Any]] = field(default_factory=list)
    intents: dict[str, bytes] = field(default_factory=dict)  # its own ACK intents, by journal

    def acked(self) -> bool:
        """Whether every ACK of the transaction is written (a failed one is not)."""
        return all(a.done() and not a.cancelled() and a.exception() is None for a in self.acks)


def _resolved() -> OpFuture:
    f: OpFuture = asyncio.get_running_loop().create_future()
    f.set_result(None)
    return f


class TransactionLoop:
    """Runs a shard's transactions until its input ends (see the module docstring)."""

    def __init__(self, shard: Shard[Any], app: Application[Any, Any, Any], store: Store, publisher: TxnPublisher,
                 source: MessageSource, *, config: TxnConfig, write_acks: WriteAcks,
                 pending_appends: Callable[[], Sequence[Awaitable[Any]]] = lambda: (),
                 clock: Clock | None = None,
                 on_progress: Callable[[Mapping[str, int], Mapping[str, int]], None] | None = None,
                 on_txn: Callable[[Txn], None] | None = None) -> None:
        self.shard, self.app, self.store = shard, app, store
        # Handed to the application as its Publisher; the loop itself only takes its intents.
        self.publisher: Any = publisher
        self.source, self.config = source, config
        self.write_acks, self.pending_appends = write_acks, pending_appends
        self.clock = clock or LoopClock()
        # PreparingStore's optional method: looked up, as a Store need not declare the role.
        self._prepare_txn: Callable[[Shard], Awaitable[None] | None] | None = getattr(store, "prepare_txn", None)
        self.on_progress, self.on_txn = on_progress, on_txn
        self.state = TxnState.IDLE
        # Commits in flight at once: two for a store whose commits are ordered (the next may
        # start while the previous one is outstanding), else one.
        self.depth = 2 if getattr(store, "ordered_commits", False) else 1
        # Transactions whose commit started and which are not yet done (commit and ACKs
        # resolved, progress reported), oldest first.
        self.outstanding: collections.deque[Txn] = collections.deque()
        self._read: asyncio.Future[Any | None] | None = None
        # Read-through of input sequenced to nothing while the previous transaction was still
        # resolving: reported with its progress (never persisted with its checkpoint).
        self._read_since: dict[str, int] = {}
        self._closed = False  # the source ended
        self._async_consume = inspect.iscoroutinefunction(app.consume_message)
        self._receive_acks = bool(getattr(app, "receive_acks", True))
        self._sequence_without_acks: Callable[[Any], Awaitable[Sequence[Envelope]]] | None = getattr(
            source, "sequence_without_acks", None)
        self._begin_finisher: BeginFinisher[Any, Any] | None = app if isinstance(app, BeginFinisher) else None

    async def run(self, recovered: pc.Checkpoint | None = None) -> None:
        """Re-publishes the recovered checkpoint's ACK intents, then runs transactions until
        the source ends; the open transaction is committed and awaited before returning."""
        intents = [AckIntent(j, i) for j, i in (recovered.ack_intents.items() if recovered else ())]
        # The recovered checkpoint stands as the previous transaction: its progress is the
        # shard's until the first transaction completes, and its intents are carried into
        # checkpoints until they are written.
        self.outstanding.clear()
        self.outstanding.append(Txn(commit=_resolved(), acks=self._acks(intents, _resolved()),
                                    intents={i.journal: i.intent for i in intents},
                                    checkpoint=recovered or pc.Checkpoint()))
        txn = Txn()
        failed: BaseException | None = None
        try:
            while True:
                txn = Txn()
                self.state = TxnState.IDLE
                while True:
                    nxt = await self._step(txn)
                    if nxt is None:
                        break
                    self.state = nxt
                if txn.consumed == 0:  # input ended and drained; every commit resolved
                    break
        except BaseException as err:
            # Raised below, after the clean-up: compiled, a coroutine must not suspend in an
            # except or finally block (a mypyc limitation, tests/unit/test_compiled_build.py).
            failed = err
        cancelled = isinstance(failed, asyncio.CancelledError)
        # Outcomes nobody will look at once the loop ended (a fenced zombie's commit and
        # the ACKs failing after it), marked seen before anything is awaited here: a
        # cancelled loop's await below re-raises its cancellation and skips what follows.
        for t in (*self.outstanding, txn):
            if t.commit is not None and cancelled:
                # A commit failing after the loop was cancelled is a fenced zombie's,
                # usually: said once, in one line (nothing else reports it, as the
                # loop's own failure reports a commit failing while it runs).
                t.commit.add_done_callback(functools.partial(
                    _report_commit, getattr(self.shard, "fqn", "?")))
            elif t.commit is not None:
                t.commit.add_done_callback(_retrieve)
            for f in t.acks:
                f.add_done_callback(_retrieve)
        if self._read is not None:
            await cancel_and_wait(self._read)
        if failed is not None:
            raise failed

    # -- steps ----------------------------------------------------------------------------

    async def _idle(self, txn: Txn) -> TxnState | None:
        self._settle()
        if self._read is not None and self._read.done():
            item = self._take()
            if item is not None:
                await self._consume(txn, item)
                if txn.consumed:
                    return TxnState.CONSUMING
                self._progress_while_idle()
                return TxnState.IDLE
        if self._closed:
            if not self.outstanding:
                return None  # nothing more will ever begin a transaction
            await self._wait(txn, read=False, deadline=None)
            return TxnState.IDLE
        await self._wait(txn, read=True, deadline=None)
        return TxnState.IDLE

    async def _consuming(self, txn: Txn) -> TxnState | None:
        cfg = self.config
        now = self.clock.now()
        min_done = now >= txn.began_at + cfg.min_duration
        max_done = now >= txn.began_at + cfg.max_duration
        if max_done:
            txn.reading = False
        self._settle()
        if txn.reading and self._read is not None and self._read.done():
            item = self._take()
            if item is not None:
                await self._consume(txn, item)
                return TxnState.CONSUMING
            txn.reading = False  # input ended: close once the conditions below allow
        barrier = self._barrier()
        if max_done and barrier is not None:
            txn.stalled_at = now
            return TxnState.STALLED
        blocks = (barrier is not None or not min_done or
                  (cfg.wait_for_ack and txn.reading and not max_done and self.source.has_pending()))
        if not blocks:
            return TxnState.COMMIT
        deadline = txn.began_at + (cfg.min_duration if not min_done else cfg.max_duration)
        await self._wait(txn, read=txn.reading, deadline=deadline)
        return TxnState.CONSUMING

    async def _stalled(self, txn: Txn) -> TxnState | None:
        self._settle()
        if self._barrier() is None:
            return TxnState.COMMIT
        await self._wait(txn, read=False, deadline=None)
        return TxnState.STALLED

    async def _commit(self, txn: Txn) -> TxnState | None:
        app, shard, store = self.app, self.shard, self.store
        try:
            await maybe_await(app.finalize_txn(shard, store, self.publisher))
        except Exception as err:
            raise TransactionError("finalize_txn", err) from err
        offsets, states = self.source.checkpoint(self.config.prune_horizon_ns)
        intents = self.publisher.build_ack_intents()
        txn.intents = {i.journal: i.intent for i in intents}
        # The intents of earlier transactions whose ACKs are not yet written are carried (a
        # later intent of the same journal supersedes an earlier one): should this checkpoint
        # be the one recovered, they are written then.
        carried: dict[str, bytes] = {}
        for t in self.outstanding:
            if not t.acked():
                carried.update(t.intents)
        carried.update(txn.intents)
        txn.checkpoint = build_checkpoint(offsets, states, list(carried.items()))
        try:
            commit = store.start_commit(shard, txn.checkpoint, list(self.pending_appends()))
        except Exception as err:
            raise TransactionError("start_commit", err) from err
        if commit.done() and commit.exception() is not None:  # failed at once: fail now
            raise TransactionError("start_commit", commit.exception())  # type: ignore[arg-type]
        txn.commit = commit
        txn.acks = self._acks(intents, commit)
        self.outstanding.append(txn)
        if self._begin_finisher is not None:
            self._begin_finisher.finished_txn(shard, store, commit)
        return None

    async def _step(self, txn: Txn) -> TxnState | None:
        """One step of the current state: the next state, or None once the transaction is
        done (committed, or nothing more will begin one)."""
        state = self.state
        if state is TxnState.CONSUMING:
            return await self._consuming(txn)
        if state is TxnState.IDLE:
            return await self._idle(txn)
        if state is TxnState.STALLED:
            return await self._stalled(txn)
        return await self._commit(txn)

    # -- helpers --------------------------------------------------------------------------

    async def _consume(self, txn: Txn, item: Any) -> None:
        app, shard, store, pub = self.app, self.shard, self.store, self.publisher
        if self._receive_acks:
            batch = await self.source.sequence(item)
        elif self._sequence_without_acks is not None:
            batch = await self._sequence_without_acks(item)
        else:
            # Acknowledgements are sequenced (they commit their producer's messages) but not
            # handed over; alone, they begin no transaction (read-through still passes them).
            batch = [env for env in await self.source.sequence(item) if not is_ack(env)]
        if not batch:
            return
        if txn.consumed == 0:
            if self._prepare_txn is not None:
                try:
                    await maybe_await(self._prepare_txn(shard))
                except Exception as err:
                    raise TransactionError("prepare_txn", err) from err
            if self._begin_finisher is not None:
                try:
                    await maybe_await(self._begin_finisher.begin_txn(shard, store))
                except Exception as err:
                    raise TransactionError("begin_txn", err) from err
            txn.began_at = self.clock.now()
        env: Envelope | None = None
        try:
            if self._async_consume:
                consume_async = cast(Callable[..., Awaitable[None]], app.consume_message)
                for env in batch:
                    await consume_async(shard, store, env, pub)
            else:
                consume = app.consume_message
                for env in batch:
                    consume(shard, store, env, pub)
        except Exception as err:
            where = f" (message of {env.journal} at offset {env.begin})" if env is not None else ""
            raise TransactionError(f"consume_message{where}", err) from err
        txn.consumed += len(batch)
        txn.consumed_bytes += sum(e.end - e.begin for e in batch)

    def _take(self) -> Any | None:
        """The finished read's content (re-armed on the next wait); None marks the end."""
        assert self._read is not None
        read, self._read = self._read, None
        item = read.result()
        if item is None:
            self._closed = True
        return item

    def _acks(self, intents: Sequence[AckIntent], after: OpFuture) -> list[asyncio.Future[Any]]:
        return [asyncio.ensure_future(a) for a in self.write_acks(intents, after)] if intents else []

    def _barrier(self) -> asyncio.Future[Any] | None:
        """What the next commit waits for (None: it may start). A commit starts once fewer
        than ``depth`` commits are unresolved, and fewer than ``depth + 1`` transactions are
        outstanding: the ACKs of the previous one need not be written (its intents are carried
        in the checkpoint meanwhile), but the one before must be done."""
        out = self.outstanding
        unresolved = 0
        first: asyncio.Future[Any] | None = None
        for t in out:
            if t.commit is not None and not t.commit.done():
                unresolved += 1
                if first is None:
                    first = t.commit
        if unresolved >= self.depth:
            return first
        if len(out) > self.depth:
            return self._pending_of(out[0])
        return None

    @staticmethod
    def _pending_of(t: Txn) -> asyncio.Future[Any] | None:
        """A transaction's next unresolved future: its commit, then each ACK."""
        if t.commit is not None and not t.commit.done():
            return t.commit
        return next((a for a in t.acks if not a.done()), None)

    def _settle(self) -> None:
        """Acts on what of the outstanding transactions resolved: a failure fails the loop;
        each one done (commit and ACKs), oldest first, has its progress reported."""
        out = self.outstanding
        for t in out:
            if t.commit is not None and t.commit.done():
                if t.commit.exception() is not None:
                    raise TransactionError("commit", t.commit.exception())  # type: ignore[arg-type]
                if t.committed_at is None:
                    t.committed_at = self.clock.now()
            for a in t.acks:
                if a.done() and a.exception() is not None:
                    raise TransactionError("ack", a.exception())  # type: ignore[arg-type]
        while out and self._pending_of(out[0]) is None:
            self._report(out.popleft())

    def _report(self, t: Txn) -> None:
        """Reports a done transaction's progress (and, once none is outstanding, the input
        sequenced to nothing meanwhile)."""
        if self.on_progress is not None:
            read_through = {j: s.read_through for j, s in t.checkpoint.sources.items()}
            if not self.outstanding:
                read_since, self._read_since = self._read_since, {}
                for j, o in read_since.items():
                    read_through[j] = max(o, read_through.get(j, 0))
            publish_at: dict[str, int] = {}
            for a in t.acks:
                resp = a.result()
                commit = getattr(resp, "commit", None)
                if commit is not None and commit.journal:
                    publish_at[commit.journal] = commit.end
            self.on_progress(read_through, publish_at)
        if self.on_txn is not None and t.consumed:
            self.on_txn(t)

    def _progress_while_idle(self) -> None:
        """Reports that input which began no transaction was read: messages the sequencer
        discarded (a duplicate re-append, a rolled-back transaction, an ACK of nothing new), or
        the first messages of a producer's still-open transaction. Without this, read-through
        stops before a tail of such messages for good, and a Stat (or a resolution) waiting on
        offsets past them, or a lag monitor, waits forever (Gazette's ``txnRead``). While the
        previous transaction still resolves, the offsets wait for its progress report. Nothing
        is persisted: the next checkpoint records them, with the sequencer's state."""
        through = self.source.sequenced_through()
        if not through:
            return
        if self.outstanding:
            for j, o in through.items():
                self._read_since[j] = max(o, self._read_since.get(j, 0))
        elif self.on_progress is not None:
            self.on_progress(dict(through), {})

    async def _wait(self, txn: Txn, *, read: bool, deadline: float | None) -> None:
        """Waits for the first of: a batch (if ``read``), the deadline, the barrier, the oldest
        outstanding transaction's next future."""
        waits: set[asyncio.Future[Any]] = set()
        if read and not self._closed:
            if self._read is None:
                self._read = asyncio.ensure_future(self.source.read())
            waits.add(self._read)
        # The next commit's barrier, and the oldest outstanding transaction's next future:
        # its progress is reported as it resolves, whether or not a commit waits for it.
        for f in (self._barrier(), self._pending_of(self.outstanding[0]) if self.outstanding else None):
            if f is not None:
                waits.add(f)
        timer = asyncio.ensure_future(self.clock.sleep_until(deadline)) if deadline is not None else None
        if timer is not None:
            waits.add(timer)
        if not waits:
            return
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if timer is not None:
                timer.cancel()


def _report_commit(fqn: str, f: asyncio.Future[Any]) -> None:
    """Logs, in one line, a commit that failed after its loop ended (and marks it seen)."""
    if not f.cancelled() and (err := f.exception()) is not None:
        log.warning("shard %s: a commit outstanding as its transactions ended failed: %s", fqn, err)


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Marks a future's outcome as seen (its error was reported through the loop's failure)."""
    if not f.cancelled():
        f.exception()


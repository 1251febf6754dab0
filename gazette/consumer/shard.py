"""One shard's life as primary in this process (Gazette's ``consumer/shard.go``, primary half).

Becoming primary: the application's store is built and its checkpoint restored (which fences
any previous primary's store), the source journals are listed for their framings, the
checkpoint's ACK intents are re-published, the shard's status is written PRIMARY, and the
transaction loop runs over a ``ShardSource`` starting at the checkpoint. The shard ends when
it leaves this process (cancelled) or fails: any error of the application, the store or the
inputs is written as a FAILED status with its text, and ends this shard alone.

Invariants:

* Each shard has its own ``AppendService`` (as Gazette's): a journal failed for the life of a
  service by one shard's failed append (a fenced recovery log fails the ACKs that depend on
  it) fails no other shard. It is closed as the shard ends (5 s for queued appends, then
  aborted).
* The store is destroyed and the readers stopped on every ending.
* Per-shard state: once the store is built and its checkpoint restored, the app's
  ``new_shard_state(shard, store)`` (if it has one) is called, before the readers start and
  any other callback; its result is ``state`` for this runtime's life, the same object in every
  callback. It is dropped as the shard ends (left, or failed: ``state`` then raises), with the
  store. A runtime is one start of the shard: the process makes a new one (and so a new state)
  each time the shard starts here again.
* ``assignment`` is set by the process from its keyspace on every reconciliation, so it follows
  the keyspace (status writes included).
* ``progress()`` is the read-through and publish-at offsets of the last completed
  transaction, its read-through extended past input sequenced to nothing since (discarded
  duplicates, rolled-back transactions): what Stat's read-your-writes and ``--lag`` use.
* With a recovery log (``recovery_log_prefix``), the store is first recovered: the log is played
  from the shard's hints into a fresh directory (or a hot standby's player, already tailing, is
  taken over), a hand-off fences the previous primary, and ``new_store`` gets the ``Recorder``.
  Hints are written after recovery, every ``hint_interval`` seconds after a committed
  transaction, and when the shard leaves; a store without a log gets ``recorder=None``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from gazette.client import AppendService, JournalClient, list_journals
from gazette.client.journal_client import label_selector
from gazette.consumer import metrics
from gazette.consumer.errors import ShardStateError
from gazette.consumer.interfaces import (
    Application,
    Assignment,
    MessageProducer,
    OpFuture,
    maybe_await,
)
from gazette.consumer.recovery import HintsStore, new_player, recover
from gazette.consumer.source import ShardSource
from gazette.consumer.transaction import TransactionLoop, Txn, TxnConfig
from gazette.errors import GazetteError
from gazette.lean_event import LeanEvent
from gazette.message import Publisher
from gazette.message.publisher import AckIntent
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import FSMHints, Player, Recorder, RecoveryLogError
from gazette.tasks import Supervisor, cancel_and_wait

__all__ = ["ShardRuntime"]

log = logging.getLogger(__name__)

StatusWriter = Callable[[str, pc.ReplicaStatus], Awaitable[None]]
S = TypeVar("S")

_NO_STATE: Any = object()  # before new_shard_state made the state, and after the shard ended


class ShardRuntime(Generic[S]):
    """A shard assigned to this process as primary (implements the ``Shard[S]`` role)."""

    def __init__(self, fqn: str, spec: pc.ShardSpec, app: Application[Any, Any, Any], client: JournalClient,
                 write_status: StatusWriter, *, assignment: Assignment | None = None,
                 hints: HintsStore | None = None, player: Player | None = None,
                 hint_interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.fqn = fqn
        self.spec = spec
        self.app = app
        self.journal_client = client
        # The shard's own appends (its publishes, ACKs): a journal that an append of this shard
        # failed for good (a fenced recovery log failed its dependants) fails only this shard's
        # later appends, never another shard's of this process.
        self.service = AppendService(client)
        self.stopping = LeanEvent()
        self.ready = LeanEvent()  # set once the checkpoint is restored and the loop runs
        self.store: Any = None
        # This process's assignment, as the keyspace holds it: the process sets it anew on
        # every reconciliation (after each keyspace update).
        self.assignment = assignment if assignment is not None else Assignment()
        self._state: S = _NO_STATE
        self._state_phase = "before new_shard_state made it"
        self.recovered_hints: FSMHints | None = None  # what the store was recovered from
        self.recorder: Recorder | None = None
        self.hints = hints
        self.player = player  # a hot standby's player, taken over on promotion
        self._hint_interval = hint_interval
        self._clock = clock
        self._hints_at = clock()
        self._hints_task: asyncio.Task[bool] | None = None
        # The shard's own background tasks (hint writes): none outlives the shard.
        self._tasks = Supervisor(f"shard {spec.id}", "log")
        self._write_status = write_status
        self._source: ShardSource | None = None
        self._read_through: dict[str, int] = {}
        self._publish_at: dict[str, int] = {}
        self.progressed = LeanEvent()  # set (and renewed) on each completed transaction

    @property
    def done(self) -> asyncio.Event:
        """Deprecated alias of ``stopping`` (one event had two names)."""
        warnings.warn("Shard.done is deprecated: use Shard.stopping", DeprecationWarning, stacklevel=2)
        return self.stopping

    @property
    def state(self) -> S:
        """The app's state of this start of the shard (see the module docstring)."""
        state = self._state
        if state is _NO_STATE:
            raise ShardStateError(f"shard {self.spec.id}: shard.state was read {self._state_phase}")
        return state

    def progress(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        return dict(self._read_through), dict(self._publish_at)

    def _on_progress(self, read_through: Mapping[str, int], publish_at: Mapping[str, int]) -> None:
        self._read_through.update(read_through)
        self._publish_at.update(publish_at)
        sid, heads = self.spec.id, self._source.write_heads if self._source is not None else {}
        for journal, offset in read_through.items():
            metrics.READ_HEAD.labels(sid, journal).set(offset)
            if journal in heads:
                metrics.READ_LAG.labels(sid, journal).set(max(0, heads[journal] - offset))
        signal, self.progressed = self.progressed, LeanEvent()
        signal.set()

    def _on_txn(self, txn: Txn) -> None:
        sid = self.spec.id
        if (self.recorder is not None and self._clock() - self._hints_at >= self._hint_interval
                and (self._hints_task is None or self._hints_task.done())):
            self._start_hints_write()
        metrics.TXN_TOTAL.labels(sid).inc()
        metrics.READ_MESSAGES.labels(sid).inc(txn.consumed)
        metrics.READ_BYTES.labels(sid).inc(txn.consumed_bytes)
        if txn.committed_at is not None:
            metrics.TXN_SECONDS.labels(sid).observe(max(0.0, txn.committed_at - txn.began_at))

    def _start_hints_write(self) -> asyncio.Task[bool] | None:
        """Snapshots the recorder's hints (between batches) and starts writing them; None when
        there is nothing to write now (no log, a failed recorder, a batch pending)."""
        if self.recorder is None or self.hints is None or self.recorder.failed is not None:
            return None
        try:
            # Commits overlap (the store's are ordered), so a batch is in flight most of the
            # time: hints naming it are stored once it (and any before it) committed.
            hints = self.recorder.build_pending_hints()
        except RecoveryLogError:
            return None  # ops are buffered, not yet taken by a flush: next transaction
        self._hints_at = self._clock()
        task = self._hints_task = self._tasks.spawn("storing recovery-log hints",
                                                    self._store_hints(self.recorder, self.hints, hints))
        return task

    async def _store_hints(self, recorder: Recorder, store: HintsStore, hints: FSMHints) -> bool:
        try:
            await recorder.settled()
        except RecoveryLogError:
            return False  # a batch they name never committed; the shard fails on its own
        return await store.store_recorded(hints, self.assignment)

    def _write_acks(self, intents: Sequence[AckIntent], after: OpFuture) -> list[Any]:
        out = []
        for it in intents:
            h = self.service.start_append(it.journal, [after])
            h.write(it.intent)
            h.release()
            out.append(h)
        return out

    async def run_primary(self) -> None:
        """Runs the shard as primary until it is cancelled or fails (see the module docstring)."""
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the shard fails alone, with the error's text
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Stopped (its assignment left) while something failed on the way out, e.g. a
                # commit fenced by the next primary: not a failure of the shard, and the
                # cancellation is not swallowed.
                log.info("shard stopped", extra={"shard": self.spec.id, "err": str(err)})
                raise asyncio.CancelledError() from err
            log.warning("shard failed", extra={"shard": self.spec.id, "err": str(err)})
            await self._write_status(self.spec.id, pc.ReplicaStatus(
                code=pc.ReplicaStatus.FAILED, errors=[f"{type(err).__name__}: {err}"]))
        finally:
            try:
                await self._close_appends()
            finally:
                await self._tasks.aclose()
                self.stopping.set()

    async def _close_appends(self) -> None:
        """Lets the shard's queued appends (ACKs of committed transactions) finish for up to
        5 s, then aborts the rest: a next primary re-publishes the checkpoint's ACK intents."""
        closed = False
        try:
            async with asyncio.timeout(5.0):
                await self.service.close()
            closed = True
        except TimeoutError:
            log.warning("shard's appends did not finish within 5 s of its end; aborted",
                        extra={"shard": self.spec.id})
        except GazetteError as err:  # close() stopped the service; the failure failed its txn
            closed = True
            log.info("appends failed as the shard ended", extra={"shard": self.spec.id, "err": str(err)})
        finally:
            if not closed:
                await self.service.abort()

    async def _recover(self) -> Recorder | None:
        if not self.spec.recovery_log_prefix or self.hints is None:
            return None
        player = self.player
        if player is None:
            player = self.player = await new_player(self.journal_client, self.spec, await self.hints.pick())
        recorder = self.recorder = await recover(player, self.spec)
        self.recovered_hints = recorder.fsm.build_hints(recorder.log)
        return recorder

    async def _run(self) -> None:
        try:
            recorder = await self._recover()
            store = self.store = await maybe_await(self.app.new_store(self, recorder))
        except BaseException:
            if self.player is not None:
                await self.player.aclose()
            raise
        try:
            checkpoint: pc.Checkpoint = await maybe_await(store.restore_checkpoint(self))
            new_state = getattr(self.app, "new_shard_state", None)
            self._state = cast(S, await maybe_await(new_state(self, store)) if new_state is not None else None)
            if recorder is not None and self.hints is not None and self.recovered_hints is not None:
                await self.hints.store_recovered(self.recovered_hints, self.assignment)
            sel = label_selector(include=[("name", src.journal) for src in self.spec.sources])
            journals = {j.spec.name: j.spec for j in (await list_journals(self.journal_client, sel)).journals}
            missing = [s.journal for s in self.spec.sources if s.journal not in journals]
            if missing:
                raise LookupError(f"source journals {missing} of shard {self.spec.id} do not exist")
            producer = replay = None
            if isinstance(self.app, MessageProducer):
                app = self.app
                producer = app.start_reading_messages(self, store, checkpoint)
                replay = lambda j, b, e: app.replay_range(self, store, j, b, e)  # noqa: E731
            source = self._source = ShardSource(self.journal_client, self.spec, journals, self.app.new_message,
                                                checkpoint, producer=producer, replay=replay)
            loop = TransactionLoop(
                self, self.app, store, Publisher(self.service), source,
                config=TxnConfig.from_spec(self.spec), write_acks=self._write_acks,
                pending_appends=self.service.pending_except, on_progress=self._on_progress,
                on_txn=self._on_txn)
            await self._write_status(self.spec.id, pc.ReplicaStatus(code=pc.ReplicaStatus.PRIMARY))
            source.start()
            self.ready.set()
            try:
                await loop.run(checkpoint)
            finally:
                await source.aclose()
                await self._final_hints()
        finally:
            # Dropped with the store: a restart of the shard starts from the store alone.
            self._state, self._state_phase = _NO_STATE, "after the shard ended"
            try:
                await _settle("closing the store", store.destroy(), self.spec.id)
            finally:
                if self.player is not None:
                    await self.player.aclose()  # its playback ended; removes its directory

    async def _final_hints(self) -> None:
        """Writes the hints as the shard leaves (often while it is being cancelled: the write
        gets 5 s, then is cancelled), after a write in progress."""
        if self._hints_task is not None and not self._hints_task.done():
            await asyncio.wait([self._hints_task])
        task = self._start_hints_write()
        if task is not None:
            await _settle("storing recovery-log hints", task, self.spec.id, report=False)


async def _settle(step: str, closing: Awaitable[Any] | None, shard: str, *, within: float = 5.0,
                  report: bool = True) -> None:
    """Awaits ``closing`` (a store's close, the last hint write: the shard's own) for up to
    ``within`` seconds, then cancels it. Its failure is logged (unless its owner reports it):
    the shard is ending anyway. Re-raises the shard's own cancellation once it settled."""
    if closing is None:
        return
    task = asyncio.ensure_future(closing)
    done, _ = await asyncio.wait([task], timeout=within)
    if not done:
        log.warning("a step of a shard's end did not finish in time; cancelled",
                    extra={"shard": shard, "step": step, "within": within})
    elif report and not task.cancelled() and task.exception() is not None:
        log.warning("a step of a shard's end failed",
                    extra={"shard": shard, "step": step, "err": str(task.exception())})
    await cancel_and_wait(task)  # a no-op once it ended


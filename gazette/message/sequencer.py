"""The Sequencer: from read-uncommitted messages to exactly-once, read-committed ones.

Read-uncommitted envelopes, in journal order, are fed to :meth:`Sequencer.queue_uncommitted`.
Each may commit a sequence of messages of one producer: an OUTSIDE_TXN message commits
itself; an ACK_TXN commits that producer's pending CONTINUE_TXN messages with clocks up to
its own and rolls back those above it. The caller then calls :meth:`Sequencer.step` until
it returns None, receiving each committed message exactly once, in the order read.

No head-of-line blocking: a commit is delivered as soon as its ACK is read, even while
other producers' transactions interleaved with it are still open.

Committed messages are usually served from a ring buffer of recently read envelopes. A
sequence that began before the oldest ring entry (a long transaction, or one begun before a
checkpoint was restored) needs a *replay*: ``queue_uncommitted`` returns
``QueueOutcome.ACK_COMMIT_REPLAY``, :meth:`Sequencer.replay_range` names the journal and
``[begin, end)`` offsets to re-read, and the caller hands an iterator of those re-read
envelopes to :meth:`Sequencer.start_replay` before stepping.

Invariants (the semantics of Gazette's sequencer, case for case):

* Per (journal, producer) a partial sequence keeps ``min_clock`` (exclusive: the last
  acknowledged clock), ``max_clock`` (inclusive: the largest clock of the open sequence)
  and ``begin`` (offset of its first message, -1 if none is open). A message at or below
  ``min_clock`` is a duplicate and is dropped.
* ``offsets[journal]`` is the read-through offset a restarted reader resumes from. It is
  not advanced past a committing message until its whole sequence has been stepped
  through, so a restored sequencer re-reads the commit and emits what is left of it.
* A zero UUID (clock 0) is delivered at once and never tracked.
* ``checkpoint`` states restore a Sequencer that emits exactly what the original would.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import ReplayError
from .message import Envelope
from .uuid import ProducerID, UUIDColumns, uuid_columns_of_ints

__all__ = ["ProducerState", "QueueOutcome", "Sequencer"]

log = logging.getLogger(__name__)

_U48: Final = (1 << 48) - 1
_U64: Final = (1 << 64) - 1
_FLAGS_MASK: Final = 0x3FF
_OUTSIDE, _CONTINUE, _ACK = 0, 1, 2

# A partial sequence is keyed by (journal, producer id as a 48-bit int): ints hash and
# compare faster than 6-byte strings on the per-message path.
_JournalProducer = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ProducerState:
    """A producer's state within a journal, as kept in consumer checkpoints."""

    journal: str
    producer: ProducerID
    #: Clock of the producer's last ACK_TXN or OUTSIDE_TXN message.
    last_ack: int
    #: Offset of the first CONTINUE_TXN message after ``last_ack`` (the start of the open
    #: transaction), or -1 if none is open.
    begin: int


class QueueOutcome(enum.IntEnum):
    """What :meth:`Sequencer.queue_uncommitted` decided about a message."""

    #: An OUTSIDE_TXN message already acknowledged: ignored.
    OUTSIDE_ALREADY_ACKED = 0
    #: An OUTSIDE_TXN message committed: step to dequeue it.
    OUTSIDE_COMMIT = 1
    #: A CONTINUE_TXN message already acknowledged: ignored.
    CONTINUE_ALREADY_ACKED = 2
    #: A CONTINUE_TXN message at or below the open transaction's largest clock: ignored.
    CONTINUE_TXN_CLOCK_LARGER = 3
    #: A CONTINUE_TXN message opening a transaction of its producer.
    CONTINUE_BEGIN_SPAN = 4
    #: A CONTINUE_TXN message extending its producer's open transaction.
    CONTINUE_EXTEND_SPAN = 5
    #: An ACK_TXN at or below the last acknowledged clock: the open transaction rolls back.
    ACK_ROLLBACK = 6
    #: An ACK_TXN committing no preceding message: step to dequeue it.
    ACK_EMPTY = 7
    #: An ACK_TXN committing a sequence held wholly in the ring: step to dequeue it.
    ACK_COMMIT_RING = 8
    #: An ACK_TXN committing a sequence partly evicted from the ring: replay, then step.
    ACK_COMMIT_REPLAY = 9


# Members bound to module names: looking one up on the enum class costs ~0.1 µs, and the
# per-message path names several.
_OUTSIDE_ALREADY_ACKED: Final = QueueOutcome.OUTSIDE_ALREADY_ACKED
_OUTSIDE_COMMIT: Final = QueueOutcome.OUTSIDE_COMMIT
_CONTINUE_ALREADY_ACKED: Final = QueueOutcome.CONTINUE_ALREADY_ACKED
_CONTINUE_TXN_CLOCK_LARGER: Final = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_CONTINUE_BEGIN_SPAN: Final = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN: Final = QueueOutcome.CONTINUE_EXTEND_SPAN
_ACK_ROLLBACK: Final = QueueOutcome.ACK_ROLLBACK
_ACK_EMPTY: Final = QueueOutcome.ACK_EMPTY
_ACK_COMMIT_RING: Final = QueueOutcome.ACK_COMMIT_RING
_ACK_COMMIT_REPLAY: Final = QueueOutcome.ACK_COMMIT_REPLAY

_IGNORED: Final = frozenset(
    {_OUTSIDE_ALREADY_ACKED, _CONTINUE_ALREADY_ACKED, _CONTINUE_TXN_CLOCK_LARGER}
)
# Outcomes leaving nothing to dequeue.
_NOTHING_TO_DEQUEUE: Final = _IGNORED | {_CONTINUE_BEGIN_SPAN, _CONTINUE_EXTEND_SPAN, _ACK_ROLLBACK}


@dataclass(slots=True)
class _Partial:
    """A partially read sequence of one producer in one journal."""

    jp: _JournalProducer
    min_clock: int  # Exclusive minimum: the last acknowledged clock.
    max_clock: int  # Inclusive maximum clock of the open sequence.
    begin: int  # See ProducerState.begin.
    ring_start: int = -1  # First ring index of the sequence (inclusive), or -1.
    ring_stop: int = -1  # Last ring index of the sequence (inclusive), or -1.


def _uuid_int(msg: Any) -> int:
    v = getattr(msg, "uuid_int", None)
    if v is None:
        v = msg.get_uuid().int
    assert isinstance(v, int)
    return v


def _uuid_parts(env: Envelope) -> tuple[int, int, int]:
    """(producer, clock, flags) of an envelope's message UUID."""
    v = _uuid_int(env.message)
    clock = (
        (((v >> 96) & 0xFFFFFFFF) << 4)
        | (((v >> 80) & 0xFFFF) << 36)
        | (((v >> 64) & 0xFFFF) << 52)
        | ((v >> 58) & 0xF)
    ) & _U64
    return v & _U48, clock, (v >> 48) & _FLAGS_MASK


class Sequencer:
    """Sequences read-uncommitted envelopes into exactly-once, committed ones.

    ``offsets`` and ``states`` restore a checkpoint (see :meth:`checkpoint`); ``ring_size``
    is how many recent envelopes are kept to serve commits without a replay.
    """

    def __init__(
        self,
        offsets: Mapping[str, int] | None = None,
        states: Iterable[ProducerState] = (),
        ring_size: int = 4096,
    ) -> None:
        self._capacity = max(ring_size, 1)
        #: The envelope last stepped to, or None when not dequeuing.
        self.dequeued: Envelope | None = None
        # Clock of |dequeued|, taken when it was read: the application may change the
        # message UUID (by publishing it, say) before stepping on.
        self._dequeued_clock = 0
        self._dequeued_slot = -1  # Ring index of |dequeued|, or -1 if it was replayed.
        self.offsets: dict[str, int] = dict(offsets or {})
        self.partials: dict[_JournalProducer, _Partial] = {}
        # The same partials by journal, then by producer: queue_and_drain looks a partial
        # up by producer alone, sparing a key tuple per message.
        self._by_journal: dict[str, dict[int, _Partial]] = {}
        # Partial sequences begun since the last checkpoint.
        self._pending: set[_JournalProducer] = set()
        self._emit: _Partial | None = None  # The committed sequence being dequeued.
        self._replay: Iterator[Envelope] | None = None
        # The ring: envelopes, the next index of the same partial sequence (-1 ends it),
        # and per entry the clock and partial key, read once when queued. Clock and key
        # are meaningful only while the slot holds an envelope.
        self.ring: list[Envelope | None] = []
        self.next: list[int] = []
        self._ring_clock: list[int] = []
        self._ring_jp: list[_JournalProducer | None] = []
        self.head = 0

        for state in states:
            jp = (state.journal, int.from_bytes(state.producer, "big"))
            self._index(_Partial(jp, state.last_ack, state.last_ack, state.begin))

    def _index(self, partial: _Partial) -> None:
        jp = partial.jp
        self.partials[jp] = partial
        by_producer = self._by_journal.get(jp[0])
        if by_producer is None:
            by_producer = self._by_journal[jp[0]] = {}
        by_producer[jp[1]] = partial

    # -- queueing -------------------------------------------------------------------------

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        """Apply the next read-uncommitted envelope. Must not be called while committed
        messages remain to be stepped through."""
        if self._emit is not None:
            raise RuntimeError("queue_uncommitted called while committed messages remain to step")
        self._evict_at_head()
        producer, clock, flags = _uuid_parts(env)
        return self._queue(env, producer, clock, flags)

    def queue_and_drain(
        self,
        envs: Sequence[Envelope],
        out: list[Envelope],
        start: int = 0,
        uuids: UUIDColumns | None = None,
    ) -> int:
        """Queue ``envs[start:]`` in order, as :meth:`queue_uncommitted` would, taking each
        committed sequence whole into ``out`` as :meth:`drain_committed` would.

        Returns the index just past the last envelope queued: ``len(envs)``, or sooner
        after an envelope whose outcome was ACK_COMMIT_REPLAY, whose sequence is then left
        to :meth:`replay_range`, :meth:`start_replay` and :meth:`drain_committed`.
        ``uuids`` are the UUID fields of every message of ``envs`` (from
        :attr:`MessageBatch.uuids <gazette.message.message.MessageBatch.uuids>`), read
        from the messages when not given.

        The same state changes, case for case, as the per-envelope calls; the common
        outcomes (an OUTSIDE_TXN commit of a producer with no open transaction, an ignored
        duplicate, a CONTINUE_TXN extending a span) are applied inline, with the ring and
        the envelope's partial in locals, and the rest by the general path.
        """
        if self._emit is not None:
            raise RuntimeError("queue_and_drain called while committed messages remain to step")
        stop = len(envs)
        if start >= stop:
            return stop
        if uuids is None:
            uuids = uuid_columns_of_ints([_uuid_int(e.message) for e in envs])
        producers, clocks, all_flags = uuids
        ring, nxt, ring_clock, ring_jp = self.ring, self.next, self._ring_clock, self._ring_jp
        capacity = self._capacity
        filling = len(ring) < capacity
        head = self.head
        offsets, pending, by_journal = self.offsets, self._pending, self._by_journal
        add = out.append
        journal: str | None = None
        by_producer: dict[int, _Partial] = {}
        # |offsets[journal]| is owed this value for envelopes handled inline (each would
        # have set it to its own end): written once, before the general path and at exit.
        owed = -1

        i = start
        while i < stop:
            env = envs[i]
            producer, clock, flags = producers[i], clocks[i], all_flags[i]
            i += 1
            if env.journal is not journal:
                if owed != -1:
                    offsets[journal] = owed  # type: ignore[index]
                    owed = -1
                journal = env.journal
                by_producer = by_journal.get(journal) or by_journal.setdefault(journal, {})

            # _evict_at_head, inline: it has nothing to do unless a slot still holds an
            # envelope (one not yet committed or rolled back).
            if filling:
                if len(ring) == head:
                    ring.append(None)
                    nxt.append(-1)
                    ring_clock.append(0)
                    ring_jp.append(None)
                    filling = len(ring) < capacity
            elif ring[head] is not None:
                self._evict(head)

            if clock != 0:
                p = by_producer.get(producer)
                if flags == _OUTSIDE:
                    if p is None or (p.begin == -1 and p.ring_stop == -1 and clock > p.min_clock):
                        # OUTSIDE_COMMIT of this message alone: added at |head|, then
                        # released as it is delivered (so the slot stays empty), and the
                        # partial is left at its clock.
                        if p is None:
                            self._index(_Partial((journal, producer), clock, clock, -1))
                        else:
                            p.min_clock = p.max_clock = clock
                            if pending:
                                pending.discard(p.jp)
                        nxt[head] = -1
                        head += 1
                        if head == capacity:
                            head = 0
                        add(env)
                        owed = env.end
                        continue
                    if clock <= p.min_clock:
                        owed = env.end  # OUTSIDE_ALREADY_ACKED
                        continue
                    # Else an open transaction is clobbered: the general path logs it.
                elif flags == _CONTINUE and p is not None:
                    if clock <= p.max_clock:
                        # CONTINUE_ALREADY_ACKED or CONTINUE_TXN_CLOCK_LARGER (a partial
                        # always has min_clock <= max_clock).
                        owed = env.end
                        continue
                    # CONTINUE_BEGIN_SPAN or CONTINUE_EXTEND_SPAN: _add_at_head, inline.
                    if p.begin == -1:
                        p.begin = env.begin
                        pending.add(p.jp)
                    ring[head] = env
                    nxt[head] = -1
                    ring_clock[head] = clock
                    ring_jp[head] = p.jp
                    if p.ring_stop == -1:
                        p.ring_start = head
                    else:
                        nxt[p.ring_stop] = head
                    p.ring_stop = head
                    p.max_clock = clock
                    head += 1
                    if head == capacity:
                        head = 0
                    owed = env.end
                    continue

            # The general path, for everything else (ACKs, zero UUIDs, new producers'
            # continuations, unexpected flags, mixed transactions).
            if owed != -1:
                offsets[journal] = owed
                owed = -1
            self.head = head
            outcome = self._queue(env, producer, clock, flags)
            head = self.head
            if outcome in _NOTHING_TO_DEQUEUE:
                continue
            if outcome is _ACK_COMMIT_REPLAY:
                return i
            self.drain_committed(out)

        if owed != -1:
            offsets[journal] = owed  # type: ignore[index]
        self.head = head
        return i

    def _queue(self, env: Envelope, producer: int, clock: int, flags: int) -> QueueOutcome:
        """queue_uncommitted, once the slot at |head| is evicted and the UUID read."""
        journal = env.journal
        jp = (journal, producer)
        real_clock = clock

        if clock == 0:
            # No UUID: commit at once, under a throw-away partial that is never indexed.
            partial = _Partial(jp, 0, 0, -1)
            flags, clock = _OUTSIDE, 1
        else:
            p = self.partials.get(jp)
            if p is None:
                p = _Partial(jp, clock - 1, clock - 1, -1)
                self._index(p)
            partial = p

        # Decide the outcome first; state changes follow in one place below.
        if flags == _CONTINUE:
            if clock <= partial.min_clock:
                outcome = _CONTINUE_ALREADY_ACKED
            elif clock <= partial.max_clock:
                outcome = _CONTINUE_TXN_CLOCK_LARGER
            elif partial.begin == -1:
                outcome = _CONTINUE_BEGIN_SPAN
            else:
                outcome = _CONTINUE_EXTEND_SPAN
        elif flags == _ACK:
            if clock < partial.min_clock:
                # An upstream producer restored a checkpoint older than one it had already
                # acknowledged: it will re-send, perhaps under new UUIDs, so accept the
                # reset (at-least-once for that span) rather than risk dropping messages.
                self._log_error(env, partial, "ACK_TXN below the last ACK (exactly-once lost)")
                outcome = _ACK_ROLLBACK
            elif clock == partial.min_clock:
                outcome = _ACK_ROLLBACK
            elif partial.begin == -1:
                outcome = _ACK_EMPTY
            elif partial.ring_start == -1:
                outcome = _ACK_COMMIT_REPLAY  # No part of it is in the ring.
            elif partial.begin != self.ring[partial.ring_start].begin:  # type: ignore[union-attr]
                outcome = _ACK_COMMIT_REPLAY  # Only its tail is in the ring.
            else:
                outcome = _ACK_COMMIT_RING
        else:
            if flags != _OUTSIDE:
                self._log_error(env, partial, f"unexpected UUID flags {flags:#x}")
            if clock <= partial.min_clock:
                outcome = _OUTSIDE_ALREADY_ACKED
            else:
                if partial.begin != -1:
                    self._log_error(
                        env,
                        partial,
                        "OUTSIDE_TXN after an open CONTINUE_TXN (mixed committed and "
                        "uncommitted publishing to one journal?)",
                    )
                outcome = _OUTSIDE_COMMIT

        # Each case either sets |_emit| or advances |offsets|, never both.
        if outcome in _IGNORED:
            # Ignored duplicates: only the read-through offset moves.
            self.offsets[journal] = env.end
        elif outcome == _CONTINUE_BEGIN_SPAN:
            partial.begin = env.begin
            self._pending.add(jp)
            self._add_at_head(env, partial, real_clock)
            partial.max_clock = clock
            self.offsets[journal] = env.end
        elif outcome == _CONTINUE_EXTEND_SPAN:
            self._add_at_head(env, partial, real_clock)
            partial.max_clock = clock
            self.offsets[journal] = env.end
        elif outcome == _ACK_ROLLBACK:
            partial.min_clock = partial.max_clock = clock
            partial.begin = partial.ring_start = partial.ring_stop = -1
            self._pending.discard(jp)
            self.offsets[journal] = env.end
        else:
            self._add_at_head(env, partial, real_clock)
            if outcome == _ACK_EMPTY:
                partial.begin = env.begin
            elif outcome == _OUTSIDE_COMMIT:
                # Any open CONTINUE_TXN sequence is clobbered: an effective rollback.
                partial.begin = env.begin
                partial.ring_start = partial.ring_stop
            # Commit through |clock|, which may be below the sequence's largest clock:
            # messages above it are dropped as the sequence is stepped through.
            partial.max_clock = clock
            self._emit = partial
        return outcome

    def open_clock(self, journal: str, producer: int) -> int | None:
        """The largest clock sequenced of ``producer`` (a 48-bit int) in ``journal``: None if
        the producer is unknown, -1 while it has an open sequence (pending or to dequeue)."""
        p = self.partials.get((journal, producer))
        if p is None:
            return None
        if p.begin != -1 or p.ring_stop != -1 or p is self._emit:
            return -1
        return p.max_clock

    def acknowledge(self, journal: str, producer: int, clock: int) -> None:
        """Record that the caller sequenced ``producer``'s messages of ``journal`` through
        ``clock`` itself, in journal order, leaving nothing open: the state is as if they had
        been queued and stepped through, the last committed at ``clock``. Precondition:
        :meth:`open_clock` is not -1, and is below ``clock``. (The read-through offset is
        the caller's to set, in :attr:`offsets`.)"""
        p = self.partials.get((journal, producer))
        if p is None:
            self._index(_Partial((journal, producer), clock, clock, -1))
        else:
            p.min_clock = p.max_clock = clock

    # -- dequeueing -----------------------------------------------------------------------

    def step(self) -> Envelope | None:
        """Step to the next committed envelope (also kept as :attr:`dequeued`), or return
        None once the committed sequence is exhausted."""
        emit = self._emit
        if emit is None:
            return None
        ring = self.ring
        if self.dequeued is None and self._replay is None:
            first = ring[emit.ring_start]
            if first is None or emit.begin != first.begin:
                raise RuntimeError("a replay is required: call start_replay before step")

        if self.dequeued is not None:
            # The application is done with |dequeued|: tighten the bound past it, so a
            # checkpoint taken now resumes after it.
            emit.min_clock = self._dequeued_clock
            if self._dequeued_slot != -1:
                ring[self._dequeued_slot] = None  # Release it; eviction skips empty slots.

        producer = emit.jp[1]
        while emit.ring_start != -1:
            replay = self._replay
            if replay is None:
                slot = emit.ring_start
                env = ring[slot]
                clock = self._ring_clock[slot]
                emit.ring_start = self.next[slot]
            else:
                try:
                    env = next(replay)
                except StopIteration:
                    self._replay = None  # Replay finished: continue from the ring.
                    continue
                except Exception as err:
                    raise ReplayError(f"replay reader: {err}") from err
                self._check_replayed(env, emit)
                env_producer, clock, _ = _uuid_parts(env)
                if env_producer != producer:
                    continue  # Another producer's message, interleaved in the journal.
                slot = -1
            assert env is not None

            if clock != 0 and clock <= emit.min_clock:
                # A duplicate: possible in replays, and when a replayed span shows up
                # again in the ring, or straddles a restored checkpoint.
                continue
            if clock > emit.max_clock:
                continue  # Above the acknowledged clock: rolled back.

            emit.begin = env.begin  # A checkpoint now resumes from here.
            self.dequeued = env
            self._dequeued_clock = clock
            self._dequeued_slot = slot
            return env

        # The sequence is done. Its commit did not advance |offsets| when queued (so a
        # restored sequencer reads it again and re-emits); advance them now.
        last = self.dequeued
        assert last is not None, "a committed sequence always includes its commit"
        self.offsets[emit.jp[0]] = last.end
        emit.max_clock = emit.min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        self._pending.discard(emit.jp)
        self.dequeued = None
        self._emit = None
        self._dequeued_clock = 0
        self._dequeued_slot = -1
        return None

    def drain_committed(self, out: list[Envelope]) -> None:
        """Append every envelope of the committed sequence to ``out``: the same as calling
        :meth:`step` until it returns None, for callers that never checkpoint part-way
        through a sequence. A sequence served wholly from the ring is walked in one loop."""
        emit = self._emit
        if emit is None:
            return
        if self.dequeued is not None or self._replay is not None:
            step = self.step
            while (env := step()) is not None:
                out.append(env)
            return

        ring, nxt, ring_clock = self.ring, self.next, self._ring_clock
        slot = emit.ring_start
        first = ring[slot]
        if first is None or first.begin != emit.begin:
            raise RuntimeError("a replay is required: call start_replay before step")
        # The same walk as step's over the ring: skip duplicates and rolled-back messages,
        # tightening the clock bound past each delivered one.
        min_clock, max_clock = emit.min_clock, emit.max_clock
        last = first
        add = out.append
        while slot != -1:
            env = ring[slot]
            clock = ring_clock[slot]
            here, slot = slot, nxt[slot]
            if (clock != 0 and clock <= min_clock) or clock > max_clock:
                continue
            assert env is not None
            add(env)
            ring[here] = None  # Released, as step releases what it delivered.
            min_clock, last = clock, env

        self.offsets[emit.jp[0]] = last.end
        emit.min_clock = emit.max_clock = min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        self._pending.discard(emit.jp)
        self._emit = None

    def dequeue_committed(self) -> Iterator[Envelope]:
        """Step through every committed envelope of the current sequence."""
        while (env := self.step()) is not None:
            yield env

    def _check_replayed(self, env: Envelope, emit: _Partial) -> None:
        journal, begin = emit.jp[0], emit.begin
        stop = self.ring[emit.ring_start].begin  # type: ignore[union-attr]
        if env.journal != journal:
            raise ReplayError(f"replay of wrong journal ({env.journal}; expected {journal})")
        if env.begin < begin:
            raise ReplayError(f"replay has wrong begin ({env.begin}; expected >= {begin})")
        if env.end > stop:
            raise ReplayError(f"replay has wrong end ({env.end}; expected <= {stop})")

    # -- replays --------------------------------------------------------------------------

    def replay_range(self) -> tuple[str, int, int]:
        """The journal and ``[begin, end)`` offsets to re-read for the pending commit."""
        emit = self._emit
        if emit is None:
            raise RuntimeError("replay_range called with no committed sequence to dequeue")
        # The commit was the last envelope added, so the ring holds at least it.
        first = self.ring[emit.ring_start]
        assert first is not None
        return emit.jp[0], emit.begin, first.begin

    def start_replay(self, envelopes: Iterable[Envelope]) -> None:
        """Supply the re-read envelopes of :meth:`replay_range` (read-uncommitted, in order)."""
        if self._emit is None:
            raise RuntimeError("start_replay called with no committed sequence to dequeue")
        self._replay = iter(envelopes)

    # -- checkpoints ----------------------------------------------------------------------

    def dequeuing(self) -> bool:
        """Whether a committed sequence remains to be stepped through (after
        :meth:`queue_and_drain` returned early: one to replay first)."""
        return self._emit is not None

    def has_pending(self) -> bool:
        """Whether a sequence was begun or extended since the last checkpoint: a hint that
        more of it is on its way."""
        return bool(self._pending)

    def checkpoint(self, prune_horizon_ns: int = 0) -> tuple[dict[str, int], list[ProducerState]]:
        """Read-through offsets and producer states to persist with a consumer checkpoint.

        Producers whose latest clock lags the most recent acknowledgement in their journal
        by more than ``prune_horizon_ns`` are forgotten (0 keeps all). Clears
        :meth:`has_pending`.
        """
        newest: dict[str, int] = {}
        for (journal, _), p in self.partials.items():
            if p.min_clock > newest.get(journal, 0):
                newest[journal] = p.min_clock
        # Clock units are 100 ns, above 4 bits of sequence counter.
        horizon = (prune_horizon_ns // 100) << 4
        floor = {j: max(c - horizon, 0) if prune_horizon_ns > 0 else 0 for j, c in newest.items()}
        states: list[ProducerState] = []
        for jp, p in list(self.partials.items()):
            if p.max_clock >= floor.get(jp[0], 0):
                states.append(
                    ProducerState(jp[0], ProducerID(jp[1].to_bytes(6, "big")), p.min_clock, p.begin)
                )
            else:
                del self.partials[jp]
                del self._by_journal[jp[0]][jp[1]]
        # Sequences pending now did not complete within this transaction; a following one
        # should not wait on them.
        self._pending.clear()
        return dict(self.offsets), states

    # -- the ring -------------------------------------------------------------------------

    def _evict_at_head(self) -> None:
        head = self.head
        if len(self.ring) < self._capacity:
            if len(self.ring) == head:  # Still filling: reserve the slot at |head|.
                self.ring.append(None)
                self.next.append(-1)
                self._ring_clock.append(0)
                self._ring_jp.append(None)
            return
        if self.ring[head] is not None:
            self._evict(head)
        # Else already evicted (or released once dequeued).

    def _evict(self, head: int) -> None:
        """Evict the envelope at |head| of a full ring."""
        jp = self._ring_jp[head]
        assert jp is not None
        p = self.partials.get(jp)
        # Only a sequence still starting at |head| is affected; usually the entry was
        # already committed or rolled back.
        if p is not None and p.ring_start == head:
            nxt = self.next[head]
            if p.ring_start == p.ring_stop and nxt == -1:
                p.ring_start = p.ring_stop = -1  # Nothing of it remains in the ring.
            elif p.ring_start != p.ring_stop and nxt != -1:
                p.ring_start = nxt
            else:
                raise AssertionError("ring invariant: ring_start == ring_stop iff next == -1")
        self.ring[head] = None
        self.next[head] = -1

    def _add_at_head(self, env: Envelope, partial: _Partial, clock: int) -> None:
        head = self.head
        self.ring[head] = env
        self.next[head] = -1
        self._ring_clock[head] = clock
        self._ring_jp[head] = partial.jp
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self.next[partial.ring_stop] = head
        partial.ring_stop = head
        self.head = (head + 1) % self._capacity

    def _log_error(self, env: Envelope, partial: _Partial, what: str) -> None:
        producer, clock, flags = _uuid_parts(env)
        log.error(
            "sequencer: %s (journal=%s begin=%d end=%d producer=%012x clock=%d flags=%#x "
            "min_clock=%d max_clock=%d partial_begin=%d)",
            what,
            env.journal,
            env.begin,
            env.end,
            producer,
            clock,
            flags,
            partial.min_clock,
            partial.max_clock,
            partial.begin,
        )

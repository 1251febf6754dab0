"""Sequencer tests.

The scenario tests reproduce, case for case, Gazette's message/sequencer_test.go (same
envelopes, same expected outcomes, ring layouts, partial states, replay ranges and
dequeued sequences). The state machine at the end checks the exactly-once property over
arbitrary interleavings.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    ZERO_UUID,
    Envelope,
    ProducerID,
    ProducerState,
    QueueOutcome,
    ReplayError,
    Sequencer,
    build_uuid,
    get_clock,
    get_producer_id,
)
from gazette.message.errors import UnexpectedEOFError
from gazette.message.sequencer import _Partial
from gazette.message.uuid import UUID, uuid_columns, uuid_columns_of_ints

Q = QueueOutcome
JOURNAL = "test/journal"

A = ProducerID(b"\x01\x00\x00\x00\x00\x0a")
B = ProducerID(b"\x01\x00\x00\x00\x00\x0b")
C = ProducerID(b"\x01\x00\x00\x00\x00\x0c")
ZERO_PRODUCER = ProducerID()


@dataclass
class TestMsg:
    __test__ = False  # Not a pytest test class.

    uuid: UUID
    s: str = ""
    serial: int = -1

    def get_uuid(self) -> UUID:
        return self.uuid

    def set_uuid(self, uuid: UUID) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> TestMsg:
        return TestMsg(ZERO_UUID)


Generate = Callable[[ProducerID, int, int], Envelope]


def new_generator() -> Generate:
    """Envelopes of 100 bytes each, 2 bytes apart: the sequencer must not assume
    contiguous envelopes."""
    offset = 0

    def generate(producer: ProducerID, clock: int, flags: int) -> Envelope:
        nonlocal offset
        env = Envelope(
            JOURNAL, offset, offset + 100, TestMsg(build_uuid(producer, clock, flags), str(clock))
        )
        offset += 102
        return env

    return generate


def zero_uuid(env: Envelope) -> Envelope:
    env.message.set_uuid(ZERO_UUID)
    return env


def jp(producer: ProducerID) -> tuple[str, int]:
    return (JOURNAL, int.from_bytes(producer, "big"))


def partial(
    producer: ProducerID,
    begin: int,
    ring_start: int,
    ring_stop: int,
    min_clock: int,
    max_clock: int,
) -> _Partial:
    return _Partial(jp(producer), min_clock, max_clock, begin, ring_start, ring_stop)


def queue(seq: Sequencer, *envs: Envelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(e) for e in envs]


# When set, expect_deque takes sequences whole through drain_committed (which must agree
# with stepping) instead of step by step.
DRAIN = False


@pytest.fixture(params=[False, True], ids=["step", "drain"])
def drain_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    global DRAIN
    DRAIN = request.param
    yield
    DRAIN = False


def expect_deque(seq: Sequencer, *expect: Envelope) -> None:
    if DRAIN:
        out: list[Envelope] = []
        seq.drain_committed(out)
        assert len(out) == len(expect) and all(a is b for a, b in zip(out, expect, strict=True))
    for i, env in enumerate(() if DRAIN else expect):
        assert seq.step() is env
        assert seq.dequeued is env
        assert seq._emit is not None
        assert seq._emit.begin == env.begin
        if i > 0:
            assert seq._emit.min_clock == get_clock(expect[i - 1].message.get_uuid())
    assert seq.step() is None
    assert seq.dequeued is None

    last = expect[-1]
    key = (last.journal, int.from_bytes(get_producer_id(last.message.get_uuid()), "big"))
    clock = get_clock(last.message.get_uuid())
    if clock != 0:
        # The partial sequence is reset, ready for the producer's next sequence.
        assert seq.partials[key] == _Partial(key, clock, clock, -1, -1, -1)
    # Reading through the commit is now reflected in offsets.
    assert seq.offsets[last.journal] == last.end


class ReplayIter:
    """Yields the given envelopes, then fails the test if asked again after exhaustion."""

    def __init__(self, envs: list[Envelope]) -> None:
        self.envs: list[Envelope] | None = list(envs)

    def __iter__(self) -> Iterator[Envelope]:
        return self

    def __next__(self) -> Envelope:
        if self.envs is None:
            raise AssertionError("unexpected extra replay call")
        if not self.envs:
            self.envs = None
            raise StopIteration
        return self.envs.pop(0)


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope) -> None:
    assert seq.replay_range() == (envs[0].journal, begin, end)
    seq.start_replay(ReplayIter(list(envs)))


def test_ring_add_and_evict() -> None:
    seq = Sequencer(ring_size=5)
    gen = new_generator()
    e1 = gen(A, 100, CONTINUE_TXN)
    e2 = gen(B, 200, CONTINUE_TXN)
    e3 = gen(A, 300, CONTINUE_TXN)
    e4 = gen(A, 400, CONTINUE_TXN)
    e5 = gen(B, 500, CONTINUE_TXN)
    e6 = gen(B, 600, CONTINUE_TXN)
    e7 = gen(B, 700, CONTINUE_TXN)
    e8 = gen(B, 800, CONTINUE_TXN)
    e9 = gen(B, 900, CONTINUE_TXN)
    e10 = gen(B, 1000, CONTINUE_TXN)
    e11 = gen(B, 1100, CONTINUE_TXN)

    assert seq.ring == [] and seq.next == [] and seq.head == 0
    assert seq.partials == {}
    assert not seq.has_pending()

    assert seq.queue_uncommitted(e1) == Q.CONTINUE_BEGIN_SPAN
    assert seq.ring == [e1] and seq.next == [-1] and seq.head == 1
    assert seq.partials == {jp(A): partial(A, e1.begin, 0, 0, 99, 100)}
    assert seq.has_pending()
    assert seq.offsets == {JOURNAL: e1.end}  # Continuations advance read-through offsets.

    assert seq.queue_uncommitted(e2) == Q.CONTINUE_BEGIN_SPAN
    assert seq.ring == [e1, e2] and seq.next == [-1, -1] and seq.head == 2
    assert seq.partials == {
        jp(A): partial(A, e1.begin, 0, 0, 99, 100),
        jp(B): partial(B, e2.begin, 1, 1, 199, 200),
    }
    assert len(seq._pending) == 2

    assert seq.queue_uncommitted(e3) == Q.CONTINUE_EXTEND_SPAN
    assert seq.ring == [e1, e2, e3] and seq.next == [2, -1, -1] and seq.head == 3
    assert seq.partials == {
        jp(A): partial(A, e1.begin, 0, 2, 99, 300),
        jp(B): partial(B, e2.begin, 1, 1, 199, 200),
    }

    assert seq.queue_uncommitted(e4) == Q.CONTINUE_EXTEND_SPAN
    assert seq.ring == [e1, e2, e3, e4] and seq.next == [2, -1, 3, -1] and seq.head == 4
    assert seq.partials == {
        jp(A): partial(A, e1.begin, 0, 3, 99, 400),
        jp(B): partial(B, e2.begin, 1, 1, 199, 200),
    }

    assert seq.queue_uncommitted(e5) == Q.CONTINUE_EXTEND_SPAN
    assert seq.ring == [e1, e2, e3, e4, e5] and seq.next == [2, 4, 3, -1, -1]
    assert seq.head == 0
    assert seq.partials == {
        jp(A): partial(A, e1.begin, 0, 3, 99, 400),
        jp(B): partial(B, e2.begin, 1, 4, 199, 500),
    }

    assert seq.queue_uncommitted(e6) == Q.CONTINUE_EXTEND_SPAN
    assert seq.ring == [e6, e2, e3, e4, e5] and seq.next == [-1, 4, 3, -1, 0]
    assert seq.head == 1
    assert seq.partials == {
        jp(A): partial(A, e1.begin, 2, 3, 99, 400),
        jp(B): partial(B, e2.begin, 1, 0, 199, 600),
    }

    assert queue(seq, e7, e8) == [Q.CONTINUE_EXTEND_SPAN, Q.CONTINUE_EXTEND_SPAN]
    assert seq.ring == [e6, e7, e8, e4, e5] and seq.next == [1, 2, -1, -1, 0]
    assert seq.head == 3
    assert seq.partials == {
        jp(A): partial(A, e1.begin, 3, 3, 99, 400),
        jp(B): partial(B, e2.begin, 4, 2, 199, 800),
    }

    assert seq.queue_uncommitted(e9) == Q.CONTINUE_EXTEND_SPAN  # Evicts A's last entry.
    assert seq.ring == [e6, e7, e8, e9, e5] and seq.next == [1, 2, 3, -1, 0]
    assert seq.head == 4
    assert seq.partials == {
        # A's begin is still tracked, though none of it remains in the ring.
        jp(A): partial(A, e1.begin, -1, -1, 99, 400),
        jp(B): partial(B, e2.begin, 4, 3, 199, 900),
    }

    assert seq.queue_uncommitted(e10) == Q.CONTINUE_EXTEND_SPAN
    assert seq.ring == [e6, e7, e8, e9, e10] and seq.next == [1, 2, 3, 4, -1]
    assert seq.head == 0
    assert seq.partials == {
        jp(A): partial(A, e1.begin, -1, -1, 99, 400),
        jp(B): partial(B, e2.begin, 0, 4, 199, 1000),
    }

    assert seq.queue_uncommitted(e11) == Q.CONTINUE_EXTEND_SPAN
    assert seq.ring == [e11, e7, e8, e9, e10] and seq.next == [-1, 2, 3, 4, 0]
    assert seq.head == 1
    assert seq.partials == {
        jp(A): partial(A, e1.begin, -1, -1, 99, 400),
        jp(B): partial(B, e2.begin, 1, 0, 199, 1100),
    }
    assert seq.offsets == {JOURNAL: e11.end}


@pytest.mark.usefixtures("drain_mode")
def test_txn_sequence_cases() -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=3)

    # Case: a sequence with internal duplicates, served from the ring.
    a1 = gen(A, 1, CONTINUE_TXN)
    a2 = gen(A, 2, CONTINUE_TXN)
    a1_dup = gen(A, 1, CONTINUE_TXN)
    a2_dup = gen(A, 2, CONTINUE_TXN)
    a3_ack = gen(A, 3, ACK_TXN)
    assert queue(seq, a1, a2, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a1, a2, a3_ack)
    assert not seq.has_pending()

    # Case: an ACK without a preceding CONTINUE. Unusual, but allowed.
    a4_ack = gen(A, 4, ACK_TXN)
    assert queue(seq, a4_ack) == [Q.ACK_EMPTY]
    expect_deque(seq, a4_ack)

    # Case: partial ACK of preceding messages.
    a5 = gen(A, 5, CONTINUE_TXN)
    a7_no_ack = gen(A, 7, CONTINUE_TXN)  # Not included in a6_ack.
    a6_ack = gen(A, 6, ACK_TXN)  # Served from the ring.
    assert queue(seq, a5, a7_no_ack, a6_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a5, a6_ack)
    assert not seq.has_pending()

    # Case: rollback, with producer B interleaved.
    b1 = gen(B, 1, CONTINUE_TXN)  # Evicted.
    a7_rollback = gen(A, 7, CONTINUE_TXN)  # Evicted.
    a8_rollback = gen(A, 8, CONTINUE_TXN)
    b2 = gen(B, 2, CONTINUE_TXN)
    a6_abort = gen(A, 6, ACK_TXN)  # Aborts back to clock 6.
    assert queue(seq, a7_rollback, b1, a7_rollback, a8_rollback, b2, a6_abort) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_ROLLBACK,
    ]
    assert seq._emit is None  # Nothing to dequeue.
    assert seq.has_pending()  # B is still pending.
    assert seq.partials == {
        jp(A): partial(A, -1, -1, -1, 6, 6),
        jp(B): partial(B, b1.begin, 1, 1, 0, 2),
    }

    # Case: interleaved producer ACKs. A replay is required due to eviction.
    b3_ack = gen(B, 3, ACK_TXN)
    assert queue(seq, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7_rollback, a8_rollback)
    expect_deque(seq, b1, b2, b3_ack)
    assert not seq.has_pending()

    # Case: a sequence needing a replay, with duplicates within it and from before it,
    # met both in the ring and during the replay.
    b4 = gen(B, 4, CONTINUE_TXN)  # Evicted.
    b1_dup = gen(B, 1, CONTINUE_TXN)
    b4_dup = gen(B, 4, CONTINUE_TXN)
    b5 = gen(B, 5, CONTINUE_TXN)  # Evicted.
    b6 = gen(B, 6, CONTINUE_TXN)
    b2_dup = gen(B, 2, CONTINUE_TXN)
    b7 = gen(B, 7, CONTINUE_TXN)
    b8_ack = gen(B, 8, ACK_TXN)
    assert queue(seq, b4, b1_dup, b4_dup, b5, b6, b2_dup, b7, b8_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1_dup, b4_dup, b5)
    expect_deque(seq, b4, b5, b6, b7, b8_ack)
    assert not seq.has_pending()

    # Case: partial rollback where every ring entry is skipped.
    b9 = gen(B, 9, CONTINUE_TXN)  # Evicted.
    b11_no_ack = gen(B, 11, CONTINUE_TXN)  # Evicted.
    b12_no_ack = gen(B, 12, CONTINUE_TXN)
    b13_no_ack = gen(B, 13, CONTINUE_TXN)
    b10_ack = gen(B, 10, ACK_TXN)
    assert queue(seq, b9, b11_no_ack, b12_no_ack, b13_no_ack, b10_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b9.begin, b12_no_ack.begin, b9, b11_no_ack)
    expect_deque(seq, b9, b10_ack)
    assert not seq.has_pending()

    # Case: interleaved ACK'd sequences needing two replays.
    b11 = gen(B, 11, CONTINUE_TXN)  # Evicted.
    a7 = gen(A, 7, CONTINUE_TXN)  # Evicted.
    a8 = gen(A, 8, CONTINUE_TXN)
    b12 = gen(B, 12, CONTINUE_TXN)
    a9_ack = gen(A, 9, ACK_TXN)
    b13_ack = gen(B, 13, ACK_TXN)
    assert queue(seq, b11, a7, a8, b12, a9_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_deque(seq, a7, a8, a9_ack)
    assert seq.has_pending()

    assert queue(seq, b13_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_deque(seq, b11, b12, b13_ack)
    assert not seq.has_pending()

    # Case: reset to an earlier ACK, then re-use of its clocks.
    b8_ack_reset = gen(B, 8, ACK_TXN)
    b9_reuse = gen(B, 9, CONTINUE_TXN)
    b10_ack_reuse = gen(B, 10, ACK_TXN)
    assert queue(seq, b8_ack_reset, b9_reuse, b10_ack_reuse) == [
        Q.ACK_ROLLBACK,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, b9_reuse, b10_ack_reuse)
    assert not seq.has_pending()


@pytest.mark.usefixtures("drain_mode")
def test_txn_without_buffer() -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=0)  # Treated as a ring of one.
    a1 = gen(A, 1, CONTINUE_TXN)
    a2 = gen(A, 2, CONTINUE_TXN)
    b1 = gen(B, 1, CONTINUE_TXN)
    a1_dup = gen(A, 1, CONTINUE_TXN)
    a2_dup = gen(A, 2, CONTINUE_TXN)
    a3_ack = gen(A, 3, ACK_TXN)
    b2 = gen(B, 2, CONTINUE_TXN)
    b3_ack = gen(B, 3, ACK_TXN)

    assert queue(seq, a1, a2, b1, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3_ack.begin, a1, a2, b1, a1_dup, a2_dup)
    expect_deque(seq, a1, a2, a3_ack)
    assert seq.has_pending()  # B is still pending.

    assert queue(seq, b2, b3_ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3_ack.begin, b1, a1_dup, a2_dup, a3_ack, b2)
    expect_deque(seq, b1, b2, b3_ack)
    assert not seq.has_pending()


@pytest.mark.usefixtures("drain_mode")
def test_outside_txn_cases() -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=0)

    # Case: OUTSIDE_TXN messages dequeue at once.
    a1 = gen(A, 1, OUTSIDE_TXN)
    a2 = gen(A, 2, OUTSIDE_TXN)
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a1)
    assert queue(seq, a2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a2)
    assert not seq.has_pending()
    assert seq.offsets == {JOURNAL: a2.end}

    # Case: duplicates are ignored.
    a1_dup = gen(A, 1, OUTSIDE_TXN)
    a2_dup = gen(A, 2, OUTSIDE_TXN)
    assert queue(seq, a1_dup, a2_dup) == [Q.OUTSIDE_ALREADY_ACKED, Q.OUTSIDE_ALREADY_ACKED]
    assert seq._emit is None
    assert seq.offsets == {JOURNAL: a2_dup.end}

    # Case: preceding CONTINUE_TXN messages are aborted.
    a3_discard = gen(A, 3, CONTINUE_TXN)
    a4_discard = gen(A, 4, CONTINUE_TXN)
    a5 = gen(A, 5, OUTSIDE_TXN)
    assert queue(seq, a3_discard, a4_discard, a5) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.OUTSIDE_COMMIT,
    ]
    expect_deque(seq, a5)
    assert not seq.has_pending()
    assert seq.offsets == {JOURNAL: a5.end}

    # Case: messages with unknown flags are treated as OUTSIDE_TXN.
    a6_discard = gen(A, 6, CONTINUE_TXN)
    a7_bad_bits = gen(A, 7, 0x100)
    a7_bad_bits_dup = gen(A, 7, 0x100)
    assert queue(seq, a6_discard, a7_bad_bits) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    expect_deque(seq, a7_bad_bits)
    assert queue(seq, a7_bad_bits_dup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert seq._emit is None

    # Case: messages with a zero UUID always dequeue.
    z1 = zero_uuid(gen(ZERO_PRODUCER, 0, 0))
    z2 = zero_uuid(gen(ZERO_PRODUCER, 0, 0))
    assert queue(seq, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z1)
    assert queue(seq, z2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z2)
    assert not seq.has_pending()

    # The zero UUID's producer is not tracked, but offsets still advance.
    assert seq.partials == {jp(A): partial(A, -1, -1, -1, 7, 7)}
    assert seq.offsets == {JOURNAL: z2.end}


def _sorted(states: list[ProducerState]) -> list[ProducerState]:
    return sorted(states, key=lambda s: (s.journal, bytes(s.producer)))


@pytest.mark.usefixtures("drain_mode")
def test_producer_states_round_trip() -> None:
    gen = new_generator()
    seq1 = Sequencer(ring_size=12)
    a1 = gen(A, 1, CONTINUE_TXN)
    a2 = gen(A, 2, CONTINUE_TXN)
    b1 = gen(B, 1, CONTINUE_TXN)
    b2 = gen(B, 2, CONTINUE_TXN)
    c1_ack = gen(C, 1, ACK_TXN)
    b3_ack = gen(B, 3, ACK_TXN)
    c2 = gen(C, 2, CONTINUE_TXN)
    c1_rollback = gen(C, 1, ACK_TXN)
    a3_ack = gen(A, 3, ACK_TXN)
    z1 = zero_uuid(gen(ZERO_PRODUCER, 0, 0))

    assert queue(seq1, a1, a2, b1, b2, c1_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    expect_deque(seq1, c1_ack)
    assert seq1.has_pending()
    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq1, z1)

    # Taking a checkpoint clears pending: a sequence is pending only if it was updated
    # since the last checkpoint.
    assert seq1.has_pending()
    offsets, states = seq1.checkpoint()
    assert not seq1.has_pending()

    # Restore a new Sequencer from the persisted states and offsets.
    seq2 = Sequencer(offsets, states, ring_size=12)
    _, states2 = seq2.checkpoint()
    assert not seq2.has_pending()

    expect = _sorted(
        [
            ProducerState(JOURNAL, A, last_ack=0, begin=a1.begin),
            ProducerState(JOURNAL, B, last_ack=0, begin=b1.begin),
            ProducerState(JOURNAL, C, last_ack=1, begin=-1),
        ]
    )
    assert _sorted(states) == expect
    assert _sorted(states2) == expect
    assert offsets == {JOURNAL: z1.end}

    # Both produce the same output from here, though seq2 needs replays and seq1 does not.
    assert queue(seq1, b3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3_ack.begin, b1, b2, c1_ack)
    expect_deque(seq1, b1, b2, b3_ack)
    expect_deque(seq2, b1, b2, b3_ack)

    assert queue(seq1, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert queue(seq2, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert seq1._emit is None and seq2._emit is None

    assert queue(seq1, a3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2, b1, b2, c1_ack)
    expect_deque(seq1, a1, a2, a3_ack)
    expect_deque(seq2, a1, a2, a3_ack)


def test_producer_states_round_trip_during_dequeue() -> None:
    gen = new_generator()
    seq1 = Sequencer(ring_size=12)
    a1 = gen(A, 1, CONTINUE_TXN)
    a2 = gen(A, 2, CONTINUE_TXN)
    a3_ack = gen(A, 3, ACK_TXN)
    a4 = gen(A, 4, CONTINUE_TXN)
    a5 = gen(A, 5, CONTINUE_TXN)
    a6_ack = gen(A, 6, ACK_TXN)

    assert queue(seq1, a1, a2, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() is a1
    # Suppose the process crashes here, before a1 was processed.
    offsets, states = seq1.checkpoint()

    # Restore twice, to check unchanged states round-trip.
    seq2 = Sequencer(offsets, states, ring_size=12)
    offsets, states = seq2.checkpoint()
    seq2 = Sequencer(offsets, states, ring_size=12)

    # Both states are those just before a3_ack was read.
    for seq in (seq1, seq2):
        assert seq.checkpoint() == (
            {JOURNAL: a2.end},
            [ProducerState(JOURNAL, A, last_ack=0, begin=a1.begin)],
        )

    # seq2 begins by reading a3_ack again.
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2)

    assert seq1.step() is a2
    assert seq1.step() is a3_ack
    assert seq1.step() is None
    expect_deque(seq2, a1, a2, a3_ack)

    # seq1 checkpoints part-way through dequeuing the next sequence.
    assert queue(seq1, a4, a5, a6_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() is a4
    assert seq1.step() is a5  # Crash.

    offsets, states = seq1.checkpoint()
    seq2 = Sequencer(offsets, states, ring_size=12)
    offsets, states = seq2.checkpoint()
    seq2 = Sequencer(offsets, states, ring_size=12)

    # States are just before a6_ack was read, tightened past a4's consumption.
    for seq in (seq1, seq2):
        assert seq.checkpoint() == (
            {JOURNAL: a5.end},
            [ProducerState(JOURNAL, A, last_ack=4, begin=a5.begin)],
        )

    # seq2 reads a6_ack again, then dequeues from a5 (not a4).
    assert queue(seq2, a6_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a5.begin, a6_ack.begin, a5)
    expect_deque(seq2, a5, a6_ack)


@pytest.mark.usefixtures("drain_mode")
def test_producer_states_straddle_duplicate() -> None:
    gen = new_generator()
    seq1 = Sequencer(ring_size=12)
    a1 = gen(A, 1, CONTINUE_TXN)
    a2 = gen(A, 2, CONTINUE_TXN)
    a3 = gen(A, 3, CONTINUE_TXN)
    a1_dup = gen(A, 1, CONTINUE_TXN)
    a2_dup = gen(A, 2, CONTINUE_TXN)
    a3_dup = gen(A, 3, CONTINUE_TXN)
    a4_ack = gen(A, 4, ACK_TXN)

    assert queue(seq1, a1, a2, a3) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
    ]
    assert seq1._emit is None

    offsets, states = seq1.checkpoint()
    seq2 = Sequencer(offsets, states, ring_size=12)

    assert queue(seq1, a1_dup, a2_dup, a3_dup, a4_ack) == [
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    # The restored sequencer knows only the last ACK, so the duplicates extend its span.
    assert queue(seq2, a1_dup, a2_dup, a3_dup, a4_ack) == [
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq2, a1.begin, a1_dup.begin, a1, a2, a3)
    expect_deque(seq1, a1, a2, a3, a4_ack)
    expect_deque(seq2, a1, a2, a3, a4_ack)


@pytest.mark.usefixtures("drain_mode")
def test_producer_pruning() -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=12)
    # Clock units are 100 ns, above 4 bits of sequence counter.
    a_cont = gen(A, 10 << 4, CONTINUE_TXN)
    b_cont = gen(B, 19 << 4, CONTINUE_TXN)
    b_ack = gen(B, 20 << 4, ACK_TXN)
    c_cont = gen(C, 30 << 4, CONTINUE_TXN)

    assert queue(seq, a_cont, b_cont, b_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, b_cont, b_ack)
    assert queue(seq, c_cont) == [Q.CONTINUE_BEGIN_SPAN]

    # This horizon prunes no producer.
    _, states = seq.checkpoint(20 * 100)
    assert _sorted(states) == [
        ProducerState(JOURNAL, A, last_ack=(10 << 4) - 1, begin=a_cont.begin),
        ProducerState(JOURNAL, B, last_ack=20 << 4, begin=-1),
        ProducerState(JOURNAL, C, last_ack=(30 << 4) - 1, begin=c_cont.begin),
    ]
    assert len(seq.partials) == 3

    # A is pruned.
    _, states = seq.checkpoint(19 * 100)
    assert _sorted(states) == [
        ProducerState(JOURNAL, B, last_ack=20 << 4, begin=-1),
        ProducerState(JOURNAL, C, last_ack=(30 << 4) - 1, begin=c_cont.begin),
    ]
    assert len(seq.partials) == 2

    # B is pruned.
    _, states = seq.checkpoint(1)
    assert states == [ProducerState(JOURNAL, C, last_ack=(30 << 4) - 1, begin=c_cont.begin)]
    assert len(seq.partials) == 1


def _fails(exc: BaseException) -> Callable[[Iterator[Envelope]], Iterator[Envelope]]:
    def wrap(it: Iterator[Envelope]) -> Iterator[Envelope]:
        raise exc
        yield  # pragma: no cover

    return wrap


def _mapped(
    fn: Callable[[Envelope], Envelope],
) -> Callable[[Iterator[Envelope]], Iterator[Envelope]]:
    def wrap(it: Iterator[Envelope]) -> Iterator[Envelope]:
        for env in it:
            yield fn(env)

    return wrap


@pytest.mark.parametrize(
    ("wrap", "expect"),
    [
        (lambda it: it, None),
        # Reader errors pass through.
        (_fails(UnexpectedEOFError("unexpected EOF")), "replay reader: unexpected EOF"),
        (
            _mapped(lambda e: dataclasses.replace(e, journal="wrong/journal")),
            "replay of wrong journal (wrong/journal; expected test/journal)",
        ),
        (
            _mapped(lambda e: dataclasses.replace(e, begin=e.begin - 1)),
            "replay has wrong begin (101; expected >= 102)",
        ),
        (
            _mapped(lambda e: dataclasses.replace(e, end=e.end + 100)),
            "replay has wrong end (302; expected <= 204)",
        ),
    ],
)
def test_replay_reader_errors(
    wrap: Callable[[Iterator[Envelope]], Iterator[Envelope]], expect: str | None
) -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=0)
    b1 = gen(B, 1, CONTINUE_TXN)
    a2 = gen(A, 2, CONTINUE_TXN)
    a3_ack = gen(A, 3, ACK_TXN)
    assert queue(seq, b1, a2, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a2.begin, a3_ack.begin, a2)
    assert seq._replay is not None
    seq._replay = wrap(seq._replay)

    if expect is None:
        assert seq.step() is not None
    else:
        with pytest.raises(ReplayError) as info:
            seq.step()
        assert str(info.value) == expect


def test_misuse_is_reported() -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=0)
    a1 = gen(A, 1, CONTINUE_TXN)
    a2_ack = gen(A, 2, ACK_TXN)
    with pytest.raises(RuntimeError, match="replay_range"):
        seq.replay_range()
    assert queue(seq, a1, a2_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_REPLAY]
    with pytest.raises(RuntimeError, match="start_replay"):
        seq.step()
    with pytest.raises(RuntimeError, match="committed messages remain"):
        seq.queue_uncommitted(gen(A, 3, OUTSIDE_TXN))
    seq.start_replay([a1])
    assert list(seq.dequeue_committed()) == [a1, a2_ack]


# -- queue_and_drain: the batch form, state for state ------------------------------------

JOURNAL_2 = "test/other"


def _snapshot(seq: Sequencer) -> tuple[object, ...]:
    """Everything of a sequencer's state but the clock and key of empty ring slots."""
    return (
        {jp: dataclasses.astuple(p) for jp, p in seq.partials.items()},
        {
            j: {pr: dataclasses.astuple(p) for pr, p in by.items()}
            for j, by in seq._by_journal.items()
            if by
        },
        [None if e is None else id(e) for e in seq.ring],
        list(seq.next),
        seq.head,
        dict(seq.offsets),
        set(seq._pending),
        seq._emit,
        seq.dequeued,
    )


def _replay(seq: Sequencer, log: list[Envelope]) -> None:
    journal, begin, end = seq.replay_range()
    seq.start_replay([e for e in log if e.journal == journal and e.begin >= begin and e.end <= end])


log_entries = st.lists(
    st.tuples(
        st.sampled_from([A, B, C, ZERO_PRODUCER]),
        st.integers(0, 10),  # Clock (small, so duplicates and rollbacks are common).
        st.sampled_from([OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN, 3]),  # 3: unexpected flags.
        st.sampled_from([JOURNAL, JOURNAL, JOURNAL_2]),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    entries=log_entries,
    ring_size=st.integers(0, 8),
    cuts=st.sets(st.integers(1, 60), max_size=6),
    restore_at=st.none() | st.integers(1, 60),
    columns=st.sampled_from(["none", "ints", "bytes"]),
)
def test_queue_and_drain_agrees_with_queue_then_drain(
    entries: list[tuple[ProducerID, int, int, str]],
    ring_size: int,
    cuts: set[int],
    restore_at: int | None,
    columns: str,
) -> None:
    """Queueing a log envelope by envelope (queue_uncommitted, then drain_committed) and
    in batches (queue_and_drain, cut anywhere) deliver the same envelopes and leave the
    same state after every batch, replays, restored checkpoints, unexpected flags, zero
    UUIDs and interleaved journals included."""
    offsets = {JOURNAL: 0, JOURNAL_2: 0}
    log: list[Envelope] = []
    for producer, clock, flags, journal in entries:
        uuid = build_uuid(producer, clock << 4, flags) if producer != ZERO_PRODUCER else ZERO_UUID
        begin = offsets[journal]
        offsets[journal] += 7
        log.append(Envelope(journal, begin, begin + 5, TestMsg(uuid)))
    bounds = sorted({0, len(log), *(c for c in cuts if c < len(log))})
    if restore_at is not None and restore_at not in bounds:
        restore_at = None

    def restored(seq: Sequencer) -> Sequencer:
        offsets, states = seq.checkpoint()
        return Sequencer(offsets, states, ring_size=ring_size)

    # Envelope by envelope.
    seq = Sequencer(ring_size=ring_size)
    each_out: list[Envelope] = []
    each_states = []
    for k, env in enumerate(log, 1):
        if seq.queue_uncommitted(env) == Q.ACK_COMMIT_REPLAY:
            _replay(seq, log)
        seq.drain_committed(each_out)
        if k in bounds:
            each_states.append(_snapshot(seq))
            if k == restore_at:
                seq = restored(seq)

    # In batches.
    seq = Sequencer(ring_size=ring_size)
    batch_out: list[Envelope] = []
    batch_states = []
    for lo, hi in itertools.pairwise(bounds):
        batch = log[lo:hi]
        uuids = None
        if columns == "ints":
            uuids = uuid_columns_of_ints([e.message.get_uuid().int for e in batch])
        elif columns == "bytes":
            uuids = uuid_columns(b"".join(e.message.get_uuid().bytes for e in batch))
        i = 0
        while i < len(batch):
            i = seq.queue_and_drain(batch, batch_out, i, uuids)
            if seq.dequeuing():
                _replay(seq, log)
                seq.drain_committed(batch_out)
        batch_states.append(_snapshot(seq))
        if hi == restore_at:
            seq = restored(seq)

    assert [id(e) for e in batch_out] == [id(e) for e in each_out]
    assert batch_states == each_states


def test_queue_and_drain_misuse() -> None:
    gen = new_generator()
    seq = Sequencer(ring_size=0)
    a1 = gen(A, 1, CONTINUE_TXN)
    a2_ack = gen(A, 2, ACK_TXN)
    out: list[Envelope] = []
    # Stops just after the commit needing a replay.
    assert seq.queue_and_drain([a1, a2_ack, gen(A, 3, OUTSIDE_TXN)], out) == 2
    assert seq.dequeuing() and out == []
    with pytest.raises(RuntimeError, match="committed messages remain"):
        seq.queue_and_drain([gen(A, 4, OUTSIDE_TXN)], out)
    seq.start_replay([a1])
    seq.drain_committed(out)
    assert out == [a1, a2_ack] and not seq.dequeuing()
    assert seq.queue_and_drain([], out) == 0


# -- the exactly-once property over arbitrary interleavings -------------------------------


PRODUCERS = [A, B, C]


@dataclass
class _Producer:
    id: ProducerID
    clock: int = 0  # Last clock used for a new message.
    last_ack: int = 0  # Clock of the last ACK or OUTSIDE message (0: none yet).
    pending: list[int] | None = None  # Serials of open CONTINUE messages.
    appended: list[Envelope] | None = None  # Every envelope it appended, duplicates too.


class SequencerMachine(RuleBasedStateMachine):
    """Producers publish into one journal, with retried (duplicated) appends, rollbacks and
    partial ACKs; a reader sequences the journal, crashing now and then back to its last
    checkpoint. Whatever happens, the read-committed output holds every acknowledged
    message exactly once and nothing rolled back."""

    @initialize(ring_size=st.integers(0, 6))
    def setup(self, ring_size: int) -> None:
        self.ring_size = ring_size
        self.log: list[Envelope] = []
        self.offset = 0
        self.serial = 0
        self.producers = [_Producer(p, pending=[], appended=[]) for p in PRODUCERS]
        self.committed: set[int] = set()
        self.rolled_back: set[int] = set()
        self.seq = Sequencer(ring_size=ring_size)
        self.pos = 0  # Next log index to read.
        self.output: list[int] = []
        self.saved: tuple[dict[str, int], list[ProducerState], int] | None = None

    def _append(self, p: _Producer, clock: int, flags: int, serial: int | None = None) -> int:
        if serial is None:
            serial = self.serial
            self.serial += 1
        uuid = build_uuid(p.id, clock, flags) if clock else ZERO_UUID
        size = 10 + serial % 7
        env = Envelope(JOURNAL, self.offset, self.offset + size, TestMsg(uuid, serial=serial))
        self.offset += size + serial % 2  # Occasionally leave a gap.
        self.log.append(env)
        assert p.appended is not None
        p.appended.append(env)
        return serial

    def _tick(self, p: _Producer) -> int:
        p.clock += 160
        return p.clock

    @rule(i=st.integers(0, 2), n=st.integers(1, 4))
    def publish_uncommitted(self, i: int, n: int) -> None:
        p = self.producers[i]
        assert p.pending is not None
        for _ in range(n):
            p.pending.append(self._append(p, self._tick(p), CONTINUE_TXN))

    @rule(i=st.integers(0, 2))
    def publish_committed(self, i: int) -> None:
        p = self.producers[i]
        assert p.pending is not None
        # An OUTSIDE message clobbers the producer's open transaction.
        self.rolled_back.update(p.pending)
        p.pending.clear()
        p.last_ack = self._tick(p)
        self.committed.add(self._append(p, p.last_ack, OUTSIDE_TXN))

    @rule(i=st.integers(0, 2))
    def acknowledge(self, i: int) -> None:
        p = self.producers[i]
        assert p.pending is not None
        p.last_ack = self._tick(p)
        self.committed.update(p.pending)
        p.pending.clear()
        self.committed.add(self._append(p, p.last_ack, ACK_TXN))

    @rule(i=st.integers(0, 2), data=st.data())
    def acknowledge_partially(self, i: int, data: st.DataObject) -> None:
        """An ACK whose clock falls inside the open transaction: it commits what precedes
        it and rolls back what follows (as after a producer restored a checkpoint)."""
        p = self.producers[i]
        assert p.pending is not None and p.appended is not None
        if not p.pending:
            return
        k = data.draw(st.integers(0, len(p.pending) - 1))
        kept = p.pending[: k + 1]
        clock_of = {e.message.serial: get_clock(e.message.get_uuid()) for e in p.appended}
        ack_clock = clock_of[kept[-1]] + 1
        self.committed.update(kept)
        self.rolled_back.update(p.pending[k + 1 :])
        p.pending.clear()
        p.last_ack = ack_clock
        self.committed.add(self._append(p, ack_clock, ACK_TXN))

    @rule(i=st.integers(0, 2))
    def roll_back(self, i: int) -> None:
        """An ACK at the last acknowledged clock: the open transaction is aborted."""
        p = self.producers[i]
        assert p.pending is not None
        if p.last_ack == 0:
            return  # Nothing acknowledged yet to roll back to.
        self.rolled_back.update(p.pending)
        p.pending.clear()
        self._append(p, p.last_ack, ACK_TXN, serial=-2)

    @rule(i=st.integers(0, 2), k=st.integers(1, 4))
    def retry_appends(self, i: int, k: int) -> None:
        """A retried append: the producer's last ``k`` appends are written again, in order,
        before it appends anything new (the journal client retries in order)."""
        p = self.producers[i]
        assert p.appended is not None
        suffix = p.appended[-k:]
        # A retry spanning an ACK older than the producer's last one (a batch spanning two
        # transactions) is out of model: Gazette reads such an ACK as the producer having
        # restored an older checkpoint, and falls back to at-least-once by design.
        while any(
            _flags(e.message.get_uuid()) == ACK_TXN and get_clock(e.message.get_uuid()) < p.last_ack
            for e in suffix
        ):
            suffix = suffix[1:]
        for env in list(suffix):
            msg = env.message
            self._append(p, get_clock(msg.get_uuid()), _flags(msg.get_uuid()), serial=msg.serial)

    @rule()
    def publish_without_uuid(self) -> None:
        serial = self._append(_Producer(ZERO_PRODUCER, appended=[]), 0, 0)
        self.committed.add(serial)

    @rule(checkpoint_at=st.none() | st.integers(0, 8), drain=st.booleans(), batch=st.booleans())
    def read(self, checkpoint_at: int | None, drain: bool, batch: bool) -> None:
        """Read everything appended so far. With ``checkpoint_at``, checkpoint once after
        that many messages were delivered, possibly part-way through a committed sequence
        (where a consumer transaction may close). With ``drain`` (and no checkpoint),
        sequences are taken whole by drain_committed rather than step by step; with
        ``batch`` too, everything is queued and drained by queue_and_drain."""
        seq = self.seq
        if drain and batch and checkpoint_at is None:
            envs = self.log[self.pos :]
            taken: list[Envelope] = []
            i = 0
            while i < len(envs):
                i = seq.queue_and_drain(envs, taken, i)
                if seq.dequeuing():
                    journal, begin, end = seq.replay_range()
                    seq.start_replay([e for e in self.log if e.begin >= begin and e.end <= end])
                    seq.drain_committed(taken)
            assert not seq.dequeuing()
            self.pos = len(self.log)
            self.output.extend(e.message.serial for e in taken)
        while self.pos < len(self.log):
            env = self.log[self.pos]
            self.pos += 1
            if seq.queue_uncommitted(env) == Q.ACK_COMMIT_REPLAY:
                journal, begin, end = seq.replay_range()
                assert journal == JOURNAL
                seq.start_replay([e for e in self.log if e.begin >= begin and e.end <= end])
            if drain and checkpoint_at is None:
                drained: list[Envelope] = []
                seq.drain_committed(drained)
                assert seq.step() is None
                self.output.extend(e.message.serial for e in drained)
                continue
            for committed in seq.dequeue_committed():
                # As in a consumer: a transaction closes with the dequeued message not
                # yet consumed, so the checkpoint must resume at it.
                if checkpoint_at == 0:
                    self.checkpoint()
                if checkpoint_at is not None:
                    checkpoint_at -= 1
                self.output.append(committed.message.serial)

        assert len(self.output) == len(set(self.output)), "a message was delivered twice"
        assert set(self.output) == self.committed
        assert not set(self.output) & self.rolled_back

    @rule()
    def checkpoint(self) -> None:
        offsets, states = self.seq.checkpoint()
        self.saved = (offsets, states, len(self.output))

    @precondition(lambda self: self.saved is not None)
    @rule()
    def crash_and_restore(self) -> None:
        """The reader dies; its output since the checkpoint is discarded with the
        transaction, and a new sequencer resumes from the checkpoint."""
        assert self.saved is not None
        offsets, states, n = self.saved
        self.seq = Sequencer(offsets, states, ring_size=self.ring_size)
        del self.output[n:]
        resume = offsets.get(JOURNAL, 0)
        self.pos = next((i for i, e in enumerate(self.log) if e.begin >= resume), len(self.log))

    @invariant()
    def no_duplicates(self) -> None:
        assert len(self.output) == len(set(self.output))


def _flags(uuid: UUID) -> int:
    return (uuid.int >> 48) & 0x3FF


TestSequencerMachine = SequencerMachine.TestCase
TestSequencerMachine.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)

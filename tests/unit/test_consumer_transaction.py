"""The consumer transaction loop, driven by an injected clock and fakes of its seams: every
close condition (stall, min/max duration, the previous commit and its ACKs, pending ACKs),
pipelining, failures, and a hypothesis model of random interleavings."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.client import DependencyFailed
from gazette.consumer.envelopes import is_ack, uuid_flags
from gazette.consumer.errors import TransactionError
from gazette.consumer.source import ShardSource
from gazette.consumer.stores.memory import MemoryStore
from gazette.consumer.transaction import TransactionLoop, TxnConfig, TxnState
from gazette.message import (
    ACK_TXN,
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Envelope,
    JSONMessage,
    ProducerID,
    ProducerState,
    build_uuid,
)
from gazette.message.publisher import AckIntent
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.tasks import cancel_and_wait
from gazette.testing.eventually import eventually


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self.t:
            return
        f = asyncio.get_running_loop().create_future()
        self._sleepers.append((deadline, f))
        await f

    def advance(self, dt: float) -> None:
        self.t += dt
        for d, f in self._sleepers:
            if d <= self.t and not f.done():
                f.set_result(None)
        self._sleepers = [(d, f) for d, f in self._sleepers if not f.done()]


class FakeSource:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Sequence[Envelope] | None] = asyncio.Queue()
        self.read_through: dict[str, int] = {}
        self.pending = False
        self.offset = 0

    def put(self, n: int) -> None:
        batch = []
        for _ in range(n):
            batch.append(Envelope("in", self.offset, self.offset + 10, self.offset // 10))
            self.offset += 10
        self.queue.put_nowait(batch)

    def close(self) -> None:
        self.queue.put_nowait(None)

    async def read(self) -> Sequence[Envelope] | None:
        return await self.queue.get()

    async def sequence(self, batch: Sequence[Envelope]) -> Sequence[Envelope]:
        if batch:
            self.read_through["in"] = batch[-1].end
        return batch

    def has_pending(self) -> bool:
        return self.pending

    def sequenced_through(self) -> Mapping[str, int]:
        return dict(self.read_through)

    def checkpoint(self, prune_horizon_ns: int) -> tuple[Mapping[str, int], Sequence[ProducerState]]:
        return dict(self.read_through), []


class App:
    def __init__(self) -> None:
        self.consumed: list[int] = []
        self.finalized = 0
        self.fail_on: int | None = None

    def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore()

    def new_message(self, spec: Any) -> Any:
        return None

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Any) -> None:
        if env.message == self.fail_on:
            raise ValueError("boom")
        self.consumed.append(env.message)

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        self.finalized += 1


class Store:
    """Commits resolve when the test says so; records what each commit held, and which ACKs
    (``acks``, the harness's) were written when it started."""

    def __init__(self, ordered: bool = False) -> None:
        self.commits: list[tuple[pc.Checkpoint, asyncio.Future[None]]] = []
        self.acks_done_at_commit: list[list[bool]] = []
        self.acks: list[asyncio.Future[Any]] = []
        if ordered:
            self.ordered_commits = True

    def start_commit(self, shard: Any, cp: pc.Checkpoint, wait_for: Sequence[Awaitable[Any]]) -> asyncio.Future[Any]:
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.commits.append((cp, f))
        self.acks_done_at_commit.append([a.done() for a in self.acks])
        return f

    def restore_checkpoint(self, shard: Any) -> pc.Checkpoint:
        return pc.Checkpoint()

    def destroy(self) -> None:
        pass

    def resolve(self, i: int, err: BaseException | None = None) -> None:
        f = self.commits[i][1]
        f.set_exception(err) if err else f.set_result(None)

    def read_through(self, i: int) -> int:
        return self.commits[i][0].sources["in"].read_through


class Pub:
    def __init__(self) -> None:
        self.intents: list[AckIntent] = []

    def build_ack_intents(self) -> list[AckIntent]:
        out, self.intents = self.intents, []
        return out


class Harness:
    def __init__(self, cfg: TxnConfig, *, acks: bool = False, source: Any = None, app: App | None = None,
                 ordered: bool = False) -> None:
        self.clock, self.store, self.pub = FakeClock(), Store(ordered), Pub()
        self.app = app if app is not None else App()
        self.source = source if source is not None else FakeSource()
        self.acks: list[asyncio.Future[Any]] = self.store.acks
        self.ack_intents: list[AckIntent] = []  # of each of ``acks``
        self.ack_txn: list[int] = []  # the commit (index) of each of ``acks``
        # With ``acks``, the intents of the i-th transaction (from 1): this, by default.
        self.intents_of: Callable[[int], list[AckIntent]] = lambda i: [AckIntent("out", b"ack")]
        self.progress: list[Mapping[str, int]] = []
        self.with_acks = acks
        self.loop = TransactionLoop(
            object(), self.app, self.store, self.pub, self.source,  # type: ignore[arg-type]
            config=cfg, write_acks=self.write_acks, clock=self.clock,
            on_progress=lambda rt, _: self.progress.append(rt))
        self.task: asyncio.Task[None] | None = None

    def write_acks(self, intents: Sequence[AckIntent], after: asyncio.Future[Any]) -> list[asyncio.Future[Any]]:
        fs = [asyncio.get_running_loop().create_future() for _ in intents]
        self.acks.extend(fs)
        self.ack_intents.extend(intents)
        self.ack_txn.extend([len(self.store.commits) - 1] * len(fs))
        return fs

    def start(self) -> None:
        orig = self.app.finalize_txn

        def finalize(shard: Any, store: Any, pub: Any) -> None:
            orig(shard, store, pub)
            if self.with_acks:
                self.pub.intents = self.intents_of(self.app.finalized)
        self.app.finalize_txn = finalize  # type: ignore[method-assign]
        self.task = asyncio.ensure_future(self.loop.run())

    async def until(self, cond: Callable[[], bool]) -> None:
        await eventually(cond, "condition", interval=0)  # the fakes need loop turns, not time

    async def quiet(self) -> None:
        for _ in range(20):  # let the loop run to its next wait
            await asyncio.sleep(0)


async def test_commits_when_input_stalls() -> None:
    h = Harness(TxnConfig(min_duration=0, max_duration=10))
    h.start()
    h.source.put(3)
    await h.until(lambda: len(h.store.commits) == 1)
    assert h.app.consumed == [0, 1, 2] and h.store.read_through(0) == 30 and h.app.finalized == 1
    h.store.resolve(0)
    h.source.close()
    await asyncio.wait_for(h.task, 5)  # type: ignore[arg-type]
    assert h.progress == [{}, {"in": 30}]  # the recovered (empty) checkpoint, then ours


async def test_min_duration_holds_the_commit() -> None:
    h = Harness(TxnConfig(min_duration=5, max_duration=10))
    h.start()
    h.source.put(1)
    await h.until(lambda: h.app.consumed == [0])
    await h.quiet()
    h.clock.advance(4.9)
    await h.quiet()
    assert h.store.commits == []
    h.source.put(1)  # still within min: joins the transaction
    await h.until(lambda: h.app.consumed == [0, 1])
    h.clock.advance(0.1)
    await h.until(lambda: len(h.store.commits) == 1)
    assert h.store.read_through(0) == 20 and h.loop.state is TxnState.IDLE  # the next one


async def test_pipelined_txn_waits_for_previous_commit_then_stalls_at_max() -> None:
    h = Harness(TxnConfig(min_duration=0, max_duration=2))
    h.start()
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 1)
    h.source.put(2)  # the next transaction consumes while the first commits
    await h.until(lambda: h.app.consumed == [0, 1, 2])
    await h.quiet()
    assert len(h.store.commits) == 1  # cannot commit before the previous one
    h.clock.advance(2)  # max elapses: reading stops, the transaction is stalled
    await h.until(lambda: h.loop.state is TxnState.STALLED)
    h.source.put(1)
    await h.quiet()
    assert h.app.consumed == [0, 1, 2]  # not read while stalled
    h.store.resolve(0)
    await h.until(lambda: len(h.store.commits) == 2)
    assert h.store.read_through(1) == 30
    h.store.resolve(1)
    await h.until(lambda: h.app.consumed == [0, 1, 2, 3])  # the next transaction reads it


async def test_acks_of_the_previous_txn_are_carried_and_the_one_before_gates() -> None:
    """The next commit does not wait for the previous transaction's ACKs: its checkpoint
    carries their intents (its own superseding one of the same journal). The commit after
    waits until the first transaction is done (at most two outstanding)."""
    h = Harness(TxnConfig(min_duration=0, max_duration=10), acks=True)
    h.intents_of = lambda i: [AckIntent(f"{j}", f"{j}{i}".encode()) for j in ("ab" if i == 1 else "b")]
    h.start()
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 1)
    assert dict(h.store.commits[0][0].ack_intents) == {"a": b"a1", "b": b"b1"} and len(h.acks) == 2
    h.store.resolve(0)
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 2)  # the first's ACKs are still pending
    assert dict(h.store.commits[1][0].ack_intents) == {"a": b"a1", "b": b"b2"}
    assert h.progress == [{}]  # the first is not done
    h.store.resolve(1)
    h.source.put(1)
    await h.until(lambda: h.app.consumed == [0, 1, 2])
    await h.quiet()
    assert len(h.store.commits) == 2  # the first transaction is still outstanding
    h.acks[1].set_result(None)  # its ACK of b: a is still unwritten
    await h.quiet()
    assert len(h.store.commits) == 2
    h.acks[0].set_result(None)
    await h.until(lambda: len(h.store.commits) == 3)
    assert h.progress == [{}, {"in": 10}]
    assert dict(h.store.commits[2][0].ack_intents) == {"b": b"b3"}  # the second's b is superseded
    h.acks[2].set_result(None)
    await h.until(lambda: h.progress == [{}, {"in": 10}, {"in": 20}])


async def test_an_ordered_store_starts_a_commit_while_the_previous_is_outstanding() -> None:
    h = Harness(TxnConfig(min_duration=0, max_duration=10), ordered=True)
    assert h.loop.depth == 2
    h.start()
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 1)
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 2)  # the first commit is unresolved
    h.source.put(1)
    await h.until(lambda: h.app.consumed == [0, 1, 2])
    await h.quiet()
    assert len(h.store.commits) == 2  # two unresolved: the third waits
    h.store.resolve(0)
    await h.until(lambda: len(h.store.commits) == 3)
    assert [h.store.read_through(i) for i in range(3)] == [10, 20, 30]
    assert h.progress == [{}, {"in": 10}]
    h.store.resolve(2)  # out of order: progress is still reported in order
    await h.quiet()
    assert h.progress == [{}, {"in": 10}]
    h.store.resolve(1)
    await h.until(lambda: h.progress == [{}, {"in": 10}, {"in": 20}, {"in": 30}])


async def test_pending_acks_of_read_messages_extend_the_txn_until_max() -> None:
    h = Harness(TxnConfig(min_duration=0, max_duration=3))
    h.start()
    h.source.pending = True  # a producer's transaction began; wait for its ACK
    h.source.put(1)
    await h.until(lambda: h.app.consumed == [0])
    await h.quiet()
    assert h.store.commits == []
    h.clock.advance(3)
    await h.until(lambda: len(h.store.commits) == 1)


async def test_disable_wait_for_ack_closes_as_input_stalls_despite_pending_acks() -> None:
    """The guide's statement: ``disable_wait_for_ack`` is about input awaiting ACKs, which no
    longer holds the transaction open (Gazette's ShardSpec field of that name)."""
    cfg = TxnConfig.from_spec(pc.ShardSpec(max_txn_duration=duration_pb2.Duration(seconds=3),
                                           disable_wait_for_ack=True))
    assert not cfg.wait_for_ack and cfg.max_duration == 3
    h = Harness(cfg)
    h.start()
    h.source.pending = True  # a producer's transaction began; its ACK is not awaited
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 1)  # no clock advance: closed as input stalled
    assert h.clock.t == 0 and h.app.consumed == [0]


async def test_app_error_fails_the_loop_and_nothing_commits() -> None:
    h = Harness(TxnConfig(min_duration=0, max_duration=10))
    h.app.fail_on = 1
    h.start()
    h.source.put(3)
    with pytest.raises(TransactionError, match=r"consume_message \(message of in at offset 10\): boom"):
        await asyncio.wait_for(h.task, 5)  # type: ignore[arg-type]
    assert h.store.commits == []


@pytest.mark.parametrize("ordered", [False, True])
async def test_failed_commit_fails_the_loop(ordered: bool) -> None:
    """With an ordered store, the later of two outstanding commits fails while the earlier
    is still pending: the loop fails all the same, reporting no progress."""
    h = Harness(TxnConfig(min_duration=0, max_duration=10), ordered=ordered)
    h.start()
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 1)
    if ordered:  # a second commit starts while the first is pending
        h.source.put(1)
        await h.until(lambda: len(h.store.commits) == 2)
    h.store.resolve(len(h.store.commits) - 1, RuntimeError("fenced"))
    h.source.put(1)
    with pytest.raises(TransactionError, match="commit: fenced"):
        await asyncio.wait_for(h.task, 5)  # type: ignore[arg-type]
    assert h.progress == [{}]


async def test_recovered_ack_intents_are_written_first() -> None:
    h = Harness(TxnConfig())
    cp = pc.Checkpoint()
    cp.ack_intents["out"] = b"intent"
    task = asyncio.ensure_future(h.loop.run(cp))
    await h.until(lambda: len(h.acks) == 1)
    h.source.close()
    await h.quiet()
    assert not task.done()  # the recovered ACK must resolve first
    h.acks[0].set_result(None)
    await asyncio.wait_for(task, 5)


_events = st.lists(st.sampled_from(["put", "advance", "resolve", "ack"]), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(_events, st.floats(0, 2), st.floats(2, 5), st.booleans(), st.booleans(), st.booleans())
def test_random_interleavings_commit_every_message_once_in_order(
        events: list[str], min_d: float, max_d: float, acks: bool, ordered: bool, shuffle: bool) -> None:
    """Random interleavings of input, time, commits and ACKs resolving (in order, or with
    ``shuffle`` the newest first), on a store whose commits are ordered or not: every message
    is consumed once, in order; the commit barrier holds; every checkpoint names, for each ACK
    not yet written when its commit started, an intent of that journal at least as recent."""
    async def main() -> None:
        h = Harness(TxnConfig(min_duration=min_d, max_duration=max_d), acks=acks, ordered=ordered)
        depth = 2 if ordered else 1
        # The i-th transaction acknowledges one or two of three journals.
        h.intents_of = lambda i: [AckIntent(f"j{k}", f"{i}".encode()) for k in {i % 3, (i * 7) % 3}]
        h.start()
        for ev in events:
            pending = [i for i, (_, f) in enumerate(h.store.commits) if not f.done()]
            if ev == "put":
                h.source.put(2)
            elif ev == "advance":
                h.clock.advance(1)
            elif ev == "resolve" and pending:
                h.store.resolve(pending[-1] if shuffle and ordered else pending[0])
            elif ev == "ack" and (open_acks := [a for a in h.acks if not a.done()]):
                (open_acks[-1] if shuffle else open_acks[0]).set_result(None)
            await h.quiet()
            unresolved = [i for i, (_, f) in enumerate(h.store.commits) if not f.done()]
            assert len(unresolved) <= depth
            outstanding = set(unresolved) | {h.ack_txn[k] for k, a in enumerate(h.acks) if not a.done()}
            assert len(outstanding) <= depth + 1
        # Drain: end input, resolve everything until the loop returns.
        h.source.close()
        async with asyncio.timeout(5):
            while not h.task.done():  # type: ignore[union-attr]
                h.clock.advance(1)
                for _, f in h.store.commits:
                    if not f.done():
                        f.set_result(None)
                for a in h.acks:
                    if not a.done():
                        a.set_result(None)
                await h.quiet()
        h.task.result()  # type: ignore[union-attr]
        n = h.source.offset // 10
        assert h.app.consumed == list(range(n))  # each message once, in order
        offsets = [h.store.read_through(i) for i in range(len(h.store.commits))]
        assert offsets == sorted(offsets) and (not n or offsets[-1] == n * 10)
        assert len(set(offsets)) == len(offsets)  # every transaction consumed something
        assert [p["in"] for p in h.progress[1:]] == offsets  # in transaction order
        for i, (cp, _) in enumerate(h.store.commits):
            # Carried intents: an ACK unwritten as commit i started is covered by its checkpoint.
            for k, done in enumerate(h.store.acks_done_at_commit[i]):
                if not done:
                    it = h.ack_intents[k]
                    assert it.journal in cp.ack_intents
                    assert int(cp.ack_intents[it.journal]) >= int(it.intent)
            own = {it.journal: it.intent for it in h.intents_of(i + 1)} if acks else {}
            assert {j: cp.ack_intents[j] for j in own} == own
    asyncio.run(main())


# -- progress past input the sequencer discards, through the real ShardSource and Sequencer --

JOURNAL = "in"
PRODUCER = ProducerID(b"\x01\x00\x00\x00\x00\x0a")


class Feed:
    """Read-uncommitted batches handed to a real ``ShardSource`` (as an app's producer of
    messages), so the real Sequencer decides what is discarded. Messages are 100 bytes apart."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[Envelope] | None] = asyncio.Queue()
        self.offset = 0

    def put(self, *msgs: tuple[int, int]) -> int:
        """Appends messages of PRODUCER as (clock, flags); returns the new head."""
        batch = []
        for clock, flags in msgs:
            doc = {"UUID": str(build_uuid(PRODUCER, clock, flags)), "n": clock}
            batch.append(Envelope(JOURNAL, self.offset, self.offset + 100, JSONMessage(doc)))
            self.offset += 100
        self.queue.put_nowait(batch)
        return self.offset

    async def batches(self) -> AsyncIterator[list[Envelope]]:
        while (batch := await self.queue.get()) is not None:
            yield batch


def _shard_source(feed: Feed) -> ShardSource:
    spec = pc.ShardSpec(id="s")
    spec.sources.add(journal=JOURNAL)
    jspec = pb.JournalSpec(name=JOURNAL)
    jspec.labels.labels.add(name=CONTENT_TYPE, value=CONTENT_TYPE_JSON_LINES)
    source = ShardSource(None, spec, {JOURNAL: jspec}, lambda _: JSONMessage,  # type: ignore[arg-type]
                         producer=feed.batches())
    source.start()
    return source


def _consumed(h: Harness) -> list[int]:
    return [m.doc["n"] for m in h.app.consumed]  # type: ignore[attr-defined]


async def _discarded_tail(dups: Callable[[Feed], int]) -> None:
    """A committed transaction, then input the sequencer discards, while idle: read-through
    reaches the head with no transaction begun."""
    feed = Feed()
    source = _shard_source(feed)
    h = Harness(TxnConfig(min_duration=0, max_duration=10), source=source)
    h.start()
    try:
        feed.put((1, OUTSIDE_TXN), (2, CONTINUE_TXN), (3, ACK_TXN))
        await h.until(lambda: len(h.store.commits) == 1)
        h.store.resolve(0)
        await h.until(lambda: h.progress[-1] == {JOURNAL: 300})
        head = dups(feed)
        await h.until(lambda: h.progress[-1] == {JOURNAL: head})
        await h.quiet()
        assert _consumed(h) == [1, 2, 3] and len(h.store.commits) == 1  # nothing began
        assert h.loop.state is TxnState.IDLE
        # The next real message commits as usual, its checkpoint past the discarded ones.
        feed.put((9, OUTSIDE_TXN))
        await h.until(lambda: len(h.store.commits) == 2)
        assert _consumed(h) == [1, 2, 3, 9] and h.store.read_through(1) == head + 100
    finally:
        await cancel_and_wait(h.task)  # type: ignore[arg-type]
        await source.aclose()


async def test_read_through_passes_a_duplicate_re_append_while_idle() -> None:
    # The same three messages appended again (a producer retrying an append that landed).
    await _discarded_tail(lambda feed: feed.put((1, OUTSIDE_TXN), (2, CONTINUE_TXN), (3, ACK_TXN)))


async def test_read_through_passes_a_rolled_back_transaction_while_idle() -> None:
    # A transaction begun and rolled back (its ACK carries the last committed clock).
    await _discarded_tail(lambda feed: feed.put((4, CONTINUE_TXN), (5, CONTINUE_TXN), (3, ACK_TXN)))


async def test_discarded_input_during_a_commit_is_reported_with_its_progress() -> None:
    """Discarded input read while the previous commit is pending: reported once it resolves,
    and not written into the checkpoint already handed to the store."""
    feed = Feed()
    source = _shard_source(feed)
    h = Harness(TxnConfig(min_duration=0, max_duration=10), source=source)
    h.start()
    try:
        feed.put((1, OUTSIDE_TXN))
        await h.until(lambda: len(h.store.commits) == 1)
        head = feed.put((1, OUTSIDE_TXN), (1, OUTSIDE_TXN))
        await h.until(lambda: source.sequenced_through() == {JOURNAL: head})
        await h.quiet()
        assert h.progress == [{}]  # the recovered checkpoint only: the commit is pending
        h.store.resolve(0)
        await h.until(lambda: len(h.progress) == 2)
        assert h.progress[-1] == {JOURNAL: head} and h.store.read_through(0) == 100
        assert len(h.store.commits) == 1
    finally:
        await cancel_and_wait(h.task)  # type: ignore[arg-type]
        await source.aclose()


class NoAcksApp(App):
    receive_acks = False


@pytest.mark.parametrize("receive", [True, False])
async def test_receive_acks_false_keeps_acknowledgements_from_the_app(receive: bool) -> None:
    feed = Feed()
    source = _shard_source(feed)
    h = Harness(TxnConfig(min_duration=0, max_duration=10), source=source,
                app=App() if receive else NoAcksApp())
    h.start()
    try:
        feed.put((1, OUTSIDE_TXN), (2, CONTINUE_TXN), (3, CONTINUE_TXN), (4, ACK_TXN))
        await h.until(lambda: len(h.store.commits) == 1)
        assert _consumed(h) == ([1, 2, 3, 4] if receive else [1, 2, 3])
        h.store.resolve(0)
        # An acknowledgement of nothing new (a re-published intent) is delivered alone: with
        # receive_acks = False it begins no transaction, and read-through still passes it.
        head = feed.put((5, ACK_TXN))
        if receive:
            await h.until(lambda: len(h.store.commits) == 2)
            assert _consumed(h) == [1, 2, 3, 4, 5] and h.store.read_through(1) == head
        else:
            await h.until(lambda: h.progress[-1] == {JOURNAL: head})
            await h.quiet()
            assert _consumed(h) == [1, 2, 3] and len(h.store.commits) == 1
    finally:
        await cancel_and_wait(h.task)  # type: ignore[arg-type]
        await source.aclose()


def test_is_ack_reads_the_uuid_flags() -> None:
    for flags, ack in ((OUTSIDE_TXN, False), (CONTINUE_TXN, False), (ACK_TXN, True)):
        doc = {"UUID": str(build_uuid(PRODUCER, 12345, flags))}
        env = Envelope(JOURNAL, 0, 1, JSONMessage(doc))
        assert is_ack(env) is ack and uuid_flags(env) == flags
        assert is_ack(Envelope(JOURNAL, 0, 1, _UUIDOnly(build_uuid(PRODUCER, 1, flags)))) is ack


class _UUIDOnly:
    """A message type offering ``get_uuid`` only (no ``uuid_int``)."""

    def __init__(self, uuid: Any) -> None:
        self.uuid = uuid

    def get_uuid(self) -> Any:
        return self.uuid


async def _cancel_then_fail_pending() -> None:
    h = Harness(TxnConfig(min_duration=0, max_duration=10), acks=True)
    h.start()
    h.source.put(1)
    await h.until(lambda: len(h.store.commits) == 1 and len(h.acks) == 1)
    assert h.task is not None
    h.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.task
    h.store.commits[0][1].set_exception(RuntimeError("fenced"))
    h.acks[0].set_exception(DependencyFailed("append to 'out': dependency failed: fenced"))
    await h.quiet()


async def test_a_cancelled_loop_leaves_no_unretrieved_commit_or_ack_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    """A fenced zombie's shard is cancelled while its commit and ACK are pending; both fail
    afterwards (the fence, then DependencyFailed). Nothing logs "exception was never
    retrieved": the loop's ending owns those outcomes, and says in one line that the commit
    failed (the zombie's fence is the operator's to see; the ACK's failure follows from it)."""
    caplog.set_level(logging.WARNING, logger="gazette.consumer.transaction")
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, ctx: reports.append(ctx))
    try:
        await _cancel_then_fail_pending()
        gc.collect()  # the futures are garbage now: unretrieved failures would be reported
        assert not [r for r in reports if "never retrieved" in r.get("message", "")], reports
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "failed: fenced" in lines[0] and not caplog.records[0].exc_info
    finally:
        loop.set_exception_handler(previous)

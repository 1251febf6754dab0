"""The recovery log's FSM, recorder and playback rules as a state machine (hypothesis).

An in-memory journal with an ``author`` register stands in for the broker. Recorders (the real
``Recorder``, minus its network append) create, write, link, rename and unlink files and commit
batches fenced by their author; new owners take over by playing the log and injecting a
hand-off, sometimes raced by the old owner's commit; batches are sometimes appended twice (a
retried append); hints are stored (through JSON) now and then. After every step, playing the
log from the stored hints, and from no hints, must rebuild exactly the committed files.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import recoverylog_pb2 as rl
from gazette.recoverylog import FSM, FSMHints, Recorder
from gazette.recoverylog.errors import PlaybackError, RecoveryLogError
from gazette.recoverylog.ops import (
    HEADER_LENGTH,
    decode_header,
    decode_op,
    encode_op,
    extend_checksum,
)
from gazette.recoverylog.player import apply_for_playback
from gazette.recoverylog.recorder import handoff_op
from gazette.testing.eventually import eventually

LOG = "recovery/logs/shard-1"
PATHS = ["/a", "/b", "/c", "/d/e"]


@dataclass
class Entry:
    offset: int
    op: rl.RecordedOp
    message: bytes
    data: bytes


class MemLog:
    """A journal of ops with an ``author`` register, as the broker keeps one."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.head = 0
        self.author = ""

    def append(self, batch: bytes, *, check: str | None = None, union: str | None = None) -> bool:
        if check is not None and self.author not in ("", check):
            return False
        if union is not None:
            self.author = union
        pos = 0
        while pos < len(batch):
            n = decode_header(batch[pos:pos + HEADER_LENGTH])
            msg = batch[pos + HEADER_LENGTH:pos + HEADER_LENGTH + n]
            op = decode_op(msg)
            end = pos + HEADER_LENGTH + n + (op.write.length if op.HasField("write") else 0)
            op.first_offset, op.last_offset, op.log = self.head + pos, self.head + end, LOG
            self.entries.append(Entry(self.head + pos, op, msg, batch[pos + HEADER_LENGTH + n:end]))
            pos = end
        self.head += len(batch)
        return True


def play(log: MemLog, hints: FSMHints, upto: int | None = None) -> tuple[FSM, dict[int, bytearray]]:
    """Plays ``log`` from ``hints`` as the Player does (seeking to hinted segments)."""
    fsm = FSM.from_hints(hints)
    files: dict[int, bytearray] = {}
    pos = 0
    entries = [e for e in log.entries if upto is None or e.offset < upto]
    i = 0
    while i < len(entries):
        if fsm.hinted_segments and pos < fsm.hinted_segments[0].first_offset:
            pos = fsm.hinted_segments[0].first_offset
            while i < len(entries) and entries[i].offset < pos:
                i += 1
            continue
        e = entries[i]
        op = rl.RecordedOp()
        op.CopyFrom(e.op)
        if apply_for_playback(fsm, op, e.message, e.offset):
            if op.HasField("create"):
                files[op.seq_no] = bytearray()
            elif op.HasField("write"):
                f = files[op.write.fnode]
                end = op.write.offset + op.write.length
                if len(f) < end:
                    f.extend(b"\0" * (end - len(f)))
                f[op.write.offset:end] = e.data
            elif op.HasField("unlink") and op.unlink.fnode not in fsm.live_nodes:
                del files[op.unlink.fnode]
        pos = op.last_offset
        i += 1
    assert not fsm.has_remaining_hints()
    return fsm, files


def contents(fsm: FSM, files: dict[int, bytearray]) -> dict[str, bytes]:
    return {path: bytes(files[fnode]) for path, fnode in fsm.links.items()}


class Cell:
    """A file's content, shared by its hard links."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data


class Owner:
    def __init__(self, fsm: FSM, author: int, log: MemLog, files: dict[int, bytearray]) -> None:
        self.rec = Recorder(None, LOG, fsm, author, "/store", write_head=log.head)  # type: ignore[arg-type]
        cells = {fnode: Cell(bytes(data)) for fnode, data in files.items()}
        self.model = {path: cells[fnode] for path, fnode in fsm.links.items()}  # uncommitted included
        self.alive = True

    def snapshot(self) -> dict[str, bytes]:
        return {path: cell.data for path, cell in self.model.items()}


class RecoveryLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log = MemLog()
        self.next_author = 1
        self.hints: FSMHints | None = None
        self.owner = self._take_over(FSMHints(log=LOG))
        self.zombie: Owner | None = None
        self.committed: dict[str, bytes] = {}  # what the log must rebuild
        self.last_batch = b""

    def _take_over(self, hints: FSMHints, race: Owner | None = None) -> Owner:
        author = self.next_author
        self.next_author += 1
        while True:
            fsm, files = play(self.log, hints)
            if race is not None:
                self._commit(race)  # the old owner commits after we read the head
                race = None
            frame, _ = handoff_op(fsm, author)
            self.log.append(frame, union=f"{author}")
            fsm, files = play(self.log, hints)
            last = self.log.entries[-1].op
            if last.author == author and fsm.next_seq_no == last.seq_no + 1:
                break
        return Owner(fsm, author, self.log, files)

    def _commit(self, owner: Owner) -> bool:
        batch = b"".join(bytes(c) for c in owner.rec.take_batch())
        if not batch:
            return True
        if not self.log.append(batch, check=f"{owner.rec.author}"):
            owner.alive = False
            return False
        owner.rec.write_head = self.log.head
        self.last_batch = batch
        if owner is self.owner:
            self.committed = owner.snapshot()
        return True

    # -- file operations of the current owner (or the zombie) --------------------------

    def _actor(self, zombie: bool) -> Owner:
        return self.zombie if zombie and self.zombie is not None and self.zombie.alive else self.owner

    @rule(path=st.sampled_from(PATHS), zombie=st.booleans())
    def create(self, path: str, zombie: bool) -> None:
        o = self._actor(zombie)
        o.rec.create(path)
        o.model[path] = Cell()

    @rule(path=st.sampled_from(PATHS), data=st.binary(min_size=1, max_size=20), at=st.integers(0, 30),
          zombie=st.booleans())
    def write(self, path: str, data: bytes, at: int, zombie: bool) -> None:
        o = self._actor(zombie)
        if path not in o.model:
            return
        cell = o.model[path]
        at = min(at, len(cell.data))
        o.rec.write_at(o.rec.fnode_of(path), data, at)  # type: ignore[arg-type]
        cell.data = cell.data[:at] + data + cell.data[at + len(data):]

    @rule(path=st.sampled_from(PATHS), zombie=st.booleans())
    def unlink(self, path: str, zombie: bool) -> None:
        o = self._actor(zombie)
        if path in o.model:
            o.rec.unlink(path)
            del o.model[path]

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), hard=st.booleans())
    def link_or_rename(self, src: str, dst: str, hard: bool) -> None:
        o = self.owner
        if src not in o.model or src == dst:
            return
        if hard:
            if dst in o.model:
                return
            o.rec.link(src, dst)
            o.model[dst] = o.model[src]
        else:
            o.rec.rename(src, dst)
            o.model[dst] = o.model.pop(src)

    @rule(zombie=st.booleans())
    def commit(self, zombie: bool) -> None:
        o = self._actor(zombie)
        if not self._commit(o) and o is self.owner:
            raise AssertionError("the current owner was fenced")

    @rule()
    def duplicate_last_batch(self) -> None:
        if self.last_batch:
            self.log.append(self.last_batch, check=f"{self.owner.rec.author}")

    @rule()
    def store_hints(self) -> None:
        self._commit(self.owner)
        self.hints = FSMHints.from_json(self.owner.rec.build_hints().to_json())

    @rule(raced=st.booleans())
    def hand_off(self, raced: bool) -> None:
        self._commit(self.owner)
        old = self.owner
        self.owner = self._take_over(self.hints or FSMHints(log=LOG), race=old if raced else None)
        self.committed = self.owner.snapshot()
        self.zombie = old

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def playback_rebuilds_committed_files(self) -> None:
        for hints in (self.hints, FSMHints(log=LOG)):
            if hints is None:
                continue
            fsm, files = play(self.log, hints)
            assert contents(fsm, files) == self.committed


RecoveryLogMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRecoveryLog = RecoveryLogMachine.TestCase


def test_a_file_created_inside_a_live_files_segment_and_renamed_over_stays_dead() -> None:
    # Hypothesis found this: /d/e and /a are created by one author (one segment of /d/e's file
    # spans /a's create); /d/e is renamed to /b; after a hand-off /b is renamed over /a, whose
    # unlink lies in no hinted segment. Playing from the hints then met /a's create after every
    # hinted file had been created and tracked it, failing on the link of /a (LinkExists).
    m = RecoveryLogMachine()
    m.create(path="/d/e", zombie=False)
    m.create(path="/a", zombie=False)
    m.link_or_rename(src="/d/e", dst="/b", hard=False)
    m.hand_off(raced=False)
    m.link_or_rename(src="/b", dst="/a", hard=False)
    m.store_hints()
    m.playback_rebuilds_committed_files()
    assert m.committed == {"/a": b""}


def test_checksums_chain_over_message_bytes() -> None:
    fsm = FSM(LOG)
    op = rl.RecordedOp(seq_no=1, checksum=0, author=7)
    op.create.path = "/x"
    _, msg = encode_op(op)
    fsm.apply(op, msg)
    assert fsm.next_checksum == extend_checksum(0, msg) and fsm.next_seq_no == 2


def test_corrupt_log_stops_playback_naming_the_offset() -> None:
    log = MemLog()
    rec = Recorder(None, LOG, FSM(LOG), 5, "/s")  # type: ignore[arg-type]
    rec.write_at(rec.create("/a"), b"hello", 0)
    log.append(b"".join(bytes(c) for c in rec.take_batch()))
    bad = rl.RecordedOp(seq_no=rec.fsm.next_seq_no, checksum=rec.fsm.next_checksum ^ 1, author=5)
    log.append(encode_op(bad)[0])
    with pytest.raises(PlaybackError, match=f"at offset {log.entries[-1].offset}: ChecksumMismatch"):
        play(log, FSMHints(log=LOG))
    gap = MemLog()
    gap.entries = [log.entries[0], log.entries[2]]  # the write op (seq 2) is lost
    with pytest.raises(PlaybackError, match="sequence gap"):
        play(gap, FSMHints(log=LOG))


def test_hints_json_is_gazettes() -> None:
    rec = Recorder(None, LOG, FSM(LOG), 0x1234, "/s")  # type: ignore[arg-type]
    rec.write_at(rec.create("/a"), b"x", 0)
    rec.take_batch()
    doc = rec.build_hints().to_json()
    assert doc == (b'{"log":"recovery/logs/shard-1","live_nodes":[{"fnode":1,"segments":[{"author":4660,'
                   b'"first_seq_no":1,"last_seq_no":2}]}],"properties":[]}')
    assert FSMHints.decode(doc) == rec.build_hints()
    assert FSMHints.decode(rec.build_hints().to_proto().SerializeToString()) == rec.build_hints()


@given(st.lists(st.binary(max_size=40), max_size=30), st.integers(1, 64))
def test_coalesce_keeps_the_bytes_in_order_in_bounded_messages(chunks: list[bytes], limit: int) -> None:
    from gazette.recoverylog.recorder import coalesce

    out = coalesce(chunks, limit)
    assert b"".join(bytes(c) for c in out) == b"".join(chunks)
    # every message is within the limit, or is one chunk that alone exceeds it
    assert all(len(c) <= limit or any(c is x for x in chunks) for c in out)


async def test_hints_are_refused_while_a_taken_batch_waits_for_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    # A second flush takes its batch, then waits for the first flush's lock. As that lock is
    # released the second has not yet taken it, so the lock looks free: hints built then named
    # ops not yet in the log, and a standby playing them would reach the write head "with
    # hints left".
    import asyncio

    from gazette.protocol import protocol_pb2 as pb
    from gazette.recoverylog import recorder as recorder_module

    appended: list[int] = []

    async def fake_append(client: object, journal: str, content: list[bytes], **kw: object) -> pb.AppendResponse:
        n = sum(len(c) for c in content)
        begin = sum(appended)
        appended.append(n)
        return pb.AppendResponse(commit=pb.Fragment(journal=journal, begin=begin, end=begin + n))

    monkeypatch.setattr(recorder_module, "append", fake_append)
    rec = Recorder(None, LOG, FSM(LOG), 1, "/store")  # type: ignore[arg-type]
    rec.create("/a")
    await rec.flush()
    assert rec.build_hints().live_nodes  # between batches: hints of what committed

    await rec._lock.acquire()  # noqa: SLF001 - stands in for the previous flush in flight
    rec.create("/b")
    flush = asyncio.ensure_future(rec.flush())
    await asyncio.sleep(0)  # the flush takes its batch and waits for the lock
    assert not rec.pending_bytes
    rec._lock.release()  # noqa: SLF001 - the previous flush ends; this one has not resumed
    with pytest.raises(RecoveryLogError, match="between batches"):
        rec.build_hints()
    await flush
    assert [n.fnode for n in rec.build_hints().live_nodes] == [1, 2]


async def test_a_flush_whose_dependency_failed_fails_the_recorder() -> None:
    # The batch's ops are in the FSM but never reach the log. A recorder that went on (and
    # wrote hints as its shard left) named ops no player finds: standbys picking those hints
    # reached the write head "with hints left" (the stream-sum crash test, where a failed
    # publish to a shared output journal failed the commits of every shard of a process).
    import asyncio

    rec = Recorder(None, LOG, FSM(LOG), 1, "/store")  # type: ignore[arg-type]
    rec.create("/a")
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("publish failed"))
    with pytest.raises(RuntimeError, match="publish failed"):
        await rec.flush([failed])
    with pytest.raises(RecoveryLogError, match="failed: publish failed"):
        rec.build_hints()
    with pytest.raises(RecoveryLogError):
        rec.create("/b")


def _logged_recorder() -> tuple[Recorder, list[bytes], list[asyncio.Future[None]]]:
    """A recorder whose batches land in a list, each append held until the test releases
    its gate (``gates``, one per append in order, made as the append starts)."""
    rec = Recorder(None, LOG, FSM(LOG), 1, "/store")  # type: ignore[arg-type]
    batches: list[bytes] = []
    gates: list[asyncio.Future[None]] = []

    async def to_list(chunks: list[bytes | memoryview]) -> pb.AppendResponse:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gates.append(gate)
        await gate
        begin = sum(len(b) for b in batches)
        batches.append(b"".join(bytes(c) for c in chunks))
        return pb.AppendResponse(commit=pb.Fragment(journal=LOG, begin=begin, end=begin + len(batches[-1])))

    rec.append_via = to_list
    return rec, batches, gates


async def test_start_flush_takes_its_batch_at_the_call_and_flushes_in_order() -> None:
    # The embedded stores start a commit while the previous one's append is in flight: what
    # is captured after start_flush belongs to the next flush, whenever the first task runs.
    rec, batches, gates = _logged_recorder()
    rec.create("/a")
    first = rec.start_flush()
    rec.create("/b")  # before the first flush's task has run at all
    second = rec.start_flush()
    assert not rec.pending_bytes
    with pytest.raises(RecoveryLogError, match="between batches"):
        rec.build_hints()
    hints = rec.build_pending_hints()  # names both batches, valid once they committed
    assert [n.fnode for n in hints.live_nodes] == [1, 2]
    settled = asyncio.ensure_future(rec.settled())
    await eventually(lambda: len(gates) == 1, "the first append")
    await asyncio.sleep(0)
    assert len(gates) == 1 and not settled.done()  # one append in flight at a time
    gates[0].set_result(None)
    await first
    await eventually(lambda: len(gates) == 2, "the second append")
    gates[1].set_result(None)
    await second
    await settled
    assert [decode_op(b[HEADER_LENGTH:]).create.path for b in batches] == ["/a", "/b"]
    assert rec.build_hints() == hints


async def test_a_failed_flush_fails_the_next_without_appending_it() -> None:
    rec, batches, gates = _logged_recorder()
    rec.create("/a")
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = rec.start_flush([dep])
    rec.create("/b")
    second = rec.start_flush()
    hints = rec.build_pending_hints()
    settled = asyncio.ensure_future(rec.settled())
    dep.set_exception(RuntimeError("publish failed"))
    with pytest.raises(RuntimeError, match="publish failed"):
        await first
    with pytest.raises(RecoveryLogError, match="failed: publish failed"):
        await second
    with pytest.raises(RecoveryLogError):
        await settled  # the hints built above name a batch that never landed
    assert batches == [] and gates == [] and hints.live_nodes


async def test_a_flush_cancelled_before_it_ran_fails_the_recorder() -> None:
    rec, batches, _ = _logged_recorder()
    rec.create("/a")
    flush = rec.start_flush()
    flush.cancel()  # before its first step: its coroutine never runs
    with pytest.raises(asyncio.CancelledError):
        await flush
    assert isinstance(rec.failed, asyncio.CancelledError) and batches == []
    with pytest.raises(RecoveryLogError):
        rec.build_pending_hints()


async def test_ops_recorded_while_a_flush_is_in_flight_are_hinted_where_they_land() -> None:
    # An op's first offset is where the player seeks to replay it: one recorded while the
    # previous batch's append is in flight lands after that batch, not at the write head the
    # recorder knew (the crash test's "frame header ... lacks the fixed-framing word").
    rec, batches, gates = _logged_recorder()
    rec.create("/a")
    first = rec.start_flush()
    rec.create("/b")  # the first batch is taken and not yet appended
    rec.write_at(rec.fsm.links["/b"], b"payload", 0)
    second = rec.start_flush()
    await eventually(lambda: len(gates) == 1, "the first append")
    gates[0].set_result(None)
    await first
    rec.create("/c")  # the second batch is in flight
    third = rec.start_flush()
    await eventually(lambda: len(gates) == 2, "the second append")
    gates[1].set_result(None)
    await second
    await eventually(lambda: len(gates) == 3, "the third append")
    gates[2].set_result(None)
    await third
    log = b"".join(batches)
    starts = {n.fnode: n.segments[0].first_offset for n in rec.build_hints().live_nodes}
    lands = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [starts[rec.fsm.links[p]] for p in ("/a", "/b", "/c")] == lands
    for path, at in zip(("/a", "/b", "/c"), lands, strict=True):
        size = decode_header(log[at:at + HEADER_LENGTH])  # a frame starts there (its word)
        assert decode_op(log[at + HEADER_LENGTH:at + HEADER_LENGTH + size]).create.path == path

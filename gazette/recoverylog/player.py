"""The player: rebuilds a store's directory from its recovery log (Gazette's
``recoverylog.Player``), and tails it as a hot standby.

``play()`` reads the log from the hints' first segment (skipping segments of files no longer
live, and segments of dead branches), applies each op to an FSM and re-enacts it on disk: files
are staged as ``{dir}/.fnodes/{fnode}`` and linked to their paths only when playback completes,
so a half-played directory is never mistaken for a store. It reaches the log's write head, then
either *finishes* there (``finish_at_write_head``: read-only recovery, ``gazctl shards
recover``) or *hands off* (``inject_handoff(author)``: appends a no-op with
``union_registers={author}``, reads through it, and completes if its no-op was the one
applied, so a recorder seeded from ``fsm`` continues the one linear history). Until asked,
a player at the head keeps tailing: that is a hot standby.

States (one step each): BACKFILL → TAIL (at the head, blocking reads) → EXIT_AT_HEAD |
INJECT_HANDOFF_AT_HEAD → READ_HANDOFF_BARRIER → COMPLETE. Reads below the write head taken at
the start (or the hand-off's end) block, so a range a broker cannot serve yet is waited for;
only at that head does a non-blocking read find where the log ends.

Invariants:

* A corrupt or mis-sequenced log (a frame without the fixed-framing word, an undecodable op or
  an unknown op, a checksum mismatch, a sequence gap, hinted segments beyond the write head)
  raises ``PlaybackError`` naming the log and offset, and the directory is removed: a partially
  recovered store is never left behind. Duplicates (a sequence number already applied) and ops
  of dead branches (a non-hinted author) are skipped, as they are normal in a raced log.
* Progress (bytes read, bytes remaining to the head, live files, rate and ETA) is reported to
  ``on_progress`` and the ``gazette_recoverylog_playback_*`` metrics every
  ``progress_interval`` seconds of the injected clock, and once at completion.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gazette.client import JournalClient, RetryReader
from gazette.client.appender import append
from gazette.lean_event import LeanEvent
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import recoverylog_pb2 as rl
from gazette.recoverylog import metrics
from gazette.recoverylog.errors import (
    FnodeNotTracked,
    FSMError,
    NotHintedAuthor,
    PlaybackError,
    WrongSeqNo,
)
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import FSMHints
from gazette.recoverylog.ops import HEADER_LENGTH, decode_header, decode_op, new_author
from gazette.recoverylog.recorder import Recorder, handoff_op
from gazette.tasks import cancel_and_wait, wait_first

__all__ = ["STAGING_DIR", "PlaybackProgress", "Player", "PlayerState", "apply_for_playback", "take_over"]

log = logging.getLogger(__name__)

STAGING_DIR = ".fnodes"


class PlayerState(enum.Enum):
    BACKFILL = "backfill"
    TAIL = "tail"
    EXIT_AT_HEAD = "exit-at-head"
    INJECT_HANDOFF_AT_HEAD = "inject-handoff-at-head"
    READ_HANDOFF_BARRIER = "read-handoff-barrier"
    COMPLETE = "complete"


@dataclass(frozen=True, slots=True)
class PlaybackProgress:
    log: str
    offset: int
    read_bytes: int
    remaining_bytes: int
    files: int
    elapsed: float
    state: PlayerState

    @property
    def rate(self) -> float:
        """Bytes per second so far."""
        return self.read_bytes / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds to the head at the rate so far (None before there is a rate)."""
        return self.remaining_bytes / self.rate if self.rate > 0 else None

    def describe(self) -> str:
        eta = "unknown" if self.eta is None else f"{self.eta:.1f}s"
        return (f"{self.log}@{self.offset}: {self.read_bytes / 1e6:.1f} MB read, "
                f"{self.remaining_bytes / 1e6:.1f} MB to go, {self.files} files, "
                f"{self.rate / 1e6:.1f} MB/s, ETA {eta}")


class _Interrupted(Exception):
    pass


class _AtHead(Exception):
    pass


class _LogReader:
    """A buffered reader of one journal at a time over ``RetryReader``.

    The buffer is the chunks as read, not one growing byte string: an op's write data is
    passed to its sink as views of the chunks it arrived in, and only a frame that straddles
    chunks is joined (frames are small), so the log's bytes are copied once, to their file."""

    def __init__(self, client: JournalClient,
                 next_chunk: Callable[[bool, asyncio.Event | None], Awaitable[bytes]] | None = None) -> None:
        self.client = client
        # Where chunks come from: the journal through a RetryReader, or a test's own source.
        self._next_chunk = next_chunk if next_chunk is not None else self._read_chunk
        self.journal = ""
        self.offset = 0  # journal offset of the next unconsumed byte
        self.read_bytes = 0
        self._chunks: collections.deque[bytes | memoryview] = collections.deque()
        self._pos = 0  # consumed bytes of the first chunk
        self._buffered = 0
        self._rr: RetryReader | None = None
        self._block = False

    async def seek(self, journal: str, offset: int) -> None:
        await self.close()
        self.journal, self.offset = journal, offset
        self._chunks.clear()
        self._pos = self._buffered = 0

    async def close(self) -> None:
        if self._rr is not None:
            rr, self._rr = self._rr, None
            await rr.aclose()

    @property
    def buffered(self) -> int:
        return self._buffered

    async def _read_chunk(self, block: bool, interrupt: asyncio.Event | None) -> bytes:
        end = self.offset + self.buffered
        if self._rr is None or self._block != block:
            await self.close()
            self._rr, self._block = RetryReader(self.client, pb.ReadRequest(
                journal=self.journal, offset=end, block=block)), block
        rr = self._rr
        if block and interrupt is not None:
            task = asyncio.ensure_future(rr.__anext__())
            # Awaits outside handlers: compiled, a coroutine that suspends in an except or
            # finally block mixes up exception states with other tasks (a mypyc limitation).
            waited = await _outcome(wait_first(task, interrupt.wait()))
            if not task.done():
                cancelled = await _outcome(cancel_and_wait(task))
                await self.close()
                if cancelled is not None:
                    raise cancelled
            if waited is not None:
                raise waited
            if task.cancelled():
                raise _Interrupted
            try:
                chunk = task.result()
            except StopAsyncIteration:
                self._rr = None
                raise _AtHead from None
        else:
            try:
                chunk = await rr.__anext__()
            except StopAsyncIteration:
                self._rr = None
                raise _AtHead from None
        begin = rr.offset - len(chunk)
        if begin != end:
            if self.buffered:
                raise PlaybackError(self.journal, self.offset,
                                    f"the log jumps from {end} to {begin} in the middle of an op")
            log.warning("recovery log offset jump", extra={"log": self.journal, "from": end, "to": begin})
            self.offset = begin
        self.read_bytes += len(chunk)
        return chunk

    async def need(self, n: int, block: bool, interrupt: asyncio.Event | None) -> memoryview:
        """``n`` buffered bytes at the read position (not consumed)."""
        while self._buffered < n:
            chunk = await self._next_chunk(block, interrupt)
            if chunk:
                self._chunks.append(chunk)
                self._buffered += len(chunk)
        chunks = self._chunks
        if len(chunks[0]) - self._pos < n:  # straddles chunks: join just its n bytes
            parts = [memoryview(chunks.popleft())[self._pos:]]
            size = len(parts[0])
            while size < n:
                nxt = memoryview(chunks.popleft())
                take = min(len(nxt), n - size)
                parts.append(nxt[:take])
                size += take
                if take < len(nxt):
                    chunks.appendleft(nxt[take:])  # the rest stays where it arrived
            chunks.appendleft(b"".join(parts))
            self._pos = 0
        return memoryview(chunks[0])[self._pos:self._pos + n]

    def consume(self, n: int) -> None:
        self.offset += n
        self._buffered -= n
        chunks = self._chunks
        n += self._pos
        while chunks and n >= len(chunks[0]):
            n -= len(chunks.popleft())
        self._pos = n

    async def stream(self, n: int, sink: Callable[[memoryview, int], None]) -> None:
        """Passes the next ``n`` bytes to ``sink(data, position)`` and consumes them (blocking:
        the op's frame is in the log, so its data is too)."""
        done = 0
        while done < n:
            if not self._buffered:
                chunk = await self._next_chunk(True, None)
                if not chunk:
                    continue
                self._chunks.append(chunk)
                self._buffered += len(chunk)
            first = self._chunks[0]
            k = min(len(first) - self._pos, n - done)
            with memoryview(first) as mv, mv[self._pos:self._pos + k] as part:
                sink(part, done)
            done += k
            self.consume(k)


class Player:
    def __init__(self, client: JournalClient, hints: FSMHints, directory: str, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_progress: Callable[[PlaybackProgress], None] | None = None,
                 progress_interval: float = 5.0) -> None:
        self.client = client
        self.hints = hints
        self.dir = os.path.abspath(directory)
        self.fsm = FSM.from_hints(hints)
        self.state = PlayerState.BACKFILL
        self.tailing = LeanEvent()  # set once playback first reaches the write head
        self.write_head = 0  # of hints.log, as of the last time playback reached it
        self._clock = clock
        self._on_progress = on_progress
        self._interval = progress_interval
        self._handoff: int | None = None  # 0: finish at the head; else the author to hand off to
        self._asked = LeanEvent()
        self._files: dict[int, int] = {}  # fnode -> fd of its staged file
        self._reader = _LogReader(client)
        self._started = 0.0
        self._last_report = 0.0
        self._target: dict[str, int] = {}
        self._reported_bytes = 0  # read bytes already counted in the metric
        self._task: asyncio.Task[FSM] | None = None  # playback started by start(), owned here

    # -- requests -------------------------------------------------------------------------

    def finish_at_write_head(self) -> None:
        self._request(0)

    def inject_handoff(self, author: int) -> None:
        if author == 0:
            raise ValueError("a hand-off needs a non-zero author")
        self._request(author)

    def _request(self, author: int) -> None:
        if self._asked.is_set():
            raise RuntimeError("the player was already asked to finish or hand off")
        self._handoff = author
        self._asked.set()

    # -- playback -------------------------------------------------------------------------

    def staged_path(self, fnode: int) -> str:
        return os.path.join(self.dir, STAGING_DIR, str(fnode))

    def start(self) -> asyncio.Task[FSM]:
        """Starts ``play()`` in the background, once (later calls return the same task). The
        task is the player's: ``aclose`` cancels it. A hot standby starts its player, and the
        shard promoted from it later hands that same player off."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.play())
        return self._task

    async def aclose(self) -> None:
        """Cancels a started playback, waits for it to end, and removes the directory."""
        failed = None
        if self._task is not None:
            # Its failure is retrieved: its owner already reported it, or never will need to.
            failed = await _outcome(cancel_and_wait(self._task))
        await asyncio.to_thread(shutil.rmtree, self.dir, ignore_errors=True)
        if failed is not None:
            raise failed

    async def play(self) -> FSM:
        """Plays the log until finished or handed off; returns the recovered FSM."""
        self._started = self._last_report = self._clock()
        failed = await _outcome(self._play())
        if failed is not None:
            self._abort()
        await self._reader.close()
        if failed is not None:
            raise failed
        return self.fsm

    async def _play(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(os.path.join(self.dir, STAGING_DIR))
        logs = {self.hints.log} | {s.log for s in self.fsm.hinted_segments}
        heads = {j: await _append_barrier(self.client, j) for j in sorted(logs)}
        for seg in self.fsm.hinted_segments:
            head = heads[seg.log]
            if seg.first_offset >= head or seg.last_offset > head:
                raise PlaybackError(seg.log, seg.first_offset,
                                    f"write head is {head}, before hinted segment {seg}; possible data loss")
        self._target = dict(heads)
        reader = self._reader
        read_through = 0
        while True:
            if self.fsm.hinted_segments:
                seg = self.fsm.hinted_segments[0]
                if reader.journal != seg.log or reader.offset < seg.first_offset:
                    await reader.seek(seg.log, seg.first_offset)
                    read_through = heads[seg.log]
                elif reader.offset >= read_through:
                    raise PlaybackError(reader.journal, reader.offset,
                                        f"reached the write head {read_through} with hints left; possible data loss")
            elif not reader.journal:
                await reader.seek(self.hints.log, 0)
                read_through = heads[self.hints.log]
            elif reader.journal != self.hints.log:
                raise PlaybackError(reader.journal, reader.offset, "hints used up on a log other than the hinted one")

            if self._asked.is_set() and self.state in (PlayerState.BACKFILL, PlayerState.TAIL):
                self.state = (PlayerState.EXIT_AT_HEAD if self._handoff == 0
                              else PlayerState.INJECT_HANDOFF_AT_HEAD)
            self._maybe_report()
            # Below the write head, block: a broker that does not have the range yet (its index
            # not yet refreshed after a failover, a replica catching up) is waited for, not
            # taken for the log's end. At the head, a non-blocking read tells it (as Gazette).
            block = self.state is PlayerState.TAIL or reader.offset < read_through
            try:
                op_begin = reader.offset
                op, message = await self._next_op(block)
            except _Interrupted:
                continue
            except _AtHead:
                at_head = True  # acted on below: compiled, a coroutine must not suspend in a handler
            else:
                at_head = False
            if at_head:
                if reader.offset < read_through:
                    raise PlaybackError(reader.journal, reader.offset,
                                        f"the log ends before its write head {read_through}") from None
                self.write_head = reader.offset
                if not self.tailing.is_set():
                    self.tailing.set()
                    log.info("recovery log playback reached the write head",
                             extra={"log": reader.journal, "offset": reader.offset})
                if self.state is PlayerState.BACKFILL:
                    self.state = PlayerState.TAIL
                elif self.state is PlayerState.EXIT_AT_HEAD:
                    self._complete()
                    return
                elif self.state is PlayerState.INJECT_HANDOFF_AT_HEAD:
                    assert self._handoff
                    frame, registers = handoff_op(self.fsm, self._handoff)
                    # Retried until it lands (or playback is cancelled): brokers failing over
                    # is no reason to fail the shard. A repeated op is skipped by players.
                    resp = await append(self.client, self.hints.log, frame, union_registers=registers)
                    read_through = resp.commit.end
                    self.state = PlayerState.READ_HANDOFF_BARRIER
                elif self.state is PlayerState.READ_HANDOFF_BARRIER:
                    raise PlaybackError(reader.journal, reader.offset,
                                        "read to the write head without finding the injected hand-off") from None
                continue
            applied = await self._apply(op, message, op_begin)
            if self._handoff and op.author == self._handoff and self.state is PlayerState.READ_HANDOFF_BARRIER:
                if applied:
                    self._complete()
                    return
                self.state = PlayerState.INJECT_HANDOFF_AT_HEAD

    async def _next_op(self, block: bool) -> tuple[rl.RecordedOp, bytes]:
        reader = self._reader
        interrupt = None if self._asked.is_set() else self._asked
        header = await reader.need(HEADER_LENGTH, block, interrupt)
        try:
            length = decode_header(header)
        except ValueError as err:
            raise PlaybackError(reader.journal, reader.offset, str(err)) from None
        finally:
            header.release()
        # The frame is in the log whole (appends are atomic): read it without interruption.
        view = await reader.need(HEADER_LENGTH + length, True, None)
        message = bytes(view[HEADER_LENGTH:])
        view.release()
        try:
            op = decode_op(message)
        except ValueError as err:
            raise PlaybackError(reader.journal, reader.offset, str(err)) from None
        op.first_offset = reader.offset
        op.last_offset = reader.offset + HEADER_LENGTH + length + (op.write.length if op.HasField("write") else 0)
        op.log = reader.journal
        reader.consume(HEADER_LENGTH + length)
        return op, message

    async def _apply(self, op: rl.RecordedOp, message: bytes, offset: int) -> bool:
        applied = apply_for_playback(self.fsm, op, message, offset)
        try:
            if op.HasField("write"):
                w = op.write
                target = self._files.get(w.fnode) if applied else None
                if target is None:
                    await self._reader.stream(w.length, lambda data, pos: None)
                else:
                    fd = target
                    await self._reader.stream(w.length, lambda data, pos: _pwrite_all(fd, data, w.offset + pos))
            elif not applied:
                pass
            elif op.HasField("create"):
                self._files[op.seq_no] = os.open(self.staged_path(op.seq_no),
                                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            elif op.HasField("unlink") and op.unlink.fnode not in self.fsm.live_nodes:
                fd = self._files.pop(op.unlink.fnode)
                os.close(fd)
                os.unlink(self.staged_path(op.unlink.fnode))
        except OSError as err:
            raise PlaybackError(op.log, offset, f"re-enacting op {op.seq_no} in {self.dir}: {err}") from err
        return applied

    def _complete(self) -> None:
        if self.fsm.has_remaining_hints():
            raise PlaybackError(self._reader.journal, self._reader.offset, "completed with hints left")
        for fnode, node in self.fsm.live_nodes.items():
            os.close(self._files.pop(fnode))
            for path in node.links:
                target = os.path.join(self.dir, path.lstrip("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.link(self.staged_path(fnode), target)
            os.unlink(self.staged_path(fnode))
        if self._files:
            raise PlaybackError(self._reader.journal, self._reader.offset,
                                f"staged files {sorted(self._files)} are not live in the FSM")
        os.rmdir(os.path.join(self.dir, STAGING_DIR))
        for path, content in self.fsm.properties.items():
            target = os.path.join(self.dir, path.lstrip("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "x") as f:
                f.write(content)
        self.state = PlayerState.COMPLETE
        self.write_head = self._reader.offset
        self._maybe_report(force=True)
        log.info("recovery log playback complete", extra={
            "log": self._reader.journal, "offset": self._reader.offset, "files": len(self.fsm.live_nodes),
            "next_seq_no": self.fsm.next_seq_no, "dir": self.dir})

    def _abort(self) -> None:
        for fd in self._files.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._files.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def progress(self) -> PlaybackProgress:
        r = self._reader
        head = max(self._target.get(self.hints.log, 0), self.write_head)
        remaining = max(0, head - r.offset) if r.journal == self.hints.log else \
            max(0, self._target.get(r.journal, 0) - r.offset) + head
        return PlaybackProgress(log=r.journal or self.hints.log, offset=r.offset, read_bytes=r.read_bytes,
                                remaining_bytes=remaining, files=len(self._files) or len(self.fsm.live_nodes),
                                elapsed=self._clock() - self._started, state=self.state)

    def _maybe_report(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_report < self._interval:
            return
        self._last_report = now
        p = self.progress()
        metrics.PLAYBACK_REMAINING.labels(self.hints.log).set(p.remaining_bytes)
        metrics.PLAYBACK_FILES.labels(self.hints.log).set(p.files)
        metrics.PLAYBACK_BYTES.labels(self.hints.log).inc(max(0, p.read_bytes - self._reported_bytes))
        self._reported_bytes = p.read_bytes
        if self._on_progress is not None:
            self._on_progress(p)
        elif self.state is not PlayerState.TAIL:
            log.info("recovery log playback: %s", p.describe())


async def take_over(player: Player, author: int | None = None) -> Recorder:
    """Plays ``player``'s log (or goes on with its started playback: a hot standby's), hands it
    off to ``author`` (a new random one by default) at the write head, and returns the recorder
    that continues the log as its fenced owner. Cancelling the caller cancels playback (and
    removes its directory)."""
    author = author or new_author()
    task = player.start()
    player.inject_handoff(author)
    try:
        fsm = await asyncio.shield(task)
    except asyncio.CancelledError as err:
        cancelled = err  # acted on below: compiled, a coroutine must not suspend in a handler
    else:
        return Recorder(player.client, player.hints.log, fsm, author, player.dir, write_head=player.write_head)
    await player.aclose()
    raise cancelled


async def _outcome(aw: Awaitable[Any]) -> BaseException | None:
    """Awaits ``aw``; its exception (a cancellation too) returned rather than raised, for the
    caller to act on outside any handler: compiled, a coroutine that suspends inside an
    ``except`` or ``finally`` block mixes up exception states with other tasks (a mypyc
    limitation; ``tests/unit/test_compiled_build.py`` keeps such awaits out)."""
    try:
        await aw
    except BaseException as err:  # noqa: BLE001 - handed back, raised by the caller
        return err
    return None


def apply_for_playback(fsm: FSM, op: rl.RecordedOp, message: bytes | memoryview, offset: int) -> bool:
    """Applies ``op`` read at ``offset`` of ``op.log`` to ``fsm`` as a player does: True if its
    effect is to be re-enacted; False for ops to skip (duplicates, dead branches, files the
    hints say are dead); ``PlaybackError`` for a corrupt or mis-sequenced log."""
    try:
        fsm.apply(op, message)
        return True
    except (FnodeNotTracked, NotHintedAuthor):
        return False
    except WrongSeqNo:
        if op.seq_no >= fsm.next_seq_no:
            raise PlaybackError(op.log, offset, f"sequence gap: op {op.seq_no} where "
                                f"{fsm.next_seq_no} was expected") from None
        return False  # a duplicate, or a raced recorder's op already superseded
    except FSMError as err:
        raise PlaybackError(op.log, offset, f"{type(err).__name__}: {err}") from None


async def _append_barrier(client: JournalClient, journal: str) -> int:
    """The journal's end offset, by an empty append: a barrier (everything appended before it
    is readable below the offset), unlike ``gazette.client.write_head``'s metadata read, which
    may answer before appends in flight commit. Retried while the journal's brokers are being
    assigned."""
    resp = await append(client, journal, b"")
    return int(resp.commit.end)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n

"""The recorder: turns a store's file changes into recovery-log operations, appended
atomically and fenced (Gazette's ``recoverylog.Recorder``).

A store (or its capture: a directory scan, a WAL scan) calls ``create``, ``write_at``,
``unlink``, ``link`` and ``rename`` as files change; each call encodes an op, applies it to the
recorder's FSM and buffers it. ``flush`` appends everything buffered as *one* journal append
whose ``check_registers`` is this recorder's author fence, so the batch commits whole or not at
all, and only while no other process has taken the log over.

Invariants:

* Ops are sequenced and checksummed from the FSM the player recovered, so the log stays one
  linear history; each op's ``first_offset`` is a lower bound of where it lands (the write head
  known when it was buffered plus its position in the batch), ``last_offset`` is left unknown
  (0), as Gazette's recorder does.
* Flushes are serialised (one in flight): batch N+1 is appended only after batch N committed.
* Once an append fails (fenced: REGISTER_MISMATCH; or any other error), or a flush that took a
  batch fails before appending it (a dependency in ``wait_for`` failed, or it was cancelled),
  the FSM has diverged from the log: the recorder is *failed* and every later call raises.
  The owner's recourse is to drop the store and recover it from the log.
* ``build_hints`` describes only committed ops: it refuses while a batch is buffered, taken
  by a flush and not yet appended, or after a failure. (Hints naming ops of a batch still in
  flight would send a standby reading them to the write head with hints left.)
  ``build_pending_hints`` also describes batches in flight, and is to be stored only once
  ``settled()`` returned after it: then every batch it names committed.
* ``start_flush`` takes the buffered batch when called, so that flushes may overlap their
  owner's next capture; they still append in call order, one at a time.
* An op's ``first_offset`` (where a player seeks to replay it) is the write head plus the
  bytes of batches taken by flushes and not yet committed plus those buffered before it: an
  op recorded while a flush is in flight lands after that flush's batch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from gazette.client import JournalClient
from gazette.client.appender import append
from gazette.client.errors import AppendError
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import recoverylog_pb2 as rl
from gazette.recoverylog.errors import LogFencedError, RecoveryLogError
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import FSMHints
from gazette.recoverylog.ops import encode_op, fence, fence_selector

__all__ = ["MESSAGE_BYTES", "Recorder", "coalesce", "handoff_op"]


class Recorder:
    def __init__(self, client: JournalClient, log: str, fsm: FSM, author: int, directory: str, *,
                 write_head: int = 0) -> None:
        self.client = client
        self.log = log
        self.fsm = fsm
        self.author = author
        self.dir = os.path.abspath(directory)
        self.write_head = write_head  # end offset of the last batch known to have committed
        self.failed: BaseException | None = None
        self._fence = fence_selector(author)  # the check_registers of every append
        self.appended_bytes = 0
        self.appends = 0
        self._chunks: list[bytes | memoryview] = []
        self._pending = 0
        # Bytes of batches taken by flushes whose appends have not committed: an op recorded
        # meanwhile lands after them (flushes append in order), so its first offset counts them.
        self._inflight = 0
        self._unsettled = 0  # batches taken by flush and not yet appended
        self._lock = asyncio.Lock()
        # How a batch reaches the log: None, a fenced Append RPC through ``client``; a test
        # sets a function of the batch's (coalesced) chunks returning the append's response.
        self.append_via: Callable[[list[bytes | memoryview]], Awaitable[pb.AppendResponse]] | None = None

    # -- recording ------------------------------------------------------------------------

    def _check(self) -> None:
        if self.failed is not None:
            raise RecoveryLogError(f"the recorder of {self.log} failed: {self.failed}")

    def _process(self, op: rl.RecordedOp) -> None:
        self._check()
        op.author, op.seq_no, op.checksum = self.author, self.fsm.next_seq_no, self.fsm.next_checksum
        frame, message = encode_op(op)
        op.first_offset = self.write_head + self._inflight + self._pending
        op.log = self.log
        self.fsm.apply(op, message)
        self._chunks.append(frame)
        self._pending += len(frame)

    def path_of(self, path: str) -> str:
        """The log's name of ``path`` (``/a/b``): a path under the store's directory is made
        relative to it; any other path is already the log's name."""
        if path.startswith(self.dir + os.sep):
            path = path[len(self.dir):]
        return "/" + os.path.normpath(path).replace(os.sep, "/").lstrip("/")

    def fnode_of(self, path: str) -> int | None:
        return self.fsm.links.get(self.path_of(path))

    def create(self, path: str) -> int:
        """Records a new, empty file at ``path`` (replacing any file there); its fnode."""
        p = self.path_of(path)
        if p in self.fsm.links:
            self.unlink(p)
        op = rl.RecordedOp()
        op.create.path = p
        self._process(op)
        return self.fsm.links[p]

    def write_at(self, fnode: int, data: bytes | memoryview, offset: int) -> None:
        if not len(data):
            return
        op = rl.RecordedOp()
        op.write.fnode, op.write.offset, op.write.length = fnode, offset, len(data)
        self._process(op)
        self._chunks.append(data)
        self._pending += len(data)

    def unlink(self, path: str) -> None:
        p = self.path_of(path)
        op = rl.RecordedOp()
        op.unlink.fnode, op.unlink.path = self.fsm.links[p], p
        self._process(op)

    def link(self, src: str, target: str) -> None:
        op = rl.RecordedOp()
        op.link.fnode, op.link.path = self.fsm.links[self.path_of(src)], self.path_of(target)
        self._process(op)

    def rename(self, src: str, target: str) -> None:
        s, t = self.path_of(src), self.path_of(target)
        if t in self.fsm.links:
            self.unlink(t)
        self.link(s, t)
        self.unlink(s)

    # -- appending ------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        return self._pending

    def take_batch(self) -> list[bytes | memoryview]:
        """The buffered ops (and write data) as one batch; the buffer starts over."""
        chunks, self._chunks, self._pending = self._chunks, [], 0
        return chunks

    async def flush(self, wait_for: Iterable[Awaitable[Any]] = ()) -> pb.AppendResponse | None:
        """Appends what is buffered as one fenced append, after every ``wait_for`` resolved.

        Returns the append's response (None if nothing was buffered); raises ``LogFencedError``
        when another process holds the log, and fails the recorder on any error."""
        return await self.start_flush(wait_for)

    def start_flush(self, wait_for: Iterable[Awaitable[Any]] = ()) -> asyncio.Future[pb.AppendResponse | None]:
        """``flush`` as a task, the batch taken *now*: what is captured after this call
        belongs to the next flush, whenever this task first runs (a store starting its next
        commit while this one's append is in flight relies on it)."""
        self._check()
        size = self._pending
        self._inflight += size  # until its append commits (``_append_after``)
        batch = self.take_batch()
        # Until its append commits, the batch's ops are in the FSM but not in the log: hints
        # are refused meanwhile (``_unsettled``, which the lock alone does not show at the
        # instant the previous flush releases it and this one has yet to take it).
        self._unsettled += bool(batch)
        task = asyncio.ensure_future(self._append_after(batch, size, wait_for))

        def settled(t: asyncio.Future[pb.AppendResponse | None]) -> None:
            # A callback, not a finally: a task cancelled before its first step never runs
            # its coroutine's body, and its batch is lost all the same.
            self._unsettled -= bool(batch)
            if t.cancelled():
                self._lost(batch, asyncio.CancelledError())
            else:
                t.exception()  # seen here; the owner awaits the task for its outcome
        task.add_done_callback(settled)
        return task

    def _lost(self, batch: Sequence[bytes | memoryview], err: BaseException) -> None:
        # A batch that will never be in the log (a dependency failed, the flush was
        # cancelled): hints built from the FSM now would name ops no player finds.
        if batch and self.failed is None:
            self.failed = err

    async def _append_after(self, batch: Sequence[bytes | memoryview], size: int,
                            wait_for: Iterable[Awaitable[Any]]) -> pb.AppendResponse | None:
        try:
            async with self._lock:  # an empty flush is still ordered after the ones before it
                for f in wait_for:
                    await f
                self._check()
                if not batch:
                    return None
                resp = await self.append_batch(batch)
                # In the step that advanced write_head past it: no op is recorded in between.
                self._inflight -= size
                return resp
        except BaseException as err:
            # Marked failed in this step, before the next flush waiting for the lock resumes:
            # it must not append its batch after this one's hole.
            self._lost(batch, err)
            raise

    async def settled(self) -> None:
        """Returns once every flush started before the call resolved; raises if the recorder
        failed (hints built before the call are then committed: ``build_pending_hints``)."""
        async with self._lock:
            self._check()

    async def append_batch(self, batch: Sequence[bytes | memoryview]) -> pb.AppendResponse:
        try:
            # Retried while brokers fail over, however long (Gazette's recorder does the same);
            # a batch that landed twice is skipped by players as a duplicate.
            via = self.append_via
            if via is not None:
                resp = await via(coalesce(batch))
            else:
                resp = await append(self.client, self.log, coalesce(batch), check_registers=self._fence)
        except AppendError as err:
            if err.status == pb.REGISTER_MISMATCH:
                self.failed = LogFencedError(f"recovery log {self.log} is fenced by another author "
                                          f"(this recorder is {self.author:08x}): a newer primary took over")
                raise self.failed from None
            self.failed = err
            raise
        except BaseException as other:  # a name per clause: mypyc types one by its first binding
            self.failed = other
            raise
        self.write_head = max(self.write_head, resp.commit.end)
        self.appended_bytes += resp.commit.end - resp.commit.begin
        self.appends += 1
        return resp

    def build_hints(self) -> FSMHints:
        """Hints of everything this recorder has committed (see the module docstring)."""
        self._check()
        if self._chunks or self._unsettled:
            raise RecoveryLogError("hints are built between batches, not while one is pending")
        return self.fsm.build_hints(self.log)

    def build_pending_hints(self) -> FSMHints:
        """Hints of everything this recorder has taken into flushes, committed or not: valid
        once ``settled()`` (called after this) returned. Refused while ops are buffered and
        not yet taken by a flush. For an owner whose flushes overlap, so that no instant falls
        between batches."""
        self._check()
        if self._chunks:
            raise RecoveryLogError("hints are built between captures, not while ops are buffered")
        return self.fsm.build_hints(self.log)


MESSAGE_BYTES = 1 << 20
"""Chunks of a batch are joined into append messages of up to this size."""


def coalesce(chunks: Sequence[bytes | memoryview], limit: int = MESSAGE_BYTES) -> list[bytes | memoryview]:
    """``chunks`` joined into runs of at most ``limit`` bytes (larger chunks pass as they are).

    A batch is a frame and a data chunk per op: hundreds of small chunks for a SQLite
    checkpoint's scattered pages. One append message each would cost far more (framing, a
    write call, the broker's per-message work) than the one copy of joining them."""
    out: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    size = 0
    for c in chunks:
        n = len(c)
        if run and (size + n > limit or n >= limit):
            out.append(b"".join(run) if len(run) > 1 else run[0])
            run, size = [], 0
        if n >= limit:
            out.append(c)
            continue
        run.append(c)
        size += n
    if run:
        out.append(b"".join(run) if len(run) > 1 else run[0])
    return out


def handoff_op(fsm: FSM, author: int) -> tuple[bytes, pb.LabelSet]:
    """The no-op a new owner appends (with ``union_registers``) to take the log over."""
    op = rl.RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=author)
    frame, _ = encode_op(op)
    return frame, fence(author)

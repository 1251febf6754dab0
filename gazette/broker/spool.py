"""The spool: the fragment a journal replica is currently building, as a state machine.

A spool is a committed :class:`Fragment` backed by a local temporary file, plus *pending*
content written after the fragment's end, plus the journal's registers. It changes only through
:meth:`Spool.apply` of a ``ReplicateRequest``, with Gazette's transitions:

* **content** (``content`` at ``content_delta``): ``content_delta`` must equal the pending length;
  the bytes are written at ``end + delta`` and added to the running SHA1. Nothing is visible to
  readers yet.
* **roll**: a proposal whose end lies beyond ``end + delta``, or an empty proposal at exactly
  ``end``, completes the current fragment (reported via ``on_complete`` if non-empty) and starts
  an empty one at ``proposal.end`` with the proposal's codec. A proposal strictly beyond ``end``
  also brings its registers. Evaluation continues with the two cases below, so an empty
  proposal of the new fragment is acknowledged in the same step.
* **rollback**: a proposal equal to the committed fragment, with equal registers, discards
  pending content (the SHA1 is restored to its committed state).
* **commit**: a proposal equal to :meth:`Spool.next` (the fragment extended by all pending bytes,
  with their SHA1) while content is pending adopts it and its registers, and reports the
  committed fragment via ``on_commit``.
* anything else leaves the spool as it is and answers ``PROPOSAL_MISMATCH`` with the spool's
  fragment and registers.

Invariants: the spool fragment is always a valid fragment whose sum is the SHA1 of file bytes
``[0, end - begin)``; bytes of the file below that are never rewritten, so readers may ``pread``
committed content while appends continue; ``apply`` costs one ``pwrite`` and one
``sha1.update`` per content chunk and never compresses (completed spools are compressed when
persisted, off the append path, see :class:`SpoolSnapshot`). A proposal's missing registers
are taken as the empty label set. Backing store and path postfix are never part of a spool's
fragment: they are attached when it is persisted.

:meth:`Spool.write_content` is the content transition for an event loop: a chunk of at least
``THREAD_MIN`` bytes is written and hashed by a worker thread (both release the GIL), so the
loop meanwhile receives, forwards and hashes for its own purposes; the returned
:class:`ContentWrite` must be settled before anything else changes the spool (any other
transition while a write is in flight is a bug and raises AssertionError), and settling
always waits for the worker, so no write of an abandoned chunk can land after a later one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from gazette._compiled import mypyc_attr
from gazette.fragment.codecs import Codec, new_compressor
from gazette.fragment.errors import SpoolError
from gazette.fragment.fragment import ZERO_SUM, Fragment
from gazette.protocol import protocol_pb2 as pb

__all__ = ["EMPTY_SHA1", "THREAD_MIN", "ContentWrite", "Spool", "SpoolFile", "SpoolSnapshot"]

READ_CHUNK = 1 << 20
"""Chunk size of reads of a completed spool, when persisting it."""
EMPTY_SHA1 = hashlib.sha1()
"""Copied for each new sum (the spool's, an append's, a group's): ``hashlib.sha1()`` looks
OpenSSL's digest up by name every time."""
THREAD_MIN = 256 * 1024
"""Content chunks at least this long are written and hashed by a worker thread: below it the
hand-off (two thread wake-ups) costs more than the loop gains."""

# Writes of different spools run in parallel; those of one spool never do (its owner settles
# each before the next). Two workers: one per core of the machines this is built for.
_WRITERS = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="spool-write")
# A long chunk's SHA-1 runs here while its writer copies it into the file: the two take about
# as long (a MiB: ~0.5 ms each, more for the copy into fresh page-cache pages), and one after
# the other they were the append's critical path. A pool of its own: a writer waits for its
# hash, so sharing the writers' pool could leave both writers waiting on queued hashes.
_HASHERS = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="spool-hash")


def _open_tmpfile(directory: str | None) -> int | None:
    """An unnamed file in ``directory`` that can later be given a name (Linux's ``O_TMPFILE``),
    or None where the platform or file system has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    try:
        return os.open(directory or tempfile.gettempdir(), flag | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:  # EOPNOTSUPP (file system), EISDIR (kernel before 3.11)
        return None


_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400
_linkat: Any = None


def _link_open_file(fd: int, path: str) -> None:
    """``linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, path, AT_SYMLINK_FOLLOW)``: names the
    open file itself. Through libc because ``os.link`` (3.11) calls ``link(2)``, which would
    name the ``/proc`` symlink (EXDEV) rather than follow it."""
    import ctypes  # here, not at import: persisting is rare, and only Linux gets here

    global _linkat
    if _linkat is None:
        _linkat = ctypes.CDLL(None, use_errno=True).linkat
    src = f"/proc/self/fd/{fd}".encode()
    if _linkat(_AT_FDCWD, src, _AT_FDCWD, os.fsencode(path), _AT_SYMLINK_FOLLOW) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)


# Not native in the compiled build: a weak reference (its finalizer) needs ``__weakref__``,
# which mypyc's classes do not have; its work is system calls anyway.
@mypyc_attr(native_class=False)
class SpoolFile:
    """An anonymous temporary file: unlinked as soon as it is created.

    Its descriptor is closed when the last reference to the object goes away (spool, index
    entries, a reader in flight, the persister's queue), which frees the disk space; ``close``
    does so early. ``pwrite`` and ``pread`` are positionless, so readers never disturb the writer.
    """

    __slots__ = ("__weakref__", "_close", "_fd", "_linkable")

    def __init__(self, directory: str | None = None) -> None:
        fd = _open_tmpfile(directory)
        self._linkable = fd is not None
        if fd is None:
            fd, path = tempfile.mkstemp(prefix=".spool-", dir=directory)
            try:
                os.unlink(path)
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)

    def link(self, path: str, length: int) -> bool:
        """Gives the file the name ``path``, cut to ``length`` bytes: the persisted fragment then
        *is* the spool's file, its pages shared, nothing copied. Only for a completed spool (it
        is never written again). False, with nothing done, where the file cannot be named (not
        created as an ``O_TMPFILE``, or ``path`` on another file system, or no ``/proc``); raises
        FileExistsError if ``path`` exists."""
        if not self._linkable:
            return False
        # Bytes past the content (an append that was rolled back) must not become the fragment's.
        if os.fstat(self._fd).st_size > length:
            os.ftruncate(self._fd, length)
        try:
            _link_open_file(self._fd, path)
        except FileExistsError:
            raise
        except OSError:  # EXDEV, ENOENT without /proc, EPERM (protected links): copy instead
            return False
        return True

    def fileno(self) -> int:
        return self._fd

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def pread(self, offset: int, n: int) -> bytes:
        data = os.pread(self._fd, n, offset)
        if len(data) == n or not data:
            return data
        parts = [data]  # A short read of a regular file means EOF, or a signal: keep going.
        got = len(data)
        while got < n:
            more = os.pread(self._fd, n - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def close(self) -> None:
        self._close()

    @property
    def closed(self) -> bool:
        return not self._close.alive


@dataclass(frozen=True, slots=True)
class SpoolSnapshot:
    """A completed spool, handed to ``on_complete`` (and so to the persister).

    Its file is no longer written, so every method here may run in a worker thread.
    """

    fragment: Fragment
    registers: pb.LabelSet
    first_append_time: float | None
    primary: bool

    @property
    def file(self) -> SpoolFile:
        assert isinstance(self.fragment.file, SpoolFile), "a completed spool has a file"
        return self.fragment.file

    def iter_content(self, offset: int = 0, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        """Uncompressed content from ``offset`` (relative to the fragment's begin)."""
        length = self.fragment.content_length
        f = self.file
        while offset < length:
            data = f.pread(offset, min(chunk_size, length - offset))
            if not data:
                raise SpoolError(f"spool file of {self.fragment} is short at {offset}")
            yield data
            offset += len(data)

    def link_to(self, path: str) -> bool:
        """Persists an uncompressed spool as ``path`` without copying it (see ``SpoolFile.link``):
        False where it cannot, and the store copies instead."""
        if self.fragment.codec != pb.CompressionCodec.NONE:
            return False
        return self.file.link(path, self.fragment.content_length)

    def iter_compressed(self, chunk_size: int = READ_CHUNK) -> Iterator[bytes]:
        """Content compressed under the fragment's codec, as it is to be stored."""
        c = new_compressor(self.fragment.codec)
        for data in self.iter_content(0, chunk_size):
            out = c.compress(data)
            if out:
                yield out
        tail = c.finish()
        if tail:
            yield tail

    def write_compressed(self, out: IO[bytes]) -> int:
        """Write the stored form of the fragment to ``out``; returns its length."""
        if self.fragment.codec == pb.CompressionCodec.NONE and _copy_range(self, out):
            return self.fragment.content_length
        n = 0
        for chunk in self.iter_compressed():
            out.write(chunk)
            n += len(chunk)
        return n


def _copy_range(snap: SpoolSnapshot, out: IO[bytes]) -> bool:
    """Copies an uncompressed spool into a fresh file within the kernel (no user-space
    copies); False, with nothing written, where the files or the platform do not allow it."""
    try:
        dst = out.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a buffer, an upload body)
        return False
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return False
    out.flush()
    src, length, done = snap.file.fileno(), snap.fragment.content_length, 0
    start = os.lseek(dst, 0, os.SEEK_CUR)
    try:
        while done < length:
            n = copy(src, dst, length - done, done)
            if n == 0:
                raise SpoolError(f"spool file of {snap.fragment} is short at {done}")
            done += n
    except OSError:
        if done:
            raise
        os.lseek(dst, start, os.SEEK_SET)  # e.g. EXDEV or ENOSYS: copy through user space
        return False
    return True


class ContentWrite:
    """A content chunk being written and hashed by a worker thread for its spool.

    :meth:`settle` (or :meth:`settle_now`) completes the transition exactly once: the spool
    then counts the chunk as pending content, or, if the write failed, is as it was and the
    error is raised. Neither returns before the worker is done with the chunk.
    """

    __slots__ = ("_future", "_settled", "_spool", "length")

    def __init__(self, spool: Spool, length: int, future: concurrent.futures.Future[None]) -> None:
        self._spool = spool
        self.length = length
        self._future = future
        self._settled = False

    async def settle(self) -> None:
        """Waits for the worker. A cancelled caller still waits it out (blocking the loop for
        at most one chunk's write) before the cancellation propagates."""
        try:
            await asyncio.wrap_future(self._future)
        except asyncio.CancelledError:
            self.settle_now(raise_error=False)
            raise
        except BaseException:
            self.settle_now()
            raise
        self.settle_now()

    def settle_now(self, raise_error: bool = True) -> None:
        """Waits for the worker, blocking; idempotent."""
        if self._settled:
            return
        concurrent.futures.wait([self._future])
        self._settled = True
        fut = self._future
        err = None if fut.cancelled() else fut.exception()
        # A write cancelled before it started never touched the spool: it is a failure too.
        self._spool._written(self, not fut.cancelled() and err is None)  # noqa: SLF001
        if fut.cancelled() and raise_error:
            raise SpoolError(f"content write of {self._spool.journal} was cancelled")
        if err is not None and raise_error:
            raise err


CommitCallback = Callable[[Fragment], None]
CompleteCallback = Callable[[SpoolSnapshot], None]


class Spool:
    """The spool state machine of one journal replica (see the module docstring)."""

    def __init__(
        self,
        journal: str,
        *,
        directory: str | None = None,
        on_commit: CommitCallback | None = None,
        on_complete: CompleteCallback | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._directory = directory
        self._on_commit = on_commit
        self._on_complete = on_complete
        self._clock = clock
        self._fragment = Fragment(journal, 0, 0)
        self._registers = pb.LabelSet()
        self._registers_wire: bytes | None = b""  # _registers serialized, until they change
        self._reset(self._fragment)

    def _reset(self, fragment: Fragment) -> None:
        self._fragment = fragment
        self._file: SpoolFile | None = None
        self._view: Fragment | None = None  # cache of `fragment` (with its file)
        self._next: Fragment | None = None  # cache of `next_fragment()` while delta is unchanged
        self._first_append_time: float | None = None
        self._delta = 0
        self._inflight: ContentWrite | None = None
        # SHA1 of the pending and of the committed content; None: of nothing yet (made by the
        # first write: an idle spool holds no hash context, about 0.5 KiB of each replica).
        self._summer: Any = None  # hashlib's hash type is private.
        self._committed_summer: Any = None

    # -- Observation.

    @property
    def journal(self) -> str:
        return self._fragment.journal

    @property
    def fragment(self) -> Fragment:
        """The committed fragment (carrying the spool file once content was written)."""
        view = self._view
        if view is None:
            view = self._view = self._fragment.with_file(self._file) if self._file else self._fragment
        return view

    @property
    def registers(self) -> pb.LabelSet:
        """Registers as of the last commit or roll (a copy)."""
        out = pb.LabelSet()
        out.CopyFrom(self._registers)
        return out

    def registers_wire(self) -> bytes:
        """:attr:`registers` serialized: made once per change of them (every append's
        response carries them, and they rarely change)."""
        wire = self._registers_wire
        if wire is None:
            wire = self._registers_wire = self._registers.SerializeToString()
        return wire

    @property
    def delta(self) -> int:
        """Length of pending (uncommitted) content."""
        return self._delta

    @property
    def first_append_time(self) -> float | None:
        return self._first_append_time

    @property
    def file(self) -> SpoolFile | None:
        return self._file

    def next_fragment(self) -> Fragment:
        """The fragment which would commit all pending content."""
        nxt = self._next
        if nxt is None:
            f = self._fragment
            end = f.end + self._delta
            digest = ZERO_SUM if end == f.begin else self._hasher().digest()
            # With the spool file: once committed it is the fragment's view as is.
            nxt = self._next = Fragment(f.journal, f.begin, end, digest, f.codec, file=self._file)
        return nxt

    def next(self) -> pb.Fragment:
        """The proposal which commits all pending content, in wire form."""
        return self.next_fragment().to_proto()

    def __repr__(self) -> str:
        return f"Spool({self._fragment!r}, delta={self._delta})"

    # -- Transitions.

    def apply(self, req: pb.ReplicateRequest, primary: bool = False) -> pb.ReplicateResponse:
        """Apply a content chunk or a proposal.

        Content answers an empty response (or raises :class:`SpoolError` for a wrong
        ``content_delta``); a proposal answers OK or PROPOSAL_MISMATCH. ``primary`` marks the
        completed spools this call may produce as the primary's (persisted right away).
        """
        if req.HasField("proposal"):
            registers = req.registers if req.HasField("registers") else pb.LabelSet()
            mismatch = self.apply_proposal(Fragment.from_proto(req.proposal), registers, primary)
            return pb.ReplicateResponse(status=pb.OK) if mismatch is None else mismatch
        self._apply_content(req.content, req.content_delta)
        return pb.ReplicateResponse()

    def must_apply(self, req: pb.ReplicateRequest, primary: bool = False) -> None:
        """Apply a request that cannot fail (e.g. a rollback derived from this spool)."""
        resp = self.apply(req, primary)
        assert resp.status == pb.OK, f"{self!r} refused {req}: {resp}"

    def _apply_content(self, content: bytes | memoryview, content_delta: int) -> None:
        file = self._prepare_content(content_delta)
        self._write(file, content, self._fragment.content_length + self._delta)
        self._delta += len(content)
        self._next = None

    def write_content(self, content: bytes | memoryview, content_delta: int) -> ContentWrite | None:
        """The content transition, begun: a short chunk is applied at once (None); a long one
        is written and hashed by a worker thread, and the returned write must be settled
        before the spool is used again. Raises :class:`SpoolError` for a wrong delta."""
        if len(content) < THREAD_MIN:
            self._apply_content(content, content_delta)
            return None
        file = self._prepare_content(content_delta)
        offset = self._fragment.content_length + self._delta
        w = self._inflight = ContentWrite(self, len(content), _WRITERS.submit(self._write_long, file, content, offset))
        return w

    def _prepare_content(self, content_delta: int) -> SpoolFile:
        assert self._inflight is None, "spool changed while a content write is in flight"
        if content_delta != self._delta:
            raise SpoolError(
                f"invalid content_delta ({content_delta}; expected {self._delta}) "
                f"for spool of {self.journal}"
            )
        if self._file is None:
            assert self._fragment.content_length == 0, "a non-empty spool has a file"
            self._file = SpoolFile(self._directory)
            self._view = None
        return self._file

    def _write_long(self, file: SpoolFile, content: bytes | memoryview, offset: int) -> None:
        # A worker's: the chunk is hashed into a copy of the running SHA-1 by another thread
        # meanwhile, adopted only once both are done, so a failed write leaves the sum as it was.
        summer = self._hasher().copy()
        hashed = _HASHERS.submit(summer.update, content)
        try:
            file.pwrite(content, offset)
        finally:
            concurrent.futures.wait([hashed])  # the chunk is never used after we return
        hashed.result()
        self._summer = summer

    def _write(self, file: SpoolFile, content: bytes | memoryview, offset: int) -> None:
        # Write before hashing: if the write fails the spool is unchanged and may be retried.
        file.pwrite(content, offset)
        self._hasher().update(content)

    def _hasher(self) -> Any:
        if self._summer is None:
            self._summer = EMPTY_SHA1.copy()
        return self._summer

    def _written(self, w: ContentWrite, ok: bool) -> None:
        assert self._inflight is w
        self._inflight = None
        if ok:
            self._delta += w.length
            self._next = None

    def apply_proposal(self, proposal: Fragment, registers: pb.LabelSet,
                       primary: bool = False) -> pb.ReplicateResponse | None:
        """The proposal transition, given the proposed fragment itself (the primary's own
        commit, :meth:`next_fragment`, skips the wire form's round trip): None if the spool
        took it, else the PROPOSAL_MISMATCH answer."""
        assert self._inflight is None, "spool changed while a content write is in flight"
        f = self._fragment

        if proposal.end > f.end + self._delta or (
            proposal.end == f.end and proposal.end == proposal.begin  # an empty proposal
        ):
            self._roll(proposal, registers, primary)
            f = self._fragment

        # The offsets are compared first: they tell a commit from a rollback at once.
        end = proposal.end
        if end == f.end and proposal == f and registers == self._registers:
            # Rollback of any pending content.
            if self._delta:
                self._delta = 0
                self._next = None
                committed = self._committed_summer
                self._summer = committed.copy() if committed is not None else None
            return None

        if self._delta != 0 and end == f.end + self._delta and (
                proposal is self._next or proposal == self.next_fragment()):
            self._fragment = proposal
            # The primary's own proposal already carries the spool file (next_fragment).
            self._view = proposal if proposal.file is self._file else None
            self._next = None
            if self._first_append_time is None:
                self._first_append_time = self._clock()
            if registers != self._registers:  # the steady state: unchanged, nothing to copy
                self._registers.CopyFrom(registers)
                self._registers_wire = None
            self._delta = 0
            self._committed_summer = self._summer.copy() if self._summer is not None else None
            if self._on_commit is not None:
                self._on_commit(self.fragment)
            return None

        return pb.ReplicateResponse(
            status=pb.PROPOSAL_MISMATCH,
            fragment=f.to_proto(),
            registers=self._registers,
        )

    def _roll(self, proposal: Fragment, registers: pb.LabelSet, primary: bool) -> None:
        old = self.fragment
        if old.content_length != 0 and self._on_complete is not None:
            self._on_complete(SpoolSnapshot(old, self.registers, self._first_append_time, primary))
        if proposal.end > old.end:
            self._registers.CopyFrom(registers)
            self._registers_wire = None
        codec: Codec = proposal.codec
        self._reset(Fragment(old.journal, proposal.end, proposal.end, ZERO_SUM, codec))

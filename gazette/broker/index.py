"""The fragment index of a journal replica: which fragment serves each offset.

The index is the union of *local* fragments (committed spool fragments, readable from their
spool file) and *remote* fragments (listed from, or persisted to, the journal's stores).

Invariants and semantics (Gazette's):

* A remote listing replaces all remote fragments, and drops each local fragment whose offsets
  it fully covers (the local file is then released once no reader holds it).
* ``query`` resolves offset -1 to the write head (the largest end offset) once, up front.
* An uncovered offset jumps forward to the next fragment when that fragment is persisted
  (``mod_time != 0``) and either nothing precedes it or it was persisted more than
  :data:`OFFSET_JUMP_AGE` seconds ago; otherwise the read waits (if blocking), since a fragment
  covering the gap may still be on its way to the store.
* Fragments persisted before ``begin_mod_time`` are skipped over.
* A non-blocking read of an unavailable offset answers OFFSET_NOT_YET_AVAILABLE; a blocking
  one waits for the next index change and tries again. A read whose offset already reached its
  ``end_offset`` never waits.

Everything runs on one event loop: mutations are synchronous and wake waiting queries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gazette.fragment.errors import IndexClosedError
from gazette.fragment.fragment import CoverSet, File, Fragment
from gazette.lean_event import LeanEvent
from gazette.protocol import protocol_pb2 as pb

__all__ = ["OFFSET_JUMP_AGE", "SIGNED_URL_TTL", "Index", "Signer"]

OFFSET_JUMP_AGE = 6 * 3600.0
"""Seconds after which a persisted fragment beyond a gap may be jumped to."""

SIGNED_URL_TTL = 60.0
"""Seconds for which a fragment URL handed to a reader is valid."""

Signer = Callable[[Fragment, float], str | None]
"""Signs a GET URL of a persisted fragment for a number of seconds (None: no direct read)."""


class Index:
    """Queryable index of a journal's local and remote fragments (see the module docstring)."""

    def __init__(
        self, *, signer: Signer | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._set = CoverSet()
        self._local = CoverSet()
        self._signer = signer
        self._clock = clock
        self._changed = LeanEvent()
        self._waited = False  # whether _changed was handed to a waiter since it was made
        self._first_refresh = LeanEvent()
        self._closed = False

    # -- Mutations.

    def spool_commit(self, fragment: Fragment) -> None:
        """Add a committed local spool fragment (carrying its file)."""
        self._set.add(fragment)
        self._local.add(fragment)
        self._wake()

    def replace_remote(self, remote: CoverSet) -> None:
        """Replace every remote fragment with a fresh store listing."""
        self._local = self._local.difference(remote)
        merged = remote.copy()
        for f in self._local:
            added = merged.add(f)
            assert added, f"local fragment {f} is not covered by the listing, yet was refused"
        self._set = merged
        self._wake()
        self._first_refresh.set()

    def add_remote(self, fragment: Fragment) -> None:
        """Record that ``fragment`` was just persisted (it replaces the equal local span)."""
        self._local = self._local.difference(CoverSet([fragment]))
        self._set.add(fragment)
        self._wake()

    def close(self) -> None:
        """Release blocked queries with IndexClosedError; later blocking queries fail too."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        # Waiters hold the old event: setting it wakes exactly them, the new one waits anew.
        # An event nobody took is kept (a commit with no reader waiting makes no new one).
        if self._waited:
            self._changed.set()
            self._changed = LeanEvent()
            self._waited = False

    # -- Observation.

    @property
    def first_refresh(self) -> asyncio.Event:
        """Set once the first remote listing has been applied."""
        return self._first_refresh

    def fragments(self) -> CoverSet:
        """A snapshot of all fragments of the index."""
        return self._set.copy()

    async def inspect(self) -> CoverSet:
        """Fragments of the index, once the first remote listing has been applied."""
        await self._first_refresh.wait()
        return self.fragments()

    def summary(self) -> tuple[int, int, int]:
        """``(begin, end, mod_time)``: the offsets spanned and the last fragment's mod time."""
        if not self._set:
            return 0, 0, 0
        return self._set.begin_offset, self._set.end_offset, self._set[-1].mod_time

    @property
    def end_offset(self) -> int:
        """The write head as known to the index."""
        return self._set.end_offset

    async def wait_for_offset(self, offset: int) -> None:
        """Wait until the index covers through ``offset`` (its end offset reaches it)."""
        while self._set.end_offset < offset:
            await self._wait()

    async def _wait(self) -> None:
        if self._closed:
            raise IndexClosedError("index of journal is closed")
        self._waited = True
        await self._changed.wait()
        if self._closed:
            raise IndexClosedError("index of journal was closed while waiting")

    async def query(self, req: pb.ReadRequest) -> tuple[pb.ReadResponse, File | None]:
        """Resolve a read to a fragment, per the module's semantics.

        Returns the response (status OK with offset, write head, fragment and maybe a signed
        URL; or OFFSET_NOT_YET_AVAILABLE) and the local file of the fragment if it has one.
        """
        offset = self._set.end_offset if req.offset == -1 else req.offset
        while True:
            s = self._set
            ind, found = s.longest_overlapping(offset)

            if (
                not found
                and ind != len(s)
                and s[ind].mod_time != 0
                and (ind == 0 or s[ind].mod_time < self._clock() - OFFSET_JUMP_AGE)
            ):
                offset, found = s[ind].begin, True

            if found:
                f = s[ind]
                if f.mod_time != 0 and f.mod_time < req.begin_mod_time:
                    offset = f.end  # Persisted before the requested lower bound: skip it.
                    continue
                resp = pb.ReadResponse(
                    status=pb.Status.OK,
                    offset=offset,
                    write_head=s.end_offset,
                    fragment=f.to_proto(),
                )
                if f.backing_store and f.mod_time and self._signer is not None:
                    url = self._signer(f, SIGNED_URL_TTL)
                    if url:
                        resp.fragment_url = url
                return resp, f.file

            if not req.block or (req.end_offset and offset >= req.end_offset):
                return (
                    pb.ReadResponse(
                        status=pb.Status.OFFSET_NOT_YET_AVAILABLE,
                        offset=offset,
                        write_head=s.end_offset,
                    ),
                    None,
                )
            await self._wait()

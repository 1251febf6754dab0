"""A journal replica: the local spool, the fragment index and the append pipeline.

A Replica exists while this broker is assigned its journal (see ``resolver``).
Invariants:

* Only the holder of ``pipeline`` applies requests to the spool, so appends
  are serialized; every apply is synchronous, so a commit and its index update
  happen in one step of the event loop.
* The index holds every committed local fragment (``on_commit``) and, after the
  first refresh, every fragment listed by the journal's stores; the refresh
  repeats every ``fragment.refresh_interval``. Appends wait for the first
  refresh so they can tell whether the stores hold content beyond the spool.
* Spools completed by the primary are queued to the persister, which uploads
  them to the journal's first store and then adds them to the index as remote.
* ``cancel()`` stops the maintenance task and wakes blocked reads; the spool
  file is released once no reader holds it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gazette.broker.fragment import Fragment, Index, Persister, Spool, SpoolSnapshot, Stores
from gazette.broker.fragment.store import walk_all_stores
from gazette.protocol import protocol_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_REFRESH = 300.0
PULSE_INTERVAL = 1.0


class Replica:
    def __init__(
        self,
        journal: str,
        spec: pb.JournalSpec,
        spool_dir: str,
        stores: Stores,
        persister: Persister,
        tg: asyncio.TaskGroup,
    ) -> None:
        self.journal = journal
        self.spec = spec
        self.stores = stores
        self.persister = persister
        self.index = Index(signer=self._sign)
        self.spool = Spool(journal, directory=spool_dir, on_commit=self.index.spool_commit, on_complete=self._on_complete)
        self.pipeline = asyncio.Lock()
        self.primary = False
        # Set by a refresh that began after this replica last became primary.
        self._primary_refreshed = asyncio.Event()
        self._refresh_now = asyncio.Event()
        self._task = tg.create_task(self._maintain(), name=f"replica:{journal}")

    def _sign(self, fragment: Fragment, ttl: float) -> str | None:
        try:
            return self.stores.get(fragment.backing_store).sign_url(fragment, ttl)
        except Exception:  # noqa: BLE001 - no signed URL: the broker serves the read itself
            return None

    def apply(self, req: pb.ReplicateRequest) -> pb.ReplicateResponse:
        resp = self.spool.apply(req, primary=True)
        if req.HasField("proposal") and resp.status != pb.OK:
            raise AssertionError(f"local spool of {self.journal} refused {req.proposal}: {resp}")
        return resp

    def apply_content(self, content: bytes, delta: int) -> None:
        """Applies a content chunk without wrapping it in a ReplicateRequest (which copies it)."""
        self.spool._apply_content(content, delta)

    def rollback(self) -> None:
        """Discards pending (uncommitted) content of the spool."""
        self.spool.must_apply(pb.ReplicateRequest(proposal=self.spool.fragment.to_proto(), registers=self.spool.registers), True)

    def complete_spool(self) -> None:
        """Rolls the spool so its content is handed to the persister (used when draining)."""
        f = self.spool.fragment
        if f.content_length == 0:
            return
        nxt = pb.Fragment(journal=f.journal, begin=f.end, end=f.end, compression_codec=f.codec)
        self.spool.must_apply(pb.ReplicateRequest(proposal=nxt, registers=self.spool.registers), True)

    def _on_complete(self, snap: SpoolSnapshot) -> None:
        if snap.primary and self.spec.fragment.stores:
            self.persister.spool_complete(snap)

    def set_primary(self, primary: bool) -> None:
        """Called by the resolver on each assignment change."""
        if primary and not self.primary:
            # A new primary must see what the previous one persisted before it appends.
            self._primary_refreshed.clear()
            self._refresh_now.set()
        self.primary = primary

    async def wait_primary_ready(self) -> None:
        """Waits for an index refresh begun after this replica became primary."""
        await self._primary_refreshed.wait()

    def fresh_roll_offset(self) -> int:
        """Offset a never-written spool should start at: the end of what the stores hold.

        Without a replication pipeline to synchronise a new primary's spool, a replica that
        has never held content starts after everything its predecessor persisted (the
        predecessor persists before it advertises the route that lets the allocator move
        the primary, see ``Broker._advertise_routes``).
        """
        f = self.spool.fragment
        if f.content_length == 0 and self.spool.first_append_time is None and self.index.end_offset > f.end:
            return self.index.end_offset
        return 0

    async def flush(self, persist: bool) -> None:
        """Completes the spool under the pipeline and, if asked, waits until it is persisted."""
        async with self.pipeline:
            self.complete_spool()
            if persist:
                await self.persister.persist_all_and_wait()

    def cancel(self) -> None:
        self._task.cancel()
        if not self.pipeline.locked():
            self.complete_spool()  # hand the content to the persister before letting go
        self.index.close()

    async def wait_first_refresh(self) -> None:
        await self.index.first_refresh.wait()

    async def _refresh(self) -> None:
        cover = await walk_all_stores(self.journal, list(self.spec.fragment.stores), self.stores)
        self.index.replace_remote(cover)

    async def _maintain(self) -> None:
        """Refreshes the index from the stores, and rolls spools whose flush interval passed."""
        next_refresh = 0.0
        attempt = 0
        while True:
            now = time.monotonic()
            if now >= next_refresh or self._refresh_now.is_set():
                self._refresh_now.clear()
                primary_at_start = self.primary
                try:
                    await self._refresh()
                    if primary_at_start:
                        self._primary_refreshed.set()
                    attempt = 0
                    interval = self.spec.fragment.refresh_interval.ToTimedelta().total_seconds() or DEFAULT_REFRESH
                    next_refresh = time.monotonic() + interval
                except Exception as err:  # noqa: BLE001 - retried; appends wait meanwhile
                    attempt += 1
                    log.warning("refreshing fragment index failed", extra={"journal": self.journal, "err": str(err)})
                    next_refresh = time.monotonic() + min(30.0, 0.5 * 2**attempt)
            await self._maybe_flush()
            timeout = min(PULSE_INTERVAL, max(0.0, next_refresh - time.monotonic()))
            try:
                async with asyncio.timeout(timeout):
                    await self._refresh_now.wait()
            except TimeoutError:
                pass

    async def _maybe_flush(self) -> None:
        """Rolls the spool once its flush interval has passed, as an append would."""
        interval = self.spec.fragment.flush_interval.seconds
        first = self.spool.first_append_time
        if interval <= 0 or first is None or self.spool.fragment.content_length == 0:
            return
        if int(first) // interval == int(time.time()) // interval:
            return
        if self.pipeline.locked():
            return  # the next append rolls it
        async with self.pipeline:
            if self.spool.first_append_time == first:
                self.complete_spool()

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
from typing import TYPE_CHECKING

from gazette.broker.fragment import Fragment, Index, Persister, Spool, SpoolSnapshot, Stores
from gazette.broker.fragment.store import walk_all_stores
from gazette.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    pass

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
        self._refreshed = asyncio.Event()
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

    def cancel(self) -> None:
        self._task.cancel()
        self.index.close()

    async def wait_first_refresh(self) -> None:
        await self._refreshed.wait()

    async def _refresh(self) -> None:
        cover = await walk_all_stores(self.journal, list(self.spec.fragment.stores), self.stores)
        self.index.replace_remote(cover)

    async def _maintain(self) -> None:
        """Refreshes the index from the stores, and rolls spools whose flush interval passed."""
        next_refresh = 0.0
        attempt = 0
        while True:
            now = time.monotonic()
            if now >= next_refresh:
                try:
                    await self._refresh()
                    attempt = 0
                    interval = self.spec.fragment.refresh_interval.ToTimedelta().total_seconds() or DEFAULT_REFRESH
                    next_refresh = time.monotonic() + interval
                except Exception as err:  # noqa: BLE001 - retried; appends wait meanwhile
                    attempt += 1
                    log.warning("refreshing fragment index failed", extra={"journal": self.journal, "err": str(err)})
                    next_refresh = time.monotonic() + min(30.0, 0.5 * 2**attempt)
                if not self._refreshed.is_set() and attempt == 0:
                    self._refreshed.set()
                    self.index.first_refresh.set()
            await self._maybe_flush()
            await asyncio.sleep(min(PULSE_INTERVAL, max(0.0, next_refresh - time.monotonic())))

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

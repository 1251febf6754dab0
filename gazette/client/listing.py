"""Listing and applying journal specs, once or by polling.

Invariants:
- A selector given as text is parsed with Gazette's grammar (gazette.protocol.labels); a bad
  selector raises ``labels.SelectorError`` naming the position.
- ``PolledList.list`` is the most recent successful listing (None before the first).
  ``on_change`` runs once per listing whose journals (specs, revisions, routes) differ
  from the previous one, and never for a failed poll; ``on_error`` sees failed polls,
  which are retried at the next interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from types import TracebackType

from gazette.client.errors import ClientError
from gazette.client.journal_client import JournalClient
from gazette.protocol import protocol_pb2 as pb
from gazette.tasks import cancel_and_wait

Selector = str | pb.LabelSelector | None


def parse_selector(text: str) -> pb.LabelSelector:
    """The protocol LabelSelector of Gazette's selector text (e.g. ``prefix=a/, x in (y)``)."""
    from gazette.protocol.labels import LabelSelector

    return LabelSelector.parse(text).to_proto()


def _selector(selector: Selector) -> pb.LabelSelector:
    if selector is None:
        return pb.LabelSelector()
    if isinstance(selector, str):
        return parse_selector(selector)
    return selector


async def list_journals(client: JournalClient, selector: Selector = None) -> pb.ListResponse:
    """Every journal matching ``selector`` (all journals when None or empty)."""
    return await client.list(_selector(selector))


async def get_journal(client: JournalClient, name: str) -> pb.ListResponse.Journal:
    """The listing entry (spec, mod_revision, route) of the journal called ``name``."""
    sel = pb.LabelSelector()
    sel.include.labels.add(name="name", value=name)
    resp = await client.list(sel)
    if not resp.journals:
        raise ClientError(f"journal {name!r} does not exist")
    return resp.journals[0]


async def apply_journals(client: JournalClient,
                         changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
                         batch_size: int = 0) -> pb.ApplyResponse:
    """Apply journal upserts and deletions (one etcd transaction unless ``batch_size``)."""
    return await client.apply(changes, batch_size)


def _fingerprint(resp: pb.ListResponse) -> list[bytes]:
    return [j.SerializeToString(deterministic=True) for j in resp.journals]


class PolledList:
    """Keeps a listing of ``selector`` fresh by polling List every ``interval`` seconds."""

    def __init__(self, client: JournalClient, selector: Selector = None, *,
                 interval: float = 30.0,
                 on_change: Callable[[pb.ListResponse], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self.client = client
        self.selector = _selector(selector)
        self.interval = interval
        self.list: pb.ListResponse | None = None
        self.updates = 0  # Count of listings that changed.
        self._on_change = on_change
        self._on_error = on_error
        self._fingerprint: list[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    async def refresh(self) -> bool:
        """Poll once; returns whether the listing changed. Errors propagate."""
        resp = await self.client.list(self.selector)
        fingerprint = _fingerprint(resp)
        changed = fingerprint != self._fingerprint
        self.list = resp
        if changed:
            self._fingerprint = fingerprint
            self.updates += 1
            if self._on_change is not None:
                self._on_change(resp)
            async with self._changed:
                self._changed.notify_all()
        return changed

    async def wait_changed(self, after: int) -> int:
        """Wait until more than ``after`` listings changed; returns ``updates``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.updates > after)
        return self.updates

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            try:
                await self.refresh()
            except ClientError as err:
                if self._on_error is not None:
                    self._on_error(err)
            await asyncio.sleep(self.interval)

    async def start(self) -> pb.ListResponse:
        """First listing (errors raised), then polling in a background task."""
        await self.refresh()
        assert self.list is not None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll_later())
        return self.list

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # the caller's own cancellation still propagates

    async def _poll_later(self) -> None:
        await asyncio.sleep(self.interval)
        await self.run()

    async def __aenter__(self) -> PolledList:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

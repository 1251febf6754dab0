"""Synchronous facade over the async client, for scripts and interactive use.

Invariants:
- Every coroutine runs on one private event loop in a daemon thread owned by the
  facade, so its gRPC channels are only ever used from that loop; calls block the
  caller until done. Do not call the facade from inside that loop (e.g. from a callback).
- ``close`` closes the channels and stops the thread; the facade is then unusable.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from gazette.client.appender import Content, append
from gazette.client.journal_client import DEFAULT_ADDRESS, JournalClient
from gazette.client.listing import Selector, list_journals
from gazette.client.reader import RetryReader
from gazette.protocol import protocol_pb2 as pb

T = TypeVar("T")


class SyncJournalClient:
    def __init__(self, address: str = DEFAULT_ADDRESS, *, zone: str = "") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="gazette-sync-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def make() -> JournalClient:
            return JournalClient(address, zone=zone)

        self.client = self._run(make())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def list(self, selector: Selector = None) -> pb.ListResponse:
        return self._run(list_journals(self.client, selector))

    def apply(self, changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
              batch_size: int = 0) -> pb.ApplyResponse:
        return self._run(self.client.apply(changes, batch_size))

    def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                       end_mod_time: int = 0) -> pb.FragmentsResponse:
        return self._run(self.client.list_fragments(
            journal, begin_mod_time=begin_mod_time, end_mod_time=end_mod_time))

    def append(self, journal: str, data: Content | Iterable[Content] | None = None,
               **options: Any) -> pb.AppendResponse:
        return self._run(append(self.client, journal, data, **options))

    def read(self, journal: str, offset: int = 0, *, block: bool = False,
             end_offset: int = 0) -> Iterator[bytes]:
        """Content chunks of ``journal`` from ``offset``; ends at the write head unless
        ``block``, or at ``end_offset``."""
        req = pb.ReadRequest(journal=journal, offset=offset, block=block, end_offset=end_offset)

        async def make() -> RetryReader:
            return RetryReader(self.client, req)

        reader = self._run(make())

        async def step() -> bytes | None:
            try:
                return await reader.__anext__()
            except StopAsyncIteration:
                return None

        try:
            while (chunk := self._run(step())) is not None:
                yield chunk
        finally:
            if not self._closed:
                self._run(reader.aclose())

    def read_all(self, journal: str, offset: int = 0) -> bytes:
        """All content of ``journal`` from ``offset`` to its current write head."""
        return b"".join(self.read(journal, offset))

    def close(self) -> None:
        if self._closed:
            return
        self._run(self.client.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncJournalClient:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

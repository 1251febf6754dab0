"""Journal content for the message iterators, read through the client library.

:class:`JournalSource` adapts a :class:`~gazette.client.RetryReader` to the
:class:`~gazette.message.iterators.ChunkSource` protocol that :class:`ReadUncommittedIter` and
:class:`ReadCommittedIter` read, and :func:`replay_opener` gives ReadCommittedIter its
:data:`~gazette.message.iterators.ReplayOpener` (bounded re-reads of older content).

Invariants: chunks come in journal order; each chunk's ``offset`` is where its data begins
(after any offset jump the reader reported), so iterators can detect skipped content.
"""

from __future__ import annotations

from gazette.client import JournalClient, RetryReader
from gazette.message.iterators import Chunk, ReplayOpener
from gazette.protocol import protocol_pb2 as pb

__all__ = ["JournalSource", "replay_opener"]


class JournalSource:
    """A ChunkSource over one journal: ``[offset, end_offset)``, blocking for more if asked."""

    def __init__(self, client: JournalClient, journal: str, offset: int = 0,
                 end_offset: int = 0, block: bool = False) -> None:
        self.reader = RetryReader(client, pb.ReadRequest(
            journal=journal, offset=offset, end_offset=end_offset, block=block))

    async def read(self) -> Chunk | None:
        try:
            data = await self.reader.__anext__()
        except StopAsyncIteration:
            return None
        return Chunk(self.reader.journal, self.reader.offset - len(data), data)

    async def aclose(self) -> None:
        await self.reader.aclose()


def replay_opener(client: JournalClient) -> ReplayOpener:
    """Opens bounded, non-blocking re-reads ``[begin, end)`` of a journal, for replays."""

    def open_replay(journal: str, begin: int, end: int) -> JournalSource:
        return JournalSource(client, journal, begin, end)

    return open_replay

"""Reading messages from a journal: read-uncommitted and read-committed iterators.

Both iterate over an abstract :class:`ChunkSource`, an async source of raw journal content
``(journal, offset, data)`` (the client library's reader plugs in here), and return
messages in batches: each chunk is split and decoded in one pass, so there is no await
and no task per message.

* :class:`ReadUncommittedIter` yields every message as written, duplicates and
  uncommitted ones included.
* :class:`ReadCommittedIter` feeds those to a :class:`~gazette.message.sequencer.Sequencer`
  and yields only committed messages, exactly once, starting replays of older content when
  the sequencer asks for them.

Invariants:

* Envelopes come in journal order, and each covers ``[begin, end)``, the exact bytes of
  its frame: ``begin`` of one is ``end`` of the previous unless content was skipped.
* A frame split across chunks is reassembled. If the next chunk does not continue at the
  expected offset (content was removed from the journal), the partial frame is dropped,
  a warning is logged and reading resumes at the new offset.
* A bad frame (a desync, a malformed message) raises once, from the call after the one
  that returned the envelopes before it; calling again continues after it. The end of a
  bounded read inside a frame raises UnexpectedEOFError.

Per chunk, the read-committed path runs a few loops of plain Python per message (building
messages, building envelopes, sequencing) around C-level batch calls: the framing decodes
every frame of the chunk at once, a decoder returning a
:class:`~gazette.message.message.MessageBatch` hands over the UUID fields of all its
messages, and :meth:`Sequencer.queue_and_drain` sequences the whole batch.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, Final, Protocol

from .errors import FramingError, MessageDecodeError, UnexpectedEOFError
from .framing import Decoded, Framing
from .message import Envelope, MessageBatch, is_ack
from .sequencer import Sequencer
from .uuid import ACK_TXN, UUIDColumns

__all__ = [
    "Chunk",
    "ChunkSource",
    "Decoder",
    "Envelopes",
    "ReadCommittedIter",
    "ReadUncommittedIter",
    "Replay",
    "ReplayOpener",
    "drop_acks",
    "read_replay",
    "sequence_committed",
]

log = logging.getLogger(__name__)

_ACK: Final = int(ACK_TXN)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Journal content: ``data`` read from ``journal`` starting at ``offset``."""

    journal: str
    offset: int
    data: bytes


class ChunkSource(Protocol):
    """An async source of journal content, in order."""

    async def read(self) -> Chunk | None:
        """The next chunk, or None once a bounded read has reached its end.

        A chunk may hold any number of frames, including part of one; an empty chunk is
        allowed (and ignored). A chunk whose offset skips ahead signals removed content.
        """
        ...


#: Turns a batch of a framing's raw values (JSON values, payload bytes, CSV records) into
#: messages, one per value; raises (preferably MessageDecodeError) if a value is not a
#: valid message. ``JSONMessage.from_json_many`` and ``CSVRecord.from_csv_many`` are
#: decoders. After a failure the batch is decoded again value by value, to isolate the
#: bad ones, so a decoder must not consume its input. A decoder may return a
#: :class:`~gazette.message.message.MessageBatch` with the UUID fields of its messages,
#: which spares the read-committed iterator reading them message by message.
Decoder = Callable[[Sequence[Any]], Sequence[Any]]

#: Opens a bounded source of ``journal`` content over ``[begin, end)``, for replays.
ReplayOpener = Callable[[str, int, int], ChunkSource]

#: The envelopes of ``journal`` over ``[begin, end)``, read again for a sequencer's replay
#: (``ACK_COMMIT_REPLAY``): :func:`read_replay` over a :data:`ReplayOpener`, an app's own
#: ``replay_range``, or Spark's retained blocks.
Replay = Callable[[str, int, int], Awaitable[Sequence[Envelope]]]


class Envelopes:
    """The envelopes of successive batches (``next_batch``), one at a time, until a batch
    is empty: the iterators' ``async for``. A class rather than an async generator, which
    the compiled build cannot compile; like one, it ends for good once a batch raised."""

    def __init__(self, next_batch: Callable[[], Awaitable[list[Envelope]]]) -> None:
        self._next_batch = next_batch
        self._batch: list[Envelope] = []
        self._i = 0
        self._ended = False

    def __aiter__(self) -> Envelopes:
        return self

    async def __anext__(self) -> Envelope:
        i = self._i
        if i >= len(self._batch):
            if self._ended:
                raise StopAsyncIteration
            self._ended = True  # until the batch arrives: a failure ends the iteration
            batch = await self._next_batch()
            if not batch:
                raise StopAsyncIteration
            self._ended = False
            self._batch, i = batch, 0
        self._i = i + 1
        return self._batch[i]

    async def aclose(self) -> None:
        """Ends the iteration (as an async generator's ``aclose``)."""
        self._ended, self._batch, self._i = True, [], 0


class ReadUncommittedIter:
    """Every message of a journal, as read: duplicates and uncommitted ones included."""

    def __init__(self, source: ChunkSource, framing: Framing, decode: Decoder) -> None:
        self._source = source
        self._framing = framing
        self._decode = decode
        self._tail = b""  # An incomplete frame, carried into the next chunk.
        self._tail_offset = -1  # Journal offset of |_tail|'s first byte (-1: none yet).
        self._journal = ""
        # Results ready to return: envelope batches (with their messages' UUID fields, if
        # the decoder gave them), and errors standing between them.
        self._ready: deque[tuple[list[Envelope], UUIDColumns | None] | FramingError] = deque()
        self._done = False

    @property
    def offset(self) -> int:
        """Journal offset of the first byte not yet returned as (part of) a message."""
        return self._tail_offset

    async def next_batch(self) -> list[Envelope]:
        """The next messages read (at least one), or ``[]`` once the source has ended."""
        return (await self.next_batch_with_uuids())[0]

    async def next_batch_with_uuids(self) -> tuple[list[Envelope], UUIDColumns | None]:
        """next_batch, with the UUID fields of its messages when the decoder gave them (the
        input of ``Sequencer.queue_and_drain``)."""
        while not self._ready:
            if self._done:
                return [], None
            chunk = await self._source.read()
            if chunk is None:
                self._finish()
            elif chunk.data:
                self._feed(chunk)
        item = self._ready.popleft()
        if isinstance(item, FramingError):
            raise item
        return item

    def __aiter__(self) -> Envelopes:
        return Envelopes(self.next_batch)

    def _feed(self, chunk: Chunk) -> None:
        expect = self._tail_offset + len(self._tail)
        if self._tail_offset == -1 or chunk.journal != self._journal:
            self._journal, self._tail, self._tail_offset = chunk.journal, b"", chunk.offset
            buffer = chunk.data
        elif chunk.offset != expect:
            log.warning(
                "journal %s: content jumps from offset %d to %d; %d bytes of a partial "
                "frame are dropped",
                chunk.journal,
                expect,
                chunk.offset,
                len(self._tail),
            )
            self._tail, self._tail_offset = b"", chunk.offset
            buffer = chunk.data
        elif self._tail:
            buffer = self._tail + chunk.data
        else:
            buffer = chunk.data
        decoded = self._framing.decode(buffer)
        self._tail = buffer[decoded.consumed :]
        self._emit(decoded, self._tail_offset)
        self._tail_offset += decoded.consumed

    def _finish(self) -> None:
        self._done = True
        if not self._tail:
            return
        decoded = self._framing.decode(self._tail, final=True)
        self._emit(decoded, self._tail_offset)
        begin = self._tail_offset + decoded.consumed
        left = len(self._tail) - decoded.consumed
        self._tail_offset += len(self._tail)
        self._tail = b""
        if left:
            self._ready.append(
                UnexpectedEOFError(
                    f"journal {self._journal}: read ended inside a frame "
                    f"({left} bytes from offset {begin})"
                )
            )

    def _emit(self, decoded: Decoded, base: int) -> None:
        if not decoded.values:
            return
        journal = self._journal
        if not decoded.errors:
            try:
                messages = self._decode(decoded.values)
            except Exception:  # noqa: BLE001 - a bad message: redo one by one, below.
                pass
            else:
                if len(messages) != len(decoded.values):
                    raise TypeError(
                        f"decoder returned {len(messages)} messages for {len(decoded.values)}"
                    )
                # Envelopes built field by field: cheaper than the dataclass __init__.
                new = object.__new__
                envs: list[Envelope] = []
                add = envs.append
                begin = base
                for end, msg in zip(decoded.ends, messages, strict=True):
                    env = new(Envelope)
                    env.journal = journal
                    env.begin = begin
                    env.end = begin = base + end
                    env.message = msg
                    add(env)
                uuids = messages.uuids if isinstance(messages, MessageBatch) else None
                self._ready.append((envs, uuids))
                return

        ends = [base + e for e in decoded.ends]
        begins = [base, *ends[:-1]]
        batch: list[Envelope] = []
        for begin, end, value in zip(begins, ends, decoded.values, strict=True):
            error: FramingError | None = None
            if isinstance(value, FramingError):
                error = value
            else:
                try:
                    batch.append(Envelope(journal, begin, end, self._decode((value,))[0]))
                except FramingError as err:
                    error = err
                except Exception as bad:  # noqa: BLE001 - any failure of the decoder.
                    error = MessageDecodeError(f"{type(bad).__name__}: {bad}")
                    error.__cause__ = bad
            if error is not None:
                if batch:
                    self._ready.append((batch, None))
                    batch = []
                self._ready.append(_located(error, journal, begin, end))
        if batch:
            self._ready.append((batch, None))


def _located(error: FramingError, journal: str, begin: int, end: int) -> FramingError:
    """Name the journal and offsets in the error, which a framing cannot know. Framing
    errors are made afresh for each bad frame, so they are amended in place."""
    error.args = (f"journal {journal} [{begin}, {end}): {error}",)
    for name, value in (("journal", journal), ("begin", begin), ("end", end)):
        if hasattr(error, name):
            setattr(error, name, value)
    return error


class ReadCommittedIter:
    """The committed messages of a journal, each exactly once, via a Sequencer.

    ``open_replay`` opens a bounded source over a range of the journal: it is called when
    a committed sequence began before the oldest envelope of the sequencer's ring. The
    replayed range is read whole before stepping on (it spans the open transactions of
    the journal's producers, which a consumer keeps short).

    The sequencer's checkpoint reflects every envelope returned so far.
    """

    def __init__(
        self,
        source: ChunkSource,
        framing: Framing,
        decode: Decoder,
        sequencer: Sequencer,
        open_replay: ReplayOpener,
        *,
        acks: bool = True,
    ) -> None:
        self._uncommitted = ReadUncommittedIter(source, framing, decode)
        self._framing = framing
        self._decode = decode
        self.sequencer = sequencer
        self._open_replay = open_replay
        self._acks = acks

    async def next_batch(self) -> list[Envelope]:
        """The next committed messages (at least one), or ``[]`` once the source ended."""
        while True:
            batch, uuids = await self._uncommitted.next_batch_with_uuids()
            if not batch:
                return []
            out = await sequence_committed(self.sequencer, batch, uuids, self._replay, acks=self._acks)
            if out:
                return out

    async def _replay(self, journal: str, begin: int, end: int) -> list[Envelope]:
        return await read_replay(self._open_replay, self._framing, self._decode, journal, begin, end)

    def __aiter__(self) -> Envelopes:
        return Envelopes(self.next_batch)


async def sequence_committed(seq: Sequencer, batch: Sequence[Envelope], uuids: UUIDColumns | None,
                             replay: Replay, *, acks: bool = True) -> list[Envelope]:
    """The committed envelopes that ``batch`` (uncommitted, in journal order; ``uuids`` its
    UUID fields when known) releases from ``seq``, in commit order: the read-committed replay
    protocol, driven from here alone (``ReadCommittedIter``, the consumer's ``ShardSource``,
    Spark's committed mode).

    Each envelope is queued and what it commits drained (``queue_and_drain``); when a commit
    refers to a sequence begun before the ring's oldest entry (``ACK_COMMIT_REPLAY``: the
    sequencer is ``dequeuing``), its range is read again through ``replay``, handed to the
    sequencer, and drained before the next envelope is queued.

    With ``acks`` false the acknowledgements (ACK_TXN) are left out (:func:`drop_acks`).
    """
    out: list[Envelope] = []
    i = 0
    replayed = False
    while i < len(batch):
        i = seq.queue_and_drain(batch, out, i, uuids)
        if seq.dequeuing():
            journal, begin, end = seq.replay_range()
            seq.start_replay(await replay(journal, begin, end))
            seq.drain_committed(out)
            replayed = True
    if acks or not out:
        return out
    return drop_acks(out, batch, None if replayed else uuids)


def drop_acks(released: list[Envelope], batch: Sequence[Envelope], uuids: UUIDColumns | None) -> list[Envelope]:
    """``released`` (what sequencing ``batch`` released) less its acknowledgements (ACK_TXN).

    An acknowledgement is released only as it is queued, so those released are ``batch``'s
    own: with its UUID flags known (``uuids``, aligned with ``batch``) they are found without
    reading a message, and a batch holding none costs one pass over its distinct flag values.
    Without them (or after a replay, whose envelopes are not the batch's) each message's flags
    are read (:func:`~gazette.message.message.is_ack`)."""
    if uuids is None:
        return [env for env in released if not is_ack(env)]
    flags = uuids.flags
    if not any(f & _ACK for f in set(flags)):
        return released
    acks = {id(env) for env in compress(batch, [f & _ACK for f in flags])}
    return [env for env in released if id(env) not in acks]


async def read_replay(open_replay: ReplayOpener, framing: Framing, decode: Decoder,
                      journal: str, begin: int, end: int) -> list[Envelope]:
    """The envelopes of ``journal`` over ``[begin, end)``, read again for a sequencer's replay
    (``ACK_COMMIT_REPLAY``); frames that failed when first read are skipped again."""
    source = open_replay(journal, begin, end)
    out: list[Envelope] = []
    failed: BaseException | None = None
    try:
        await _read_range(ReadUncommittedIter(source, framing, decode), end, out)
    except BaseException as err:
        failed = err  # raised once the source closed
    close = getattr(source, "aclose", None)
    if close is not None:
        # Outside any handler: compiled, a coroutine must not suspend in one (a mypyc limitation).
        await close()
    if failed is not None:
        raise failed
    return out


async def _read_range(it: ReadUncommittedIter, end: int, out: list[Envelope]) -> None:
    """Appends to ``out`` the envelopes ``it`` reads that end by ``end``."""
    while True:
        try:
            batch = await it.next_batch()
        except (MessageDecodeError, FramingError) as err:
            # Bad frames were already reported when first read; skip them again.
            if isinstance(err, UnexpectedEOFError):
                raise
            continue
        if not batch:
            return
        for env in batch:
            if env.end > end:
                return
            out.append(env)

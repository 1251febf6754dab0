"""A shard's input: the committed messages of its source journals, as a ``MessageSource``.

Each source journal is read by its own task (``JournalSource`` → ``ReadUncommittedIter``:
retrying reads, framing and batch decoding), which puts decoded, *uncommitted* batches into
one bounded queue (``read_channel_size`` batches; the message layer's ``FanIn``). The
transaction loop takes them with ``read`` and turns them into committed messages with
``sequence``, through the shard's one ``Sequencer`` (Gazette shares one across a shard's
sources) and the message layer's replay protocol (``sequence_committed``), replaying older
ranges when a commit refers to messages evicted from its ring.

Invariants:

* Reading starts at the recovered checkpoint's read-through offset of each source, else at
  its ``min_offset``; the sequencer starts from the checkpoint's producer states, so messages
  committed before the checkpoint are not delivered again.
* Only ``sequence`` touches the sequencer: a checkpoint covers exactly what was sequenced,
  however far the readers ran ahead.
* A message that does not decode fails the shard, naming the journal and offsets (never a
  silent skip). A reader's failure is delivered in order, through the queue.
* ``aclose`` stops every reader task and waits for them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gazette.client import JournalClient
from gazette.consumer.interfaces import maybe_await
from gazette.message import Envelope, ProducerState, Sequencer, flatten_producer_states
from gazette.message.fanin import FanIn
from gazette.message.framing import Framing
from gazette.message.iterators import Decoder, ReadUncommittedIter, read_replay, sequence_committed
from gazette.message.reading import batch_decoder, framing_of_spec, message_framing
from gazette.message.source import JournalSource, replay_opener
from gazette.message.uuid import UUIDColumns
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb

__all__ = ["ShardSource"]


@dataclass(frozen=True, slots=True)
class _Batch:
    journal: str
    envelopes: list[Envelope]
    uuids: UUIDColumns | None


class ShardSource:
    """The committed messages of a shard's sources (see the module docstring)."""

    def __init__(self, client: JournalClient, spec: pc.ShardSpec, journals: Mapping[str, pb.JournalSpec],
                 new_message: Any, checkpoint: pc.Checkpoint | None = None, *,
                 block: bool = True, decode: Decoder | None = None,
                 producer: Any = None, replay: Any = None) -> None:
        cp = checkpoint or pc.Checkpoint()
        self.client = client
        self.block = block
        self._codecs: dict[str, tuple[Framing, Decoder]] = {}
        self._offsets: dict[str, int] = {}
        for src in spec.sources:
            jspec = journals[src.journal]
            message_type = new_message(jspec)
            framing = message_framing(message_type, framing_of_spec(jspec), decode)
            self._codecs[src.journal] = (framing, batch_decoder(message_type, framing, decode))
            at = cp.sources[src.journal].read_through if src.journal in cp.sources else 0
            self._offsets[src.journal] = max(at, src.min_offset)
        self.sequencer = Sequencer(
            {j: cp.sources[j].read_through for j in cp.sources}, flatten_producer_states(cp),
            ring_size=spec.ring_buffer_size or 4096)
        self._readers = FanIn[_Batch](f"shard {spec.id} readers", max(1, spec.read_channel_size or 128))
        self._replay_opener = replay_opener(client)
        self._producer = producer  # an async iterator of envelope batches, replacing the readers
        self._replay_range = replay  # (journal, begin, end) -> envelopes, with a producer
        self.write_heads: dict[str, int] = {}  # last write head seen per source journal

    def start(self) -> None:
        """Starts one reader task per source journal (or one over the app's producer)."""
        if self._producer is not None:
            self._readers.add("producer", self._produced(self._producer))
            return
        for journal, offset in self._offsets.items():
            self._readers.add(journal, self._batches(journal, offset))

    async def aclose(self) -> None:
        await self._readers.aclose()

    async def _batches(self, journal: str, offset: int) -> AsyncIterator[_Batch]:
        framing, decode = self._codecs[journal]
        src = JournalSource(self.client, journal, offset, block=self.block)
        it = ReadUncommittedIter(src, framing, decode)
        heads = self.write_heads
        while True:
            envs, uuids = await it.next_batch_with_uuids()
            heads[journal] = src.reader.write_head
            if not envs:
                return
            yield _Batch(journal, envs, uuids)

    async def _produced(self, batches: Any) -> AsyncIterator[_Batch]:
        async for batch in batches:
            if batch:
                envs = list(batch)
                self.write_heads[envs[-1].journal] = envs[-1].end
                yield _Batch(envs[0].journal, envs, None)

    async def _replay(self, journal: str, begin: int, end: int) -> Sequence[Envelope]:
        if self._replay_range is not None:  # the app's producer replays its own ranges
            replayed: Sequence[Envelope] = await maybe_await(self._replay_range(journal, begin, end))
            return replayed
        framing, decode = self._codecs[journal]
        return await read_replay(self._replay_opener, framing, decode, journal, begin, end)

    # -- MessageSource --------------------------------------------------------------------

    async def read(self) -> _Batch | None:
        return await self._readers.get()

    async def sequence(self, item: _Batch) -> Sequence[Envelope]:
        return await sequence_committed(self.sequencer, item.envelopes, item.uuids, self._replay)

    async def sequence_without_acks(self, item: _Batch) -> Sequence[Envelope]:
        """``sequence`` less the acknowledgements (ACK_TXN), found from the batch's UUID flags
        (``drop_acks``) rather than message by message."""
        return await sequence_committed(self.sequencer, item.envelopes, item.uuids, self._replay, acks=False)

    def has_pending(self) -> bool:
        return self.sequencer.has_pending()

    def sequenced_through(self) -> Mapping[str, int]:
        return dict(self.sequencer.offsets)

    def checkpoint(self, prune_horizon_ns: int) -> tuple[Mapping[str, int], Sequence[ProducerState]]:
        return self.sequencer.checkpoint(prune_horizon_ns)

"""Producer states and read-through offsets in consumer checkpoints.

A consumer persists, with every transaction, a ``consumer.Checkpoint``: per source journal
its read-through offset and the states of the producers seen in it, plus the ACK intents
its own transaction must still append. These functions convert between that message and
the Sequencer's :class:`~gazette.message.sequencer.ProducerState` list, with Gazette's
encoding (``Source.producers`` entries of a 6-byte ``id`` and a ``ProducerState`` of
``last_ack`` (fixed64) and ``begin``), so checkpoints written by Go consumers restore here
and the reverse.

Invariant: ``flatten_producer_states(build_checkpoint(o, s, a))`` equals ``s`` up to order,
and ``flatten_read_through`` of it equals ``o`` for every journal of ``o``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gazette.protocol import consumer_pb2

from .errors import MessageError
from .sequencer import ProducerState
from .uuid import ProducerID

__all__ = ["build_checkpoint", "flatten_producer_states", "flatten_read_through"]


def build_checkpoint(
    read_through: Mapping[str, int],
    producer_states: Iterable[ProducerState],
    ack_intents: Mapping[str, bytes] | Iterable[tuple[str, bytes]] = (),
) -> consumer_pb2.Checkpoint:
    """A Checkpoint of read-through offsets, producer states and ACK intents by journal."""
    cp = consumer_pb2.Checkpoint()
    for journal, offset in read_through.items():
        cp.sources[journal].read_through = offset
    for state in producer_states:
        entry = cp.sources[state.journal].producers.add()
        entry.id = bytes(state.producer)
        entry.state.last_ack = state.last_ack
        entry.state.begin = state.begin
    items = ack_intents.items() if isinstance(ack_intents, Mapping) else ack_intents
    for journal, intent in items:
        cp.ack_intents[journal] = intent
    return cp


def flatten_producer_states(cp: consumer_pb2.Checkpoint) -> list[ProducerState]:
    """Every producer state of the Checkpoint (in no particular order)."""
    out: list[ProducerState] = []
    for journal, source in cp.sources.items():
        for entry in source.producers:
            if len(entry.id) != 6:
                raise MessageError(
                    f"checkpoint source {journal!r} has a producer id of {len(entry.id)} bytes"
                    f" ({entry.id.hex()}); expected 6"
                )
            out.append(
                ProducerState(
                    journal, ProducerID(entry.id), entry.state.last_ack, entry.state.begin
                )
            )
    return out


def flatten_read_through(cp: consumer_pb2.Checkpoint) -> dict[str, int]:
    """The read-through offset of each source journal of the Checkpoint."""
    return {journal: source.read_through for journal, source in cp.sources.items()}

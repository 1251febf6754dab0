"""Reading messages of journals in one call: ``read_committed`` and ``read_uncommitted``.

They take a journal name (or a label selector, for several journals), look up each journal's
``content-type`` label to pick its framing, and wire a :class:`~gazette.message.source.JournalSource`
(a retrying reader), the message type's batch decoder and, for read-committed, a
:class:`~gazette.message.sequencer.Sequencer` with replays of older content.

Invariants:

* A journal without a framed ``content-type`` is refused before anything is read, with an
  error naming the journal and the content-type it has.
* Read-committed yields each committed message exactly once, in its journal's commit order;
  read-uncommitted yields every message as read (duplicates and uncommitted ones included).
* Several journals are read concurrently, one owned task each; messages of one journal keep
  their order, journals interleave as they arrive. A reader's error ends the iteration with
  it. Closing the iterator (``contextlib.aclosing``, or the event loop's finalizer) stops
  every reader before it returns.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Final, TypeVar

from gazette.client import JournalClient
from gazette.client.listing import Selector, get_journal, list_journals
from gazette.message.errors import MessageError, UnknownContentTypeError
from gazette.message.fanin import FanIn
from gazette.message.framing import (
    CONTENT_TYPE,
    CSVFraming,
    Framing,
    JSONFraming,
    framing_for_content_type,
)
from gazette.message.iterators import Decoder, ReadCommittedIter, ReadUncommittedIter
from gazette.message.message import Envelope, JSONMessage
from gazette.message.sequencer import Sequencer
from gazette.message.source import JournalSource, replay_opener
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "batch_decoder", "framing_of_spec", "message_framing", "read_committed",
    "read_committed_batches", "read_uncommitted",
]

_T = TypeVar("_T")
_ENVELOPES_QUEUED: Final = 1024  # messages of several journals merged, waiting for the reader
_BATCHES_QUEUED: Final = 16  # batches (a chunk's messages each) likewise

_BATCH_DECODERS = {JSONFraming: "from_json_many", CSVFraming: "from_csv_many"}


def framing_of_spec(spec: pb.JournalSpec) -> Framing:
    """The framing named by a journal's content-type label, or an error naming the journal."""
    types = [lb.value for lb in spec.labels.labels if lb.name == CONTENT_TYPE]
    if not types:
        raise UnknownContentTypeError(
            f"journal {spec.name!r} has no {CONTENT_TYPE} label: its messages cannot be framed")
    try:
        return framing_for_content_type(types[0])
    except UnknownContentTypeError as err:
        raise UnknownContentTypeError(f"journal {spec.name!r}: {err}") from err


def batch_decoder(message_type: Any, framing: Framing, decode: Decoder | None = None) -> Decoder:
    """``decode``, or the batch decoder of ``message_type`` for ``framing`` (``from_json_many``, ...)."""
    if decode is not None:
        return decode
    # By the framing's class or a base (StructJSONFraming is a JSONFraming).
    name = next((_BATCH_DECODERS[c] for c in type(framing).__mro__ if c in _BATCH_DECODERS),
                "decode_many")
    fn: Decoder | None = getattr(message_type, name, None)
    if fn is None:
        raise MessageError(
            f"{getattr(message_type, '__name__', message_type)!r} has no {name}() for "
            f"{type(framing).__name__}; pass decode=")
    return fn


def message_framing(message_type: Any, framing: Framing, decode: Decoder | None = None) -> Framing:
    """``framing``, or the message type's own when it decodes a journal of that framing
    itself (a :class:`~gazette.message.typed.TypedMessage` from JSON lines, straight from the
    bytes). With a ``decode`` of the caller's the framing stays as it is."""
    if decode is not None or type(framing) is not JSONFraming:
        return framing
    hook: Callable[[], Framing] | None = getattr(message_type, "json_framing", None)
    return framing if hook is None else hook()


async def _specs(client: JournalClient, journal_or_selector: Selector) -> list[pb.JournalSpec]:
    if isinstance(journal_or_selector, str) and "=" not in journal_or_selector and \
            " in " not in journal_or_selector:
        return [(await get_journal(client, journal_or_selector)).spec]
    resp = await list_journals(client, journal_or_selector)
    if not resp.journals:
        raise MessageError(f"no journal matches {journal_or_selector!r}")
    return [j.spec for j in resp.journals]


async def _merge(iters: Sequence[AsyncIterator[_T]], bound: int) -> AsyncIterator[_T]:
    if len(iters) == 1:
        async for one in iters[0]:
            yield one
        return
    # A bounded queue: a slow consumer of the merge holds every reader back.
    async with FanIn[_T]("read", bound) as readers:  # closing it stops every reader
        for i, it in enumerate(iters):
            readers.add(f"journal {i}", it)
        while (item := await readers.get()) is not None:
            yield item


async def _next_batches(it: ReadCommittedIter) -> AsyncGenerator[list[Envelope], None]:
    while batch := await it.next_batch():
        yield batch


async def read_committed_batches(
    client: JournalClient,
    journal_or_selector: Selector,
    message_type: Any = JSONMessage,
    *,
    decode: Decoder | None = None,
    block: bool = True,
    offset: int = 0,
    ring_size: int = 4096,
    new_sequencer: Callable[[], Sequencer] | None = None,
    acks: bool = True,
) -> AsyncGenerator[list[Envelope], None]:
    """:func:`read_committed` a batch at a time: lists (never empty) of committed messages of
    one journal, in its commit order, each what one read of content released. The way to
    read many messages fast: one ``await`` per batch rather than per message. A process that
    reads at this rate should tune CPython's collector once at its start
    (``gazette.gctune.tune()``, as ``gazette consume`` does): each message's envelope is a
    tracked allocation, and the default young-collection threshold (700) cost the compiled
    reader ~40 % of its rate (``bench/consumer_bench.py``).

    With ``acks`` false, acknowledgements (ACK_TXN, the protocol's own messages) are left
    out, found from each batch's UUID flags without reading a message's UUID."""
    specs = await _specs(client, journal_or_selector)
    iters = []
    for spec in specs:
        framing = message_framing(message_type, framing_of_spec(spec), decode)
        seq = new_sequencer() if new_sequencer is not None else Sequencer(ring_size=ring_size)
        iters.append(_next_batches(ReadCommittedIter(
            JournalSource(client, spec.name, offset, block=block), framing,
            batch_decoder(message_type, framing, decode), seq, replay_opener(client), acks=acks)))
    async for batch in _merge(iters, _BATCHES_QUEUED):
        yield batch


async def read_committed(
    client: JournalClient,
    journal_or_selector: Selector,
    message_type: Any = JSONMessage,
    *,
    decode: Decoder | None = None,
    block: bool = True,
    offset: int = 0,
    ring_size: int = 4096,
    new_sequencer: Callable[[], Sequencer] | None = None,
    acks: bool = True,
) -> AsyncIterator[Envelope]:
    """Every committed message of a journal (by name) or of the journals matching a label
    selector, exactly once each. ``block`` waits for more at the write head (else the
    iteration ends there); ``offset`` is where each journal is read from. With ``acks``
    false, acknowledgements (ACK_TXN) are left out: a reader of application messages skips
    them without checking each message's UUID."""
    batches = read_committed_batches(
        client, journal_or_selector, message_type, decode=decode, block=block, offset=offset,
        ring_size=ring_size, new_sequencer=new_sequencer, acks=acks)
    async with aclosing(batches):
        async for batch in batches:
            for env in batch:
                yield env


async def read_uncommitted(
    client: JournalClient,
    journal_or_selector: Selector,
    message_type: Any = JSONMessage,
    *,
    decode: Decoder | None = None,
    block: bool = True,
    offset: int = 0,
) -> AsyncIterator[Envelope]:
    """Every message of the journal(s) as read: duplicates, uncommitted messages and ACKs
    included (what a consumer's read-committed view is built from)."""
    specs = await _specs(client, journal_or_selector)
    iters = []
    for spec in specs:
        framing = message_framing(message_type, framing_of_spec(spec), decode)
        iters.append(ReadUncommittedIter(
            JournalSource(client, spec.name, offset, block=block), framing,
            batch_decoder(message_type, framing, decode)).__aiter__())
    async for env in _merge(iters, _ENVELOPES_QUEUED):
        yield env

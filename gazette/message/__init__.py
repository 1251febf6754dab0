"""gazette.message: exactly-once messages over at-least-once journals.

Messages carry RFC 4122 v1 UUIDs naming their producer, ordering them and flagging their
transaction role (:mod:`.uuid`). Framings lay them out as bytes by content-type
(:mod:`.framing`); mappings pick the journal of each (:mod:`.mapping`); a
:class:`Publisher` stamps and appends them; readers iterate them read-uncommitted or,
through a :class:`Sequencer`, read-committed (:mod:`.iterators`), and consumer
checkpoints keep the sequencer's producer states (:mod:`.producer_state`).

Wire- and semantics-compatible with Gazette's ``message`` package.
"""

from typing import TYPE_CHECKING

from gazette.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .errors import (
        DesyncError,
        EmptyListResponseError,
        FramingError,
        MappingError,
        MessageDecodeError,
        MessageError,
        ReplayError,
        UnexpectedEOFError,
        UnknownContentTypeError,
    )
    from .framing import (
        CONTENT_TYPE,
        CONTENT_TYPE_CSV,
        CONTENT_TYPE_JSON_LINES,
        CONTENT_TYPE_PROTO_FIXED,
        FIXED_FRAME_HEADER_LENGTH,
        FIXED_FRAME_WORD,
        CSVFraming,
        Decoded,
        FixedFraming,
        Framing,
        JSONFraming,
        Unpacked,
        framing_for_content_type,
        register_framing,
    )
    from .iterators import (
        Chunk,
        ChunkSource,
        Decoder,
        ReadCommittedIter,
        ReadUncommittedIter,
        ReplayOpener,
    )
    from .mapping import (
        KeyFunc,
        MappingFunc,
        PartitionsFunc,
        fnv1a_32,
        modulo_mapping,
        random_mapping,
        rendezvous_mapping,
    )
    from .message import CSVRecord, Envelope, JSONMessage, Message, is_ack, parse_uuid
    from .producer_state import build_checkpoint, flatten_producer_states, flatten_read_through
    from .publisher import AckIntent, Publisher
    from .reading import read_committed, read_committed_batches, read_uncommitted
    from .sequencer import ProducerState, QueueOutcome, Sequencer
    from .source import JournalSource, replay_opener
    from .targets import AppendTarget, BufferedAppender
    from .typed import StructJSONFraming, TypedMessage
    from .uuid import (
        ACK_TXN,
        CONTINUE_TXN,
        OUTSIDE_TXN,
        UUID,
        ZERO_UUID,
        Clock,
        Flags,
        ProducerID,
        build_uuid,
        clock_from_time,
        get_clock,
        get_flags,
        get_producer_id,
        new_producer_id,
    )

# Every name is loaded on first use (and then kept here): importing one part (the UUIDs,
# say) does not import the rest. Readers over journals need the client (grpc and all), and
# typed messages msgspec.
_LAZY = {"ACK_TXN": ".uuid", "AckIntent": ".publisher", "AppendTarget": ".targets",
         "BufferedAppender": ".targets", "CONTENT_TYPE": ".framing",
         "CONTENT_TYPE_CSV": ".framing", "CONTENT_TYPE_JSON_LINES": ".framing",
         "CONTENT_TYPE_PROTO_FIXED": ".framing", "CONTINUE_TXN": ".uuid",
         "CSVFraming": ".framing", "CSVRecord": ".message", "Chunk": ".iterators",
         "ChunkSource": ".iterators", "Clock": ".uuid", "Decoded": ".framing",
         "Decoder": ".iterators", "DesyncError": ".errors", "EmptyListResponseError": ".errors",
         "Envelope": ".message", "FIXED_FRAME_HEADER_LENGTH": ".framing",
         "FIXED_FRAME_WORD": ".framing", "FixedFraming": ".framing", "Flags": ".uuid",
         "Framing": ".framing", "FramingError": ".errors", "JSONFraming": ".framing",
         "JSONMessage": ".message", "KeyFunc": ".mapping", "MappingError": ".errors",
         "MappingFunc": ".mapping", "Message": ".message", "MessageDecodeError": ".errors",
         "MessageError": ".errors", "OUTSIDE_TXN": ".uuid", "PartitionsFunc": ".mapping",
         "ProducerID": ".uuid", "ProducerState": ".sequencer", "Publisher": ".publisher",
         "QueueOutcome": ".sequencer", "ReadCommittedIter": ".iterators",
         "ReadUncommittedIter": ".iterators", "ReplayError": ".errors",
         "ReplayOpener": ".iterators", "Sequencer": ".sequencer", "UUID": ".uuid",
         "UnexpectedEOFError": ".errors", "UnknownContentTypeError": ".errors",
         "Unpacked": ".framing", "ZERO_UUID": ".uuid", "build_checkpoint": ".producer_state",
         "build_uuid": ".uuid", "clock_from_time": ".uuid",
         "flatten_producer_states": ".producer_state", "flatten_read_through": ".producer_state",
         "fnv1a_32": ".mapping", "framing_for_content_type": ".framing", "get_clock": ".uuid",
         "get_flags": ".uuid", "is_ack": ".message", "get_producer_id": ".uuid", "modulo_mapping": ".mapping",
         "new_producer_id": ".uuid", "parse_uuid": ".message", "random_mapping": ".mapping",
         "register_framing": ".framing", "rendezvous_mapping": ".mapping",
         "read_committed": ".reading", "read_committed_batches": ".reading",
         "read_uncommitted": ".reading", "JournalSource": ".source",
         "replay_opener": ".source", "TypedMessage": ".typed", "StructJSONFraming": ".typed"}



__all__ = [
    "ACK_TXN",
    "CONTENT_TYPE",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "CONTINUE_TXN",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "OUTSIDE_TXN",
    "UUID",
    "ZERO_UUID",
    "AckIntent",
    "AppendTarget",
    "BufferedAppender",
    "CSVFraming",
    "CSVRecord",
    "Chunk",
    "ChunkSource",
    "Clock",
    "Decoded",
    "Decoder",
    "DesyncError",
    "EmptyListResponseError",
    "Envelope",
    "FixedFraming",
    "Flags",
    "Framing",
    "FramingError",
    "JSONFraming",
    "JSONMessage",
    "JournalSource",
    "KeyFunc",
    "MappingError",
    "MappingFunc",
    "Message",
    "MessageDecodeError",
    "MessageError",
    "PartitionsFunc",
    "ProducerID",
    "ProducerState",
    "Publisher",
    "QueueOutcome",
    "ReadCommittedIter",
    "ReadUncommittedIter",
    "ReplayError",
    "ReplayOpener",
    "Sequencer",
    "StructJSONFraming",
    "UnexpectedEOFError",
    "TypedMessage",
    "UnknownContentTypeError",
    "Unpacked",
    "build_checkpoint",
    "build_uuid",
    "clock_from_time",
    "flatten_producer_states",
    "flatten_read_through",
    "fnv1a_32",
    "framing_for_content_type",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "is_ack",
    "modulo_mapping",
    "new_producer_id",
    "parse_uuid",
    "random_mapping",
    "read_committed",
    "read_committed_batches",
    "read_uncommitted",
    "register_framing",
    "replay_opener",
    "rendezvous_mapping",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

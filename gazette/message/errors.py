"""Errors of the message layer.

::

    MessageError                      base of every error raised by gazette.message
    ├── FramingError                  content cannot be split into frames or decoded
    │   ├── UnknownContentTypeError   no Framing is registered for a content-type
    │   ├── DesyncError               fixed framing lost sync; bytes were skipped to resync
    │   ├── UnexpectedEOFError        a bounded read ended inside a frame
    │   └── MessageDecodeError        one frame is not a valid message (later ones may be)
    ├── MappingError                  a message cannot be mapped to a journal
    │   └── EmptyListResponseError    the partitions list holds no journals
    └── ReplayError                   a replay iterator returned envelopes outside the range

Errors carry the journal and offsets they concern so a log line can point at the bytes.
"""

from __future__ import annotations

from gazette.errors import GazetteError

__all__ = [
    "DesyncError",
    "EmptyListResponseError",
    "FramingError",
    "MappingError",
    "MessageDecodeError",
    "MessageError",
    "ReplayError",
    "UnexpectedEOFError",
    "UnknownContentTypeError",
]


class MessageError(GazetteError):
    """Base of every error raised by gazette.message."""


class FramingError(MessageError):
    """Journal content cannot be split into frames, or a frame cannot be decoded."""


class UnknownContentTypeError(FramingError):
    """No Framing is registered for the content-type."""


class DesyncError(FramingError):
    """A fixed-framing reader found no magic word where a frame should begin.

    ``skipped`` bytes from ``begin`` were discarded to reach the next magic word.
    """

    def __init__(self, message: str, *, journal: str = "", begin: int = -1, skipped: int = 0):
        super().__init__(message)
        self.journal = journal
        self.begin = begin
        self.skipped = skipped


class UnexpectedEOFError(FramingError):
    """A bounded read ended part-way through a frame."""


class MessageDecodeError(FramingError):
    """The frame at ``[begin, end)`` of ``journal`` is not a valid message.

    Reading may continue: the frame was consumed and later frames are unaffected.
    """

    def __init__(self, message: str, *, journal: str = "", begin: int = -1, end: int = -1):
        super().__init__(message)
        self.journal = journal
        self.begin = begin
        self.end = end


class MappingError(MessageError):
    """A message cannot be mapped to a journal."""


class EmptyListResponseError(MappingError):
    """The partitions list from which a mapping selects holds no journals."""


class ReplayError(MessageError):
    """A replay iterator returned an envelope outside the range the Sequencer asked for."""

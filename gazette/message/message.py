"""Messages and envelopes.

A :class:`Message` is a user type that carries the UUID Gazette assigns it when published:
the UUID names its producer, orders it among that producer's messages and flags its
transaction role, which is what lets readers drop duplicates and uncommitted messages. A
type unable to keep a UUID returns the zero UUID from ``get_uuid`` and so opts out of
exactly-once processing (each such message is delivered as read).

Two ready implementations:

* :class:`JSONMessage`: a JSON object (a ``dict``) for ``application/x-ndjson`` journals.
  The UUID is kept, in canonical text form, under the key ``"UUID"`` (class attribute
  ``uuid_key``): that is the key Gazette's Go messages produce, their UUID being a struct
  field named ``UUID``, so Python and Go producers and readers can share a journal.
* :class:`CSVRecord`: a list of strings for ``text/csv`` journals, UUID in column 0.

An :class:`Envelope` is a message with the journal and the ``[begin, end)`` byte offsets it
was read from.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, ClassVar, Final, Generic, Protocol

from typing_extensions import TypeVar

from .errors import MessageDecodeError
from .uuid import ACK_TXN, UUID, ZERO_UUID, UUIDColumns, uuid_columns, uuid_from_int

__all__ = [
    "CSVRecord",
    "Envelope",
    "JSONMessage",
    "Message",
    "MessageBatch",
    "is_ack",
    "parse_uuid",
    "parse_uuid_int",
    "uuid_flags",
]

_JM = TypeVar("_JM", bound="JSONMessage")
_T = TypeVar("_T")
_FLAGS_MASK: Final = 0x3FF
_ACK: Final = int(ACK_TXN)


class Message(Protocol):
    """A user message able to carry a Gazette UUID.

    A message type may also offer the UUID as a 128-bit integer attribute ``uuid_int``
    (kept in step with ``set_uuid``): the Sequencer then reads it instead of calling
    ``get_uuid``, which saves building a ``uuid.UUID`` per message read. Likewise a method
    ``set_uuid_int(value)``, equivalent to ``set_uuid(UUID(int=value))``, is what the
    Publisher calls when present.
    """

    def get_uuid(self) -> UUID:
        """The UUID set on the message, or the zero UUID if it keeps none."""
        ...

    def set_uuid(self, uuid: UUID) -> None:
        """Set the message UUID (a no-op for types that keep none)."""
        ...

    def new_acknowledgement(self, journal: str) -> Message:
        """A new message of this type that will acknowledge this (and earlier) messages
        published to ``journal`` within a transaction."""
        ...


M = TypeVar("M", default=Any)
"""An envelope's message type: ``Envelope[Word]`` for a consumer reading ``Word`` messages (bare
``Envelope``: any message)."""


@dataclass(slots=True)
class Envelope(Generic[M]):
    """A message with the journal and ``[begin, end)`` byte offsets it was read from."""

    journal: str
    begin: int
    end: int
    message: M


def uuid_flags(envelope: Envelope[Any]) -> int:
    """The transaction flags of the envelope's message UUID (OUTSIDE_TXN, CONTINUE_TXN,
    ACK_TXN). Reads the message's ``uuid_int`` when its type offers one (no UUID object is
    built), else ``get_uuid()``."""
    msg: Any = envelope.message
    value = getattr(msg, "uuid_int", None)
    if value is None:
        value = msg.get_uuid().int
    return (int(value) >> 48) & _FLAGS_MASK


def is_ack(envelope: Envelope[Any]) -> bool:
    """Whether the envelope holds a transaction acknowledgement (ACK_TXN): a message of the
    protocol, committing its producer's transaction, rather than one of the application's."""
    return bool(uuid_flags(envelope) & _ACK)


def parse_uuid_int(text: str) -> int:
    """The 128-bit integer of a UUID in canonical ``8-4-4-4-12`` hex form.

    Raises ValueError naming the text if it is not canonical. Cheaper than ``uuid.UUID``,
    which matters once per message on the read path.
    """
    if len(text) == 36 and text[8:24:5] == "----":
        digits = text.replace("-", "")
        # int() would also take '_', signs, spaces and non-ASCII digits: rule them out.
        if len(digits) == 32 and digits.isascii() and digits.isalnum():
            try:
                return int(digits, 16)
            except ValueError:
                pass  # A letter beyond 'f'.
    raise ValueError(f"not a canonical UUID: {text!r}")


def parse_uuid(text: str) -> UUID:
    """Parse a UUID in canonical ``8-4-4-4-12`` hex form; raises ValueError if it is not."""
    return uuid_from_int(parse_uuid_int(text))


class MessageBatch(list[_T]):
    """Messages decoded in one batch, with the fields of their UUIDs as :attr:`uuids`
    (a :class:`~gazette.message.uuid.UUIDColumns`, aligned with the list) when the decoder
    computed them in bulk. The read-committed iterator hands those to the Sequencer, which
    then reads no UUID message by message. ``uuids`` is None when not known."""

    __slots__ = ("uuids",)

    def __init__(self, items: Iterable[_T] = (), uuids: UUIDColumns | None = None) -> None:
        super().__init__(items)
        self.uuids = uuids


_ZERO_TEXT: Final = "00000000-0000-0000-0000-000000000000"
_HEX_DELETE: Final = b"-/"


def canonical_uuid_bytes(texts: list[Any]) -> bytes | None:
    """The 16-byte big-endian values of canonical UUID texts, concatenated, or None if any
    text is not one (the caller then redoes the batch text by text, to raise the error).

    One pass of C-level string operations over the whole batch: the texts are joined with
    ``/`` (neither a hex digit nor ``-``); the joiners must then fall exactly every 37
    characters, which pins every text to 36 characters; the four dashes of each must sit
    at its offsets 8, 13, 18 and 23; and deleting joiners and dashes must leave exactly 32
    characters per text, which rules out any other dash or joiner. ``unhexlify`` rejects
    whatever is then not a hex digit.
    """
    n = len(texts)
    try:
        joined = "/".join(texts)
    except TypeError:
        return None  # A text that is not a str.
    if len(joined) != 37 * n - 1:
        return None
    if n > 1 and joined[36::37] != "/" * (n - 1):
        return None
    dashes = "-" * n
    if (
        joined[8::37] != dashes
        or joined[13::37] != dashes
        or joined[18::37] != dashes
        or joined[23::37] != dashes
        or not joined.isascii()
    ):
        return None
    digits = joined.encode().translate(None, _HEX_DELETE)
    if len(digits) != 32 * n:
        return None
    try:
        return binascii.unhexlify(digits)
    except binascii.Error:
        return None


class JSONMessage:
    """A JSON object message, its UUID kept under ``uuid_key`` in canonical text form.

    :attr:`uuid_int` is the UUID as a 128-bit integer. Messages built by
    :meth:`from_json_many` had their UUID texts validated in bulk and parse the integer on
    first use (the read-committed path never asks: the Sequencer gets the UUID fields in
    bulk). Change the UUID with :meth:`set_uuid`, not by editing ``doc``.
    """

    __slots__ = ("_uuid_int", "doc")

    uuid_key: ClassVar[str] = "UUID"

    def __init__(self, doc: dict[str, Any] | None = None, /, **fields: Any) -> None:
        if doc is None:
            doc = {}
        if fields:
            doc.update(fields)
        self.doc = doc
        text = doc.get(self.uuid_key)
        self._uuid_int = 0 if text is None else parse_uuid_int(text)

    @property
    def uuid_int(self) -> int:
        """The UUID as a 128-bit integer (0: none)."""
        try:
            return self._uuid_int
        except AttributeError:
            pass
        text = self.doc.get(self.uuid_key)
        value = self._uuid_int = 0 if text is None else parse_uuid_int(text)
        return value

    @classmethod
    def from_json(cls: type[_JM], value: Any) -> _JM:
        """The message of a decoded JSON value; raises MessageDecodeError if it is not an
        object or its UUID is malformed."""
        return cls.from_json_many((value,))[0]

    @classmethod
    def from_json_many(cls: type[_JM], values: Iterable[Any]) -> MessageBatch[_JM]:
        """Messages of many decoded JSON values: the batch form of :meth:`from_json`.

        The UUID texts are validated and parsed together (see :func:`canonical_uuid_bytes`)
        and their fields returned as the batch's ``uuids``; should any value be invalid, the
        batch is redone value by value to raise the error naming it.
        """
        if type(values) is not list:
            values = list(values)
        key = cls.uuid_key
        try:
            texts = list(map(dict.get, values, repeat(key)))
        except TypeError:
            return cls._from_json_each(values)  # A value that is not a dict.
        if None in texts:
            texts = [_ZERO_TEXT if t is None else t for t in texts]
        raw = canonical_uuid_bytes(texts)
        if raw is None:
            return cls._from_json_each(values)
        new = object.__new__
        out: MessageBatch[_JM] = MessageBatch()
        add = out.append
        for value in values:
            if type(value) is not dict:
                return cls._from_json_each(values)  # A dict subclass.
            msg = new(cls)
            msg.doc = value
            add(msg)
        out.uuids = uuid_columns(raw)
        return out

    @classmethod
    def _from_json_each(cls: type[_JM], values: list[Any]) -> MessageBatch[_JM]:
        key = cls.uuid_key
        new = object.__new__
        out: MessageBatch[_JM] = MessageBatch()
        add = out.append
        for value in values:
            if type(value) is not dict:
                raise MessageDecodeError(f"expected a JSON object, got {type(value).__name__}")
            msg = new(cls)
            msg.doc = value
            text = value.get(key)
            if text is None:
                msg._uuid_int = 0
            elif type(text) is str:
                try:
                    msg._uuid_int = parse_uuid_int(text)
                except ValueError as err:
                    raise MessageDecodeError(f"invalid {key!r} field: {err}") from err
            else:
                raise MessageDecodeError(f"invalid {key!r} field: not a canonical UUID: {text!r}")
            add(msg)
        return out

    def to_json(self) -> dict[str, Any]:
        return self.doc

    def get_uuid(self) -> UUID:
        v = self.uuid_int
        return uuid_from_int(v) if v else ZERO_UUID

    def set_uuid(self, uuid: UUID) -> None:
        self.set_uuid_int(uuid.int)

    def set_uuid_int(self, value: int) -> None:
        """Set the UUID given as its 128-bit integer (what the Publisher calls)."""
        self._uuid_int = value
        h = value.to_bytes(16, "big").hex()  # uuid_text, inlined: once per publish.
        self.doc[self.uuid_key] = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def new_acknowledgement(self, journal: str) -> JSONMessage:
        return type(self)()

    def __getitem__(self, key: str) -> Any:
        return self.doc[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.doc.get(key, default)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JSONMessage):
            return NotImplemented
        return self.doc == other.doc

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.doc!r})"


class CSVRecord(list[str]):
    """A CSV record message: a list of fields, the first holding the UUID as text."""

    __slots__ = ()

    @classmethod
    def from_csv(cls, record: list[str]) -> CSVRecord:
        """The message of a decoded record; raises MessageDecodeError if the first column is
        not a UUID."""
        if not record:
            raise MessageDecodeError("a CSV record message needs at least one field")
        try:
            parse_uuid(record[0])
        except ValueError as err:
            raise MessageDecodeError(f"CSV column 0: {err}") from err
        return cls(record)

    @classmethod
    def from_csv_many(cls, records: Iterable[list[str]]) -> list[CSVRecord]:
        """Messages of many decoded records (the batch form of :meth:`from_csv`)."""
        return [cls.from_csv(r) for r in records]

    def to_csv(self) -> list[str]:
        return self

    def get_uuid(self) -> UUID:
        return parse_uuid(self[0]) if self and self[0] else ZERO_UUID

    def set_uuid(self, uuid: UUID) -> None:
        if self:
            self[0] = str(uuid)
        else:
            self.append(str(uuid))

    def new_acknowledgement(self, journal: str) -> CSVRecord:
        return CSVRecord([""] * max(len(self), 1))

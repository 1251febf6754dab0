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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from .errors import MessageDecodeError
from .uuid import UUID, ZERO_UUID, uuid_from_int

__all__ = ["CSVRecord", "Envelope", "JSONMessage", "Message", "parse_uuid", "parse_uuid_int"]

_JM = TypeVar("_JM", bound="JSONMessage")


class Message(Protocol):
    """A user message able to carry a Gazette UUID.

    A message type may also offer the UUID as a 128-bit integer attribute ``uuid_int``
    (kept in step with ``set_uuid``): the Sequencer then reads it instead of calling
    ``get_uuid``, which saves building a ``uuid.UUID`` per message read.
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


@dataclass(slots=True)
class Envelope:
    """A message with the journal and ``[begin, end)`` byte offsets it was read from."""

    journal: str
    begin: int
    end: int
    message: Any


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


class JSONMessage:
    """A JSON object message, its UUID kept under ``uuid_key`` in canonical text form.

    The UUID is parsed once, when the message is built from its document, into
    :attr:`uuid_int` (which the Sequencer reads directly, sparing a ``uuid.UUID`` per
    message). Change it with :meth:`set_uuid`, not by editing ``doc``.
    """

    __slots__ = ("doc", "uuid_int")

    uuid_key: ClassVar[str] = "UUID"

    def __init__(self, doc: dict[str, Any] | None = None, /, **fields: Any) -> None:
        if doc is None:
            doc = {}
        if fields:
            doc.update(fields)
        self.doc = doc
        text = doc.get(self.uuid_key)
        #: The UUID as a 128-bit integer (0: none).
        self.uuid_int = 0 if text is None else parse_uuid_int(text)

    @classmethod
    def from_json(cls: type[_JM], value: Any) -> _JM:
        """The message of a decoded JSON value; raises MessageDecodeError if it is not an
        object or its UUID is malformed."""
        return cls.from_json_many((value,))[0]

    @classmethod
    def from_json_many(cls: type[_JM], values: Iterable[Any]) -> list[_JM]:
        """Messages of many decoded JSON values: the batch form of :meth:`from_json`, with
        the per-message work inlined."""
        key = cls.uuid_key
        new = object.__new__
        out: list[_JM] = []
        add = out.append
        for value in values:
            if type(value) is not dict:
                raise MessageDecodeError(f"expected a JSON object, got {type(value).__name__}")
            msg = new(cls)
            msg.doc = value
            text = value.get(key)
            if text is None:
                msg.uuid_int = 0
            elif (
                type(text) is str
                and len(text) == 36
                and text[8:24:5] == "----"
                and len(digits := text.replace("-", "")) == 32
                and digits.isascii()
                and digits.isalnum()
            ):
                try:
                    msg.uuid_int = int(digits, 16)
                except ValueError as err:
                    raise MessageDecodeError(f"invalid {key!r} field: {err}") from err
            else:
                raise MessageDecodeError(f"invalid {key!r} field: not a canonical UUID: {text!r}")
            add(msg)
        return out

    def to_json(self) -> dict[str, Any]:
        return self.doc

    def get_uuid(self) -> UUID:
        return uuid_from_int(self.uuid_int) if self.uuid_int else ZERO_UUID

    def set_uuid(self, uuid: UUID) -> None:
        self.uuid_int = uuid.int
        self.doc[self.uuid_key] = str(uuid)

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

"""Typed messages: a user's own class, decoded and encoded by msgspec.

A typed message is a :class:`msgspec.Struct` subclass of :class:`TypedMessage`::

    class Ride(TypedMessage):
        station: str
        duration_s: float

It reads and publishes through the usual JSON framing (``application/x-ndjson``): a typo in
a field is a type error (mypy) or a :class:`~gazette.message.errors.MessageDecodeError`
naming the field (decoding validates), not a ``KeyError`` at run time, and decoding runs in
msgspec's C code straight from the journal's bytes.

Invariants:

* The UUID is the field ``uuid`` encoded under the JSON key ``"UUID"``: the key Gazette's Go
  messages produce (a struct field named ``UUID`` of type ``message.UUID``, marshalled as
  canonical text), so Go producers and readers share a journal with Python ones. An unset
  UUID is the zero UUID's text (what Go marshals for a zero UUID; Go cannot decode ``""``).
  Key order is msgspec's (fields with defaults, the UUID among them, come last); JSON
  readers, Go's included, do not depend on it. JSON has no infinities or NaN: msgspec
  encodes them as ``null``, which a ``float`` field then refuses to decode (Go refuses to
  encode them at all), so keep such values out of typed messages.
* A frame decodes as ``json.loads`` would accept exactly one document on the line; a line
  that does not decode, or does not validate against the type, stands as a
  ``MessageDecodeError`` in place of its message, and the lines after it still decode.
* An acknowledgement (:meth:`TypedMessage.new_acknowledgement`) is the type's zero value, as
  Go's: each required field holds the zero of its type (``""``, ``0``, ``False``, empty
  containers, ``None`` for optional fields, nested structs likewise), so any reader of the
  type decodes it. A type with a required field that has no zero value (a ``datetime``, a
  ``Literal``...) raises, naming the field, when an acknowledgement is first built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from itertools import accumulate, count
from operator import add, attrgetter
from typing import Any, Final, TypeVar

import msgspec
import msgspec.inspect as mi

from .errors import FramingError, MessageDecodeError, MessageError
from .framing import CONTENT_TYPE_JSON_LINES, Decoded, JSONFraming
from .message import MessageBatch, canonical_uuid_bytes, parse_uuid_int
from .uuid import UUID, ZERO_UUID, uuid_columns, uuid_from_int

__all__ = ["StructJSONFraming", "TypedMessage"]

#: What msgspec raises for a line that does not decode: invalid JSON or a type mismatch
#: (DecodeError), invalid UTF-8 in a string (UnicodeDecodeError), nesting too deep.
_DECODE_ERRORS: Final = (msgspec.DecodeError, ValueError, RecursionError)

_T = TypeVar("_T", bound="TypedMessage")

#: The zero UUID's canonical text: an unset UUID, as Go marshals one.
ZERO_UUID_TEXT: Final = "00000000-0000-0000-0000-000000000000"

_get_uuid_text = attrgetter("uuid")


class TypedMessage(msgspec.Struct, kw_only=True):
    """Base of typed messages: subclass it and declare fields (see the module docstring).

    Fields are keyword-only. The Publisher sets :attr:`uuid`; read it through
    :meth:`get_uuid` (a :class:`uuid.UUID`) or :attr:`uuid_int`.
    """

    uuid: str = msgspec.field(default=ZERO_UUID_TEXT, name="UUID")

    @property
    def uuid_int(self) -> int:
        """The UUID as a 128-bit integer (0: none)."""
        return parse_uuid_int(self.uuid)

    def get_uuid(self) -> UUID:
        v = parse_uuid_int(self.uuid)
        return uuid_from_int(v) if v else ZERO_UUID

    def set_uuid(self, uuid: UUID) -> None:
        self.set_uuid_int(uuid.int)

    def set_uuid_int(self, value: int) -> None:
        """Set the UUID given as its 128-bit integer (what the Publisher calls)."""
        h = value.to_bytes(16, "big").hex()
        # force_setattr: a frozen=True message is stamped too (it is ours until published).
        msgspec.structs.force_setattr(
            self, "uuid", f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")

    def new_acknowledgement(self: _T, journal: str) -> _T:
        """The type's zero value (see the module docstring), to carry an ACK's UUID."""
        zero: _T = _codec(type(self)).zero()
        return zero

    # The framing hooks: JSONFraming encodes through these, and readers swap in the type's
    # own framing (``typed_framing``) so lines decode straight into instances.

    def json_line(self) -> bytes:
        """This message as one JSON frame (the document and its newline)."""
        try:
            return _codec(type(self)).encoder.encode(self) + b"\n"
        except (TypeError, ValueError, msgspec.EncodeError) as err:
            raise FramingError(f"cannot encode {type(self).__name__} as JSON: {err}") from err

    @classmethod
    def json_lines(cls, msgs: Sequence[TypedMessage]) -> bytes:
        """The frames of ``msgs``, encoded in one call."""
        try:
            return _codec(cls).encoder.encode_lines(msgs)
        except (TypeError, ValueError, msgspec.EncodeError) as err:
            raise FramingError(f"cannot encode {cls.__name__} as JSON: {err}") from err

    @classmethod
    def json_framing(cls) -> StructJSONFraming:
        """The framing that decodes this type's journals straight into instances."""
        return _codec(cls).framing

    @classmethod
    def from_json_many(cls: type[_T], values: Iterable[Any]) -> MessageBatch[_T]:
        """Messages of a batch, with their UUID fields (the read path's batch decoder).

        ``values`` are instances (from this type's framing) or plain JSON values (from the
        generic JSONFraming, converted and validated here); raises MessageDecodeError if one
        is not a valid message.
        """
        if type(values) is not list:
            values = list(values)
        if values and type(values[0]) is not cls:
            try:
                values = msgspec.convert(values, list[cls])  # type: ignore[valid-type]
            except msgspec.ValidationError as err:
                raise MessageDecodeError(f"invalid {cls.__name__}: {err}") from err
        texts = list(map(_get_uuid_text, values))
        raw = canonical_uuid_bytes(texts)
        if raw is None:
            for text in texts:
                try:
                    parse_uuid_int(text)
                except (ValueError, TypeError) as err:
                    raise MessageDecodeError(f"invalid 'UUID' field: {err}") from err
            raise MessageDecodeError("invalid 'UUID' field")  # pragma: no cover - unreachable
        return MessageBatch(values, uuid_columns(raw))


class StructJSONFraming(JSONFraming):
    """JSON lines decoded by msgspec straight into one :class:`TypedMessage` type.

    Encoding is JSONFraming's (which encodes typed messages through msgspec); ``decode``
    and ``unmarshal`` return instances of the type, validated.
    """

    content_type: Final = CONTENT_TYPE_JSON_LINES  # type: ignore[misc]

    def __init__(self, message_type: type[TypedMessage]) -> None:
        super().__init__()
        self.message_type = message_type
        self._one = msgspec.json.Decoder(message_type)

    def unmarshal(self, frame: bytes) -> Any:
        try:
            return self._one.decode(frame)
        except _DECODE_ERRORS as err:
            raise MessageDecodeError(
                f"invalid {self.message_type.__name__} message: {err}") from err

    def decode(self, buffer: bytes, final: bool = False) -> Decoded:
        end = buffer.rfind(b"\n") + 1
        if end == 0:
            return Decoded()
        lines = buffer[: end - 1].split(b"\n")
        ends = list(map(add, accumulate(map(len, lines)), count(1)))
        # A line at a time, one msgspec call each: no document can span lines or share one
        # (one call over the lines joined into an array could be fooled by lines that
        # parse only together), and it measured faster. On an error, each line alone again,
        # which isolates the bad ones.
        try:
            return Decoded(list(map(self._one.decode, lines)), ends, end, 0)
        except _DECODE_ERRORS:
            pass
        values: list[Any] = []
        errors = 0
        one = self._one.decode
        for line in lines:
            try:
                values.append(one(line))
            except _DECODE_ERRORS as err:
                values.append(MessageDecodeError(
                    f"invalid {self.message_type.__name__} message: {err}"))
                errors += 1
        return Decoded(values, ends, end, errors)


class _Codec:
    """What one TypedMessage type needs, built once: encoder, framing and zero document."""

    __slots__ = ("_zero_doc", "encoder", "framing", "message_type")

    def __init__(self, message_type: type[TypedMessage]) -> None:
        self.message_type = message_type
        self.encoder = msgspec.json.Encoder()
        self.framing = StructJSONFraming(message_type)
        self._zero_doc: dict[str, Any] | None = None

    def zero(self) -> Any:
        doc = self._zero_doc
        if doc is None:
            info = mi.type_info(self.message_type)
            assert isinstance(info, mi.StructType)
            doc = self._zero_doc = _zero_struct_doc(info, self.message_type.__name__)
        return msgspec.convert(doc, self.message_type)


@cache
def _codec(message_type: type[TypedMessage]) -> _Codec:
    return _Codec(message_type)


#: The zero of each scalar type, as JSON: what Go's zero value of the field marshals to.
_SCALAR_ZEROS: Final[dict[type[mi.Type], Any]] = {
    mi.StrType: "",
    mi.IntType: 0,
    mi.FloatType: 0.0,
    mi.BoolType: False,
    mi.BytesType: "",
    mi.ByteArrayType: "",
    mi.AnyType: None,
    mi.NoneType: None,
    mi.ListType: [],
    mi.SetType: [],
    mi.FrozenSetType: [],
    mi.VarTupleType: [],
    mi.DictType: {},
}


def _zero_struct_doc(info: mi.StructType, where: str) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for f in info.fields:
        if f.required:
            doc[f.encode_name] = _zero_of(f.type, f"{where}.{f.name}")
    return doc


def _zero_of(t: mi.Type, where: str) -> Any:
    if type(t) in _SCALAR_ZEROS:
        return _SCALAR_ZEROS[type(t)]
    if isinstance(t, mi.Metadata):
        return _zero_of(t.type, where)
    if isinstance(t, mi.UnionType) and t.includes_none:
        return None
    if isinstance(t, mi.StructType | mi.DataclassType | mi.TypedDictType):
        return _zero_struct_doc(t, where)  # type: ignore[arg-type]
    raise MessageError(
        f"cannot build an acknowledgement message: {where} ({type(t).__name__}) has no "
        "zero value; give the field a default, or override new_acknowledgement")

"""Labels, label sets and label selectors, with Gazette's semantics and conventions.

A *label* is a ``(name, value)`` pair; journals and shards carry a *label set*, and
*label selectors* query sets of them, much like Kubernetes labels and selectors
except that a name may carry several values (a label set is a multi-map).

Invariants:

* ``LabelSet`` is immutable and kept sorted by ``(name, value, prefix)`` without
  duplicates, which is the order Gazette requires on the wire. Constructing one
  normalises any input; checking that a *received* ``protocol.LabelSet`` is already
  in that order is the job of ``validate_label_set``, which looks at the message.
* Names are tokens of 2..64 bytes drawn from Unicode letters and numbers and
  ``-_+/.``; values are 0..1024 bytes of the same plus ``=%`` (lengths count UTF-8
  bytes, as Gazette does). A name's values are either a single ``""`` or all
  non-empty.
* A ``Label`` with ``prefix`` set matches any value it is a prefix of; it may occur
  only inside a selector, where it is written ``name:prefix=value``.
* A selector matches a label set when, for every included name, at least one
  included value matches one of the set's values for that name (the value ``""``
  matches any value), and for no excluded name does an excluded value match.
* ``LabelSelector.parse`` accepts exactly Gazette's selector grammar (see
  ``parse``) and ``parse(s.format()) == s`` for every valid selector ``s``.
* Meta-labels are not stored in specs but are implied for matching: a journal
  has ``name`` (its name) and ``prefix`` (each ``/``-terminated prefix of its
  name); a shard has ``id``. Specs may not declare them.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from gazette.errors import ValidationError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "CONTENT_TYPE",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "CONTENT_TYPE_RECOVERY_LOG",
    "INSTANCE",
    "MANAGED_BY",
    "MAX_LABEL_LEN",
    "MAX_LABEL_VALUE_LEN",
    "MESSAGE_SUB_TYPE",
    "MESSAGE_TYPE",
    "META_ID",
    "META_NAME",
    "META_PREFIX",
    "MIN_LABEL_LEN",
    "PATH_SYMBOLS",
    "PREFIX_SUFFIX",
    "REGION",
    "SINGLE_VALUE_LABELS",
    "TAG",
    "TOKEN_SYMBOLS",
    "Label",
    "LabelSelector",
    "LabelSet",
    "SelectorError",
    "validate_label",
    "validate_label_set",
    "validate_single_value_labels",
    "validate_token",
    "with_meta_labels",
    "with_shard_meta_labels",
]

# --- Well-known label names and values (Gazette's `labels` package). ---

#: Media type of a journal's content (RFC 1521); single-valued.
CONTENT_TYPE = "content-type"
#: RFC 4180 comma-separated values.
CONTENT_TYPE_CSV = "text/csv"
#: Newline-delimited JSON messages.
CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
#: Protobuf messages behind a fixed 8-byte header (magic word, little-endian length).
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"
#: A shard recovery log; journals serving as recovery logs must carry it.
CONTENT_TYPE_RECOVERY_LOG = "application/x-gazette-recoverylog"
#: Type of the journal's messages; single-valued, and requires CONTENT_TYPE.
MESSAGE_TYPE = "app.gazette.dev/message-type"
#: Sub-type of a union MESSAGE_TYPE; single-valued, and requires MESSAGE_TYPE.
MESSAGE_SUB_TYPE = "app.gazette.dev/message-subtype"
#: User-defined tags; may repeat.
TAG = "app.gazette.dev/tag"
#: Tool or process managing the spec; single-valued.
MANAGED_BY = "app.gazette.dev/managed-by"
#: Application release the spec belongs to; single-valued.
INSTANCE = "app.gazette.dev/instance"
#: Geographic region of the journal; single-valued.
REGION = "app.gazette.dev/region"

#: Names which may carry at most one value within a spec.
SINGLE_VALUE_LABELS: frozenset[str] = frozenset(
    {CONTENT_TYPE, INSTANCE, MANAGED_BY, MESSAGE_SUB_TYPE, MESSAGE_TYPE, REGION}
)

#: Meta-label: a journal's exact name.
META_NAME = "name"
#: Meta-label: each '/'-terminated prefix of a journal's name.
META_PREFIX = "prefix"
#: Meta-label: a shard's id.
META_ID = "id"
#: Suffix of a selector label name asking for prefix matching of its values.
PREFIX_SUFFIX = ":prefix"

#: Symbols allowed in tokens besides letters and numbers. Every one sorts after '#',
#: the allocator's key separator, which tokens must therefore never contain.
TOKEN_SYMBOLS = "-_+/."
#: Symbols allowed in path components and label values.
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"

MIN_LABEL_LEN, MAX_LABEL_LEN = 2, 64
MAX_LABEL_VALUE_LEN = 1024


# --- Tokens. ---


@functools.lru_cache(maxsize=8)
def _ascii_token_re(symbols: str) -> re.Pattern[str]:
    return re.compile("[A-Za-z0-9" + re.escape(symbols) + "]*")


def _is_token(s: str, symbols: str) -> bool:
    if s.isascii():  # The common case, checked by one C-level regex match.
        return _ascii_token_re(symbols).fullmatch(s) is not None
    return all(c in symbols or unicodedata.category(c)[0] in "LN" for c in s)


def validate_token(s: str, symbols: str, min_len: int, max_len: int, field: str = "") -> None:
    """Require ``s`` to be ``min_len..max_len`` UTF-8 bytes of letters, numbers and ``symbols``.

    Raises ``ValidationError`` on ``field``.
    """
    n = len(s) if s.isascii() else len(s.encode())
    if n < min_len or n > max_len:
        raise ValidationError(
            field, f"invalid length ({n}; expected {min_len} <= length <= {max_len})"
        )
    if not _is_token(s, symbols):
        raise ValidationError(field, f"not a valid token ({s})")


# --- Labels. ---


class Label(NamedTuple):
    """One label; ``prefix`` (selectors only) matches values which start with ``value``."""

    name: str
    value: str
    prefix: bool = False


class _LabelLike(Protocol):
    """``Label`` or ``protocol.Label``."""

    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def prefix(self) -> bool: ...


class _LabelSetLike(Protocol):
    @property
    def labels(self) -> Sequence[_LabelLike]: ...


def validate_label(label: _LabelLike, allow_prefix: bool = False) -> None:
    """Check one label's name, value and prefix flag; fields are ``name``/``value``/``prefix``."""
    validate_token(label.name, TOKEN_SYMBOLS, MIN_LABEL_LEN, MAX_LABEL_LEN, "name")
    validate_token(label.value, PATH_SYMBOLS, 0, MAX_LABEL_VALUE_LEN, "value")
    if label.prefix and not allow_prefix:
        raise ValidationError("prefix", "prefix may not be set outside of a label selector")


def validate_label_set(labels: _LabelSetLike, allow_prefix: bool = False) -> None:
    """Check a (received) label set: each label valid, strictly sorted by (name, value),
    and no name with both an empty and a non-empty value. Fields are ``labels[i]...``.
    """
    seq = labels.labels
    for i, label in enumerate(seq):
        try:
            validate_label(label, allow_prefix)
        except ValidationError as err:
            raise err.add_parent(f"labels[{i}]") from None
        if i == 0:
            continue
        prev = seq[i - 1]
        if prev.name < label.name:
            continue
        if prev.name > label.name:
            raise ValidationError(
                f"labels[{i}]",
                f"labels not in unique, sorted order (index {i}; "
                f"label name {label.name} <= {prev.name})",
            )
        if prev.value >= label.value:
            raise ValidationError(
                f"labels[{i}]",
                f"labels not in unique, sorted order (index {i}; "
                f"label {label.name} value {label.value} <= {prev.value})",
            )
        if prev.value == "":
            raise ValidationError(
                f"labels[{i}]",
                f"label has empty & non-empty values (index {i}; "
                f"label {label.name} value {label.value})",
            )


def validate_single_value_labels(labels: _LabelSetLike) -> None:
    """Refuse a second value of any name in ``SINGLE_VALUE_LABELS``; field ``labels[i]``."""
    seq = labels.labels
    for i in range(1, len(seq)):
        label = seq[i]
        if seq[i - 1].name == label.name and label.name in SINGLE_VALUE_LABELS:
            raise ValidationError(
                f"labels[{i}]",
                f"expected single-value label has multiple values (index {i}; "
                f"label {label.name} value {label.value})",
            )


def _split_prefix(name: str) -> tuple[str, bool]:
    if name.endswith(PREFIX_SUFFIX):
        return name[: -len(PREFIX_SUFFIX)], True
    return name, False


# --- Label sets. ---


class LabelSet:
    """An immutable multi-map of labels, sorted by ``(name, value, prefix)``.

    Built from ``Label``s or ``(name, value)`` pairs; a pair whose name ends in
    ``:prefix`` yields a prefix label (meaningful only in selectors). Operations
    return new sets.
    """

    __slots__ = ("_labels", "_groups", "_hash")

    def __init__(self, labels: Iterable[Label | tuple[str, str]] = ()) -> None:
        out: set[Label] = set()
        for item in labels:
            if isinstance(item, Label):
                out.add(item)
            else:
                name, prefix = _split_prefix(item[0])
                out.add(Label(name, item[1], prefix))
        self._labels: tuple[Label, ...] = tuple(sorted(out))
        self._groups: dict[str, tuple[Label, ...]] | None = None
        self._hash: int | None = None

    # Constructors and conversions.

    @classmethod
    def of(cls, *name_values: str) -> LabelSet:
        """``LabelSet.of("a", "1", "b", "2")``: alternating names and values."""
        if len(name_values) % 2:
            raise ValueError("expected an even number of name/value arguments")
        it = iter(name_values)
        return cls(zip(it, it, strict=True))

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]]) -> LabelSet:
        return cls(pairs)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str | Iterable[str]]) -> LabelSet:
        """From ``{name: value}`` or ``{name: [values...]}``."""
        pairs: list[tuple[str, str]] = []
        for name, vals in mapping.items():
            if isinstance(vals, str):
                pairs.append((name, vals))
            else:
                pairs.extend((name, v) for v in vals)
        return cls(pairs)

    @classmethod
    def from_proto(cls, msg: pb.LabelSet) -> LabelSet:
        return cls(Label(lb.name, lb.value, lb.prefix) for lb in msg.labels)

    def to_proto(self) -> pb.LabelSet:
        return pb.LabelSet(
            labels=[pb.Label(name=lb.name, value=lb.value, prefix=lb.prefix) for lb in self._labels]
        )

    # Container protocol.

    @property
    def labels(self) -> tuple[Label, ...]:
        return self._labels

    def __iter__(self) -> Iterator[Label]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __bool__(self) -> bool:
        return bool(self._labels)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelSet):
            return NotImplemented
        return self._labels == other._labels

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._labels)
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{lb.name}{PREFIX_SUFFIX if lb.prefix else ''}={lb.value!r}" for lb in self._labels
        )
        return f"LabelSet({inner})"

    def _by_name(self) -> dict[str, tuple[Label, ...]]:
        if self._groups is None:
            groups: dict[str, list[Label]] = {}
            for lb in self._labels:
                groups.setdefault(lb.name, []).append(lb)
            self._groups = {k: tuple(v) for k, v in groups.items()}
        return self._groups

    # Queries.

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name())

    def values_of(self, name: str) -> tuple[str, ...]:
        """All values of ``name`` in sorted order; ``()`` if absent."""
        return tuple(lb.value for lb in self._by_name().get(name, ()))

    def value_of(self, name: str) -> str | None:
        """The first value of ``name``, or None if absent (``""`` is a present value)."""
        group = self._by_name().get(name)
        return group[0].value if group else None

    # Derivations, each returning a new set.

    def add(self, name: str, value: str) -> LabelSet:
        """Add a value of ``name``, keeping its other values."""
        return LabelSet((*self._labels, (name, value)))

    def set(self, name: str, value: str) -> LabelSet:
        """Replace all values of ``name`` with ``value``."""
        bare, _ = _split_prefix(name)
        return LabelSet((*(lb for lb in self._labels if lb.name != bare), (name, value)))

    def remove(self, name: str) -> LabelSet:
        """Drop every value of ``name``."""
        return LabelSet(lb for lb in self._labels if lb.name != name)

    def assign(self, other: LabelSet | None) -> LabelSet:
        """Gazette's ``Assign``: the result holds exactly ``other``'s labels (none if None)."""
        return other if other is not None else LabelSet()

    def union(self, other: LabelSet) -> LabelSet:
        """Names of either set; where both have a name, this set's values win."""
        mine = self._by_name()
        return LabelSet((*self._labels, *(lb for lb in other._labels if lb.name not in mine)))

    def intersect(self, other: LabelSet) -> LabelSet:
        """Names whose values are identical in both sets."""
        theirs = other._by_name()
        return LabelSet(
            lb
            for name, group in self._by_name().items()
            if _same_values(group, theirs.get(name, ()))
            for lb in group
        )

    def subtract(self, other: LabelSet) -> LabelSet:
        """This set's names, less those whose values are identical in ``other``."""
        theirs = other._by_name()
        return LabelSet(
            lb
            for name, group in self._by_name().items()
            if not _same_values(group, theirs.get(name, ()))
            for lb in group
        )

    def validate(self, allow_prefix: bool = False) -> None:
        """Raise ``ValidationError`` unless every label is valid (see ``validate_label_set``)."""
        validate_label_set(self, allow_prefix)


def _same_values(a: Sequence[Label], b: Sequence[Label]) -> bool:
    # Gazette compares value lists only; prefix flags do not take part.
    return len(a) == len(b) and all(x.value == y.value for x, y in zip(a, b, strict=True))


def _journal_prefixes(name: str) -> Iterator[str]:
    i = name.find("/")
    while i != -1:
        yield name[: i + 1]
        i = name.find("/", i + 1)


def with_meta_labels(labels: LabelSet, name: str) -> LabelSet:
    """A journal's labels plus its meta-labels: ``name=<name>`` and ``prefix=<p>`` for
    each ``/``-terminated prefix ``p`` of the name. Meta-labels replace same-named
    labels (which valid journal specs never have).
    """
    meta = LabelSet([(META_NAME, name), *((META_PREFIX, p) for p in _journal_prefixes(name))])
    return meta.union(labels)


def with_shard_meta_labels(labels: LabelSet, shard_id: str) -> LabelSet:
    """A shard's labels plus its meta-label ``id=<shard_id>``."""
    return LabelSet([(META_ID, shard_id)]).union(labels)


# --- Selectors. ---


class SelectorError(ValidationError):
    """A label selector's text does not parse or does not validate.

    ``position`` is the 0-based character index at which parsing failed (``None`` for
    errors found after parsing) and ``expected`` what would have been accepted there.
    """

    def __init__(self, text: str, position: int | None, expected: str, rule: str = "") -> None:
        if position is None:
            message = f'selector "{text}": {rule}'
        else:
            where = "end of selector" if position >= len(text) else repr(text[position])
            message = f'selector "{text}": at position {position} ({where}): expected {expected}'
        super().__init__("", message)
        self.text = text
        self.position = position
        self.expected = expected


def _match_values(sel: Sequence[Label], values: tuple[str, ...]) -> bool:
    if not values:
        return False
    for lb in sel:
        if lb.value == "":
            return True  # An empty selector value matches any value of the name.
        if lb.prefix:
            if any(v.startswith(lb.value) for v in values):
                return True
        elif lb.value in values:
            return True
    return False


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Labels to require (``include``) and to refuse (``exclude``)."""

    include: LabelSet = field(default_factory=LabelSet)
    exclude: LabelSet = field(default_factory=LabelSet)

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse Gazette's selector syntax: comma-separated expressions, each one of

        ``k=v`` (or ``k==v``), ``k!=v``, ``k in (a,b)``, ``k notin (a,b)`` /
        ``k not in (a,b)``, ``k`` (present) and ``!k`` (absent). Names may end in
        ``:prefix`` to match values by prefix. A single optional space is allowed
        around operators, after commas and around set values; a trailing comma is
        accepted. Raises ``SelectorError``.
        """
        include: list[tuple[str, str]] = []
        exclude: list[tuple[str, str]] = []
        parser = _Parser(text)
        while parser.pos < len(text):
            parser.expression(include, exclude)
        sel = cls(LabelSet(include), LabelSet(exclude))
        try:
            sel.validate()
        except ValidationError as err:
            raise SelectorError(text, None, "", str(err)) from None
        return sel

    @classmethod
    def from_proto(cls, msg: pb.LabelSelector) -> LabelSelector:
        return cls(LabelSet.from_proto(msg.include), LabelSet.from_proto(msg.exclude))

    def to_proto(self) -> pb.LabelSelector:
        return pb.LabelSelector(include=self.include.to_proto(), exclude=self.exclude.to_proto())

    def validate(self) -> None:
        """Fields are ``include.labels[i]...`` / ``exclude.labels[i]...``."""
        for name, labels in (("include", self.include), ("exclude", self.exclude)):
            try:
                validate_label_set(labels, allow_prefix=True)
            except ValidationError as err:
                raise err.add_parent(name) from None

    def matches(self, labels: LabelSet) -> bool:
        """Whether ``labels`` (augmented with meta-labels by the caller) is selected."""
        for name, group in self.exclude._by_name().items():
            if _match_values(group, labels.values_of(name)):
                return False
        for name, group in self.include._by_name().items():
            if not _match_values(group, labels.values_of(name)):
                return False
        return True

    def expand_prefix_meta(self) -> LabelSelector:
        """Rewrite the ``prefix`` meta-label as a prefix match on ``name``, as Gazette's
        List does: ``prefix=a/`` becomes ``name:prefix=a/``.
        """
        return LabelSelector(_expand_prefix(self.include), _expand_prefix(self.exclude))

    def format(self) -> str:
        """Canonical text: included then excluded names, sorted, values sorted."""
        parts = _format_set(self.include, exclude=False)
        parts.extend(_format_set(self.exclude, exclude=True))
        return ",".join(parts)

    def __str__(self) -> str:
        return self.format()


def _expand_prefix(labels: LabelSet) -> LabelSet:
    values = labels.values_of(META_PREFIX)
    if not values:
        return labels
    return LabelSet(
        (*labels.remove(META_PREFIX).labels, *(Label(META_NAME, v, True) for v in values))
    )


def _format_set(labels: LabelSet, exclude: bool) -> list[str]:
    groups: dict[str, list[str]] = {}
    for lb in labels:
        groups.setdefault(lb.name + (PREFIX_SUFFIX if lb.prefix else ""), []).append(lb.value)
    parts: list[str] = []
    for key in sorted(groups):
        values = sorted(groups[key])
        if len(values) == 1 and values[0] == "":
            parts.append(("!" if exclude else "") + key)
        elif len(values) == 1 and not (values[0].startswith("=") and not exclude):
            parts.append(f"{key}{'!=' if exclude else '='}{values[0]}")
        else:
            # Sets also carry single values starting with '=', as `k==v` would
            # read back as `k == v`.
            parts.append(f"{key} {'notin' if exclude else 'in'} ({','.join(values)})")
    return parts


# Runs of token / path characters. `[^\W_]` is Python's letters-and-numbers class;
# exact Unicode categories are then enforced by validation after parsing.
_TOKEN_RUN = re.compile(r"(?:[^\W_]|[-_+/.])*")
_PATH_RUN = re.compile(r"(?:[^\W_]|[-_+/.=%])*")


class _Parser:
    """Recursive descent over Gazette's regular selector grammar::

        expr   := SP? '!' SP? token end
                | SP? token ( SP? '=' '='? value end
                            | SP? '!=' value end
                            | ' in' set end
                            | ' not' SP? 'in' set end
                            | end )
        token  := tokenchar{2,} ':prefix'?
        value  := SP? pathchar*
        set    := SP? '(' (value SP? (',' | ')'))+      -- content must be non-empty
        end    := SP? (',' | end of text)

    where every ``SP?`` is at most one space.
    """

    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, expected: str, at: int | None = None) -> SelectorError:
        return SelectorError(self.text, self.pos if at is None else at, expected)

    def space(self) -> bool:
        if self.text.startswith(" ", self.pos):
            self.pos += 1
            return True
        return False

    def token(self) -> str:
        m = _TOKEN_RUN.match(self.text, self.pos)
        assert m is not None  # The pattern matches the empty string.
        if m.end() - self.pos < 2:
            raise self.fail('a label name (2 or more letters, digits or "-_+/.")')
        self.pos = m.end()
        if self.text.startswith(PREFIX_SUFFIX, self.pos):
            self.pos += len(PREFIX_SUFFIX)
        return self.text[m.start() : self.pos]

    def value(self) -> str:
        self.space()
        m = _PATH_RUN.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()
        return m.group()

    def end(self, expected: str = '"," or end of selector', space: bool = True) -> None:
        if space:
            self.space()
        if self.pos == len(self.text):
            return
        if self.text[self.pos] != ",":
            raise self.fail(expected)
        self.pos += 1

    def set_values(self) -> list[str]:
        self.space()
        if not self.text.startswith("(", self.pos):
            raise self.fail('"("')
        close = self.text.find(")", self.pos + 1)
        if close == -1:
            raise self.fail('")"', at=len(self.text))
        self.pos += 1
        if self.pos == close:
            raise self.fail("a set value")
        values: list[str] = []
        while self.pos < close:
            values.append(self.value())
            self.space()
            if self.pos == close:
                break
            if self.text[self.pos] != ",":
                raise self.fail('"," or ")"')
            self.pos += 1
        self.pos = close + 1
        return values

    def expression(self, include: list[tuple[str, str]], exclude: list[tuple[str, str]]) -> None:
        text = self.text
        self.space()
        if text.startswith("!", self.pos):
            self.pos += 1
            self.space()
            exclude.append((self.token(), ""))
            self.end()
            return
        name = self.token()
        spaced = self.space()
        if text.startswith("!=", self.pos):
            self.pos += 2
            exclude.append((name, self.value()))
            self.end()
        elif text.startswith("=", self.pos):
            self.pos += 2 if text.startswith("==", self.pos) else 1
            include.append((name, self.value()))
            self.end()
        elif spaced and text.startswith("in", self.pos):
            self.pos += 2
            include.extend((name, v) for v in self.set_values())
            self.end()
        elif spaced and text.startswith("not", self.pos):
            self.pos += 3
            self.space()
            if not text.startswith("in", self.pos):
                raise self.fail('"in"')
            self.pos += 2
            exclude.extend((name, v) for v in self.set_values())
            self.end()
        else:
            include.append((name, ""))
            # The one optional space before "," was taken above.
            self.end('"=", "!=", " in (", " not in (", "," or end of selector', space=not spaced)

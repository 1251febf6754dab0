"""The allocator's key layout in etcd, shared by brokers and consumers, as Gazette's.

Under a root prefix: ``{root}/items/{name}`` (a JournalSpec or ShardSpec),
``{root}/members/{zone}#{suffix}`` (a BrokerSpec or ConsumerSpec, under the member's lease) and
``{root}/assign/{item}#{zone}#{suffix}#{slot}`` (one replica assignment; slot 0 is the primary).
Builders and parsers of those keys, and :func:`layout_decoder`, the shape of the value decoder
both key spaces use (``gazette.broker.keys``, ``gazette.consumer.keys``).

Invariants:

* Separators are '#', and every key component consists only of characters above '#', so key
  order agrees with the natural order of the entities (all assignments of an item are
  contiguous, in member then slot order).
* Builders accept empty components (``items_key(root, "")`` is the items prefix), parsers never.
* A decoded spec agrees with its key (name or member ID), or it is refused with a
  ``DecodeError`` naming the key: the keyspace then keeps the last good value.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gazette.etcd.keyspace import DecodeError, Decoder, KeyLayoutError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "ASSIGN",
    "ITEMS",
    "MEMBERS",
    "SEP",
    "AssignmentKey",
    "KeyKind",
    "assignment_key",
    "assignments_prefix",
    "check_component",
    "item_assignments_prefix",
    "items_key",
    "items_prefix",
    "key_kind",
    "layout_decoder",
    "members_key",
    "members_prefix",
    "parse_assignment_key",
    "parse_item_key",
    "parse_member_key",
    "parse_message",
]

SEP = "#"
ITEMS = "items"
MEMBERS = "members"
ASSIGN = "assign"

_SLOT_RE = re.compile(r"[0-9]+")


class KeyKind(enum.Enum):
    ITEM = ITEMS
    MEMBER = MEMBERS
    ASSIGNMENT = ASSIGN


@dataclass(frozen=True, slots=True)
class AssignmentKey:
    """The parts of an assignment key: which item, which member, which slot."""

    item: str
    zone: str
    suffix: str
    slot: int


def check_component(what: str, value: str, *, allow_empty: bool = False) -> str:
    """Returns `value` if it is a valid key component: all characters above '#', and non-empty
    unless `allow_empty` (builders allow it, as Gazette's do: `items_key(root, "")` is the
    items prefix; parsers never do)."""
    if not value:
        if allow_empty:
            return value
        raise KeyLayoutError(f"{what} must not be empty")
    if min(value) <= SEP:
        bad = next(c for c in value if c <= SEP)
        raise KeyLayoutError(
            f"{what} {value!r} has character {bad!r}; components allow only characters above '#'"
        )
    return value


def items_prefix(root: str) -> str:
    return f"{root}/{ITEMS}/"


def members_prefix(root: str) -> str:
    return f"{root}/{MEMBERS}/"


def assignments_prefix(root: str) -> str:
    return f"{root}/{ASSIGN}/"


def items_key(root: str, name: str) -> str:
    """`{root}/items/{name}`: where a journal's or shard's spec lives."""
    return items_prefix(root) + check_component("item name", name, allow_empty=True)


def members_key(root: str, zone: str, suffix: str) -> str:
    """`{root}/members/{zone}#{suffix}`: where a broker's or consumer's spec lives."""
    return (
        members_prefix(root)
        + check_component("member zone", zone, allow_empty=True)
        + SEP
        + check_component("member suffix", suffix, allow_empty=True)
    )


def item_assignments_prefix(root: str, item: str) -> str:
    """`{root}/assign/{item}#`: the prefix of all assignments of one item."""
    return assignments_prefix(root) + check_component("item name", item, allow_empty=True) + SEP


def assignment_key(root: str, item: str, zone: str, suffix: str, slot: int) -> str:
    """`{root}/assign/{item}#{zone}#{suffix}#{slot}`: one replica assignment."""
    if slot < 0:
        raise KeyLayoutError(f"assignment slot {slot} must not be negative")
    return (
        item_assignments_prefix(root, item)
        + check_component("member zone", zone, allow_empty=True)
        + SEP
        + check_component("member suffix", suffix, allow_empty=True)
        + SEP
        + str(slot)
    )


_KIND_OF = {kind.value: kind for kind in KeyKind}  # a dict: this runs per watched key


def key_kind(root: str, key: str) -> KeyKind:
    """Which part of the layout `key` (under `root`) belongs to."""
    n = len(root) + 1
    if key.startswith(root) and key.startswith("/", len(root)):
        slash = key.find("/", n)
        kind = _KIND_OF.get(key[n:slash]) if slash > 0 else None
        if kind is not None:
            return kind
    raise KeyLayoutError(f"key {key!r} is not under {root}/items/, /members/ or /assign/")


def _tail(root: str, key: str, kind: KeyKind) -> str:
    prefix = f"{root}/{kind.value}/"
    if not key.startswith(prefix):
        raise KeyLayoutError(f"key {key!r} does not start with {prefix!r}")
    return key[len(prefix):]


def parse_item_key(root: str, key: str) -> str:
    """The item name of an items key."""
    return check_component("item name", _tail(root, key, KeyKind.ITEM))


def parse_member_key(root: str, key: str) -> tuple[str, str]:
    """The (zone, suffix) of a members key."""
    parts = _tail(root, key, KeyKind.MEMBER).split(SEP)
    if len(parts) != 2:
        raise KeyLayoutError(f"member key {key!r} must end in zone#suffix")
    return check_component("member zone", parts[0]), check_component("member suffix", parts[1])


def parse_assignment_key(root: str, key: str) -> AssignmentKey:
    """The item, member and slot of an assignment key."""
    parts = _tail(root, key, KeyKind.ASSIGNMENT).split(SEP)
    if len(parts) != 4:
        raise KeyLayoutError(f"assignment key {key!r} must end in item#zone#suffix#slot")
    item, zone, suffix, slot = parts
    if not _SLOT_RE.fullmatch(slot):
        raise KeyLayoutError(f"assignment key {key!r} has slot {slot!r}, not a decimal number")
    return AssignmentKey(
        check_component("item name", item),
        check_component("member zone", zone),
        check_component("member suffix", suffix),
        int(slot),
    )


def split_assignment_key(key: str, prefix_len: int) -> AssignmentKey:
    """The parts of an assignment key that a keyspace's decoder has already validated (with
    ``parse_assignment_key``), split without checking again: ``prefix_len`` is the length of
    the root's ``assignments_prefix``. For loops over every assignment of a keyspace."""
    item, zone, suffix, slot = key[prefix_len:].split(SEP)
    return AssignmentKey(item, zone, suffix, int(slot))


def parse_message(message_type: Any, key: str, raw: bytes) -> Any:
    """``raw`` decoded as ``message_type``, or a DecodeError naming the key."""
    try:
        return message_type.FromString(raw)
    except Exception as err:  # protobuf raises its own DecodeError; keep one error type
        raise DecodeError(f"{key}: not a valid {message_type.__name__}: {err}") from err


def layout_decoder(
    root: str,
    *,
    item_type: Any,
    item_field: str,
    member_type: Any,
    assignment: Callable[[str, bytes], Any],
) -> Decoder:
    """A decoder of one key space: items are ``item_type`` whose ``item_field`` (``name``,
    ``id``) must equal the key's, members ``member_type`` whose ``process_spec.id`` must equal the key's, and
    assignments whatever ``assignment(key, raw)`` returns."""
    item_what, member_what = item_type.__name__, member_type.__name__

    def decode(key: str, raw: bytes) -> Any:
        kind = key_kind(root, key)
        if kind is KeyKind.ITEM:
            name = parse_item_key(root, key)
            spec = parse_message(item_type, key, raw)
            if getattr(spec, item_field) != name:
                raise DecodeError(
                    f"{key}: {item_what} {item_field} {getattr(spec, item_field)!r} differs from key")
            return spec
        if kind is KeyKind.MEMBER:
            zone, suffix = parse_member_key(root, key)
            member = parse_message(member_type, key, raw)
            _check_process_id(key, member_what, member.process_spec.id, zone, suffix)
            return member
        parse_assignment_key(root, key)
        return assignment(key, raw)

    return decode


def _check_process_id(key: str, what: str, pid: pb.ProcessSpec.ID, zone: str, suffix: str) -> None:
    if pid.zone != zone or pid.suffix != suffix:
        raise DecodeError(
            f"{key}: {what} id {pid.zone}#{pid.suffix} differs from key ({zone}#{suffix})"
        )

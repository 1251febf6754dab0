"""Mapping messages to journals: random, modulo and rendezvous (HRW) selection.

A mapping function takes a message and returns ``(journal, content_type)``: the journal to
append it to, and the content-type label of that journal (which names its Framing). The
candidate journals come from a *partitions* callable returning the current
``protocol.ListResponse`` of a topic's journals (typically a polled List RPC); it should
return the same object until the listing changes, which lets mappings reuse what they
derived from it.

Invariants (as in Gazette, so Python and Go publishers agree on where a key goes):

* Keys and journal names are hashed with 32-bit FNV-1a.
* ``modulo_mapping`` picks ``journals[fnv1a(key) % len(journals)]``.
* ``rendezvous_mapping`` picks the journal maximising ``fnv1a(key) ^ fnv1a(name)``, the
  first one on ties, and index 0 if every weight is 0; adding or removing a journal only
  moves the keys that hash to it.
* An empty listing raises :class:`~gazette.message.errors.EmptyListResponseError`.
* A mapping returns the same ``(journal, content_type)`` tuple object for every message it
  maps to one journal of one listing; the keyed mappings remember each key's target per
  listing (a bounded memo), so a repeated key costs one dict lookup.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any, Final

from gazette.protocol import protocol_pb2 as pb

from .errors import EmptyListResponseError
from .framing import CONTENT_TYPE

__all__ = [
    "MEMO_LIMIT",
    "KeyFunc",
    "MappingFunc",
    "PartitionsFunc",
    "fnv1a_32",
    "modulo_mapping",
    "random_mapping",
    "rendezvous_mapping",
]

#: Maps a message to ``(journal, content_type)``.
MappingFunc = Callable[[Any], tuple[str, str]]
#: Extracts the mapping key of a message.
KeyFunc = Callable[[Any], bytes]
#: Returns the current listing of candidate journals.
PartitionsFunc = Callable[[], pb.ListResponse]

_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193


@functools.lru_cache(maxsize=8192)
def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a of ``data``.

    A byte loop, but over short keys, and cached: mapping keys (session ids, user ids)
    repeat, and journal names are hashed once per listing.
    """
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def _content_type(spec: pb.JournalSpec) -> str:
    for label in spec.labels.labels:
        if label.name == CONTENT_TYPE:
            return label.value
    return ""


class _Listing:
    """What a mapping derives from one ListResponse, rebuilt only when it changes."""

    __slots__ = ("hashes", "names", "response", "targets")

    def __init__(self, response: pb.ListResponse) -> None:
        self.response = response
        specs = [j.spec for j in response.journals]
        self.names = [s.name for s in specs]
        #: ``(journal, content_type)`` of each journal: the very tuples mappings return.
        self.targets = [(s.name, _content_type(s)) for s in specs]
        self.hashes = [fnv1a_32(n.encode()) for n in self.names]


_EMPTY: Final = "no journals to map to: the partitions list is empty"

#: Keys remembered per listing by the keyed mappings before the memo starts over.
MEMO_LIMIT: Final = 1 << 14


def random_mapping(partitions: PartitionsFunc) -> MappingFunc:
    """Map each message to a journal of ``partitions`` chosen at random."""
    listing: _Listing | None = None

    def mapping(msg: Any) -> tuple[str, str]:
        nonlocal listing
        response = partitions()
        if listing is None or listing.response is not response:
            listing = _Listing(response)
        targets = listing.targets
        if not targets:
            raise EmptyListResponseError(_EMPTY)
        return targets[random.randrange(len(targets))]

    return mapping


def _keyed(
    key: KeyFunc, partitions: PartitionsFunc, pick: Callable[[_Listing, int], int]
) -> MappingFunc:
    """A mapping by ``pick(listing, fnv1a_32(key))``, remembered per key.

    The target of a key is a pure function of the key and the listing, so it is kept in a
    memo (dropped when the listing changes, and when it grows past MEMO_LIMIT keys): keys
    repeat, and a publish then costs the key function and one dict lookup.
    """
    listing: _Listing | None = None
    memo: dict[bytes, tuple[str, str]] = {}

    def mapping(msg: Any) -> tuple[str, str]:
        nonlocal listing, memo
        response = partitions()
        if listing is None or listing.response is not response:
            listing, memo = _Listing(response), {}
        if not listing.targets:
            raise EmptyListResponseError(_EMPTY)
        k = key(msg)
        target = memo.get(k)
        if target is None:
            target = listing.targets[pick(listing, fnv1a_32(k))]
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            memo[k] = target
        return target

    return mapping


def _modulo(listing: _Listing, h: int) -> int:
    return h % len(listing.targets)


def _rendezvous(listing: _Listing, h: int) -> int:
    best, best_weight = 0, 0
    for i, journal_hash in enumerate(listing.hashes):
        weight = h ^ journal_hash
        if weight > best_weight:
            best, best_weight = i, weight
    return best


def modulo_mapping(key: KeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Map messages of equal key to the same journal, by FNV-1a modulo the journal count."""
    return _keyed(key, partitions, _modulo)


def rendezvous_mapping(key: KeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Map messages of equal key to the same journal by highest-random-weight hashing.

    Costs a pass over the journals per new key, but changes of the listing move few keys.
    """
    return _keyed(key, partitions, _rendezvous)

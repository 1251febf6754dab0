"""HPACK (RFC 7541) header block decoding, linear in the block and bounded.

The ``hpack`` package's decoder copies the rest of the block for every literal field it
reads (``memoryview.tobytes()`` and slices), so a block of many small fields costs time
quadratic in its size: a 1 MiB block of tiny literals held the event loop for seconds. This
decoder walks the block once by offset; each field costs a constant plus its own bytes
(Huffman strings are decoded by ``hpack``'s table-driven decoder, linear in the string).

Invariants:

* :meth:`HeaderDecoder.decode` costs O(len(block)) and never allocates more than the block's
  size plus the dynamic table, whatever the block holds: fields beyond ``max_list`` (RFC 7541
  size: name + value + 32 each) are decoded, to keep the HPACK state, but not kept, and the
  result says the list was over.
* The dynamic table never holds more than ``max_table`` (what we advertise as
  SETTINGS_HEADER_TABLE_SIZE: 4096, the default) octets by RFC 7541's count, and a size
  update above it is an error.
* Any malformed block raises :class:`HpackError` (a connection error, COMPRESSION_ERROR:
  the HPACK state is then unknown, RFC 9113 4.3).
"""

from __future__ import annotations

import collections

from hpack import HPACKError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from gazette.errors import GazetteError

_STATIC: tuple[tuple[str, str], ...] = tuple((n.decode(), v.decode()) for n, v in HeaderTable.STATIC_TABLE)
_NSTATIC = len(_STATIC)
_INT_BYTES = 4  # continuation bytes of an integer (values < 2^28 + prefix): more is an attack


class HpackError(GazetteError):
    """A malformed header block: the connection's HPACK state is lost."""


class HeaderDecoder:
    """One connection's receiving HPACK context."""

    __slots__ = ("max_table", "max_list", "_table", "_size", "_limit")

    def __init__(self, max_table: int = 4096, max_list: int = 16 << 10) -> None:
        self.max_table = max_table  # what the peer may set the table to (our setting)
        self.max_list = max_list
        self._table: collections.deque[tuple[str, str, int]] = collections.deque()
        self._size = 0
        self._limit = max_table     # the table's current maximum (the peer's last update)

    @property
    def table_empty(self) -> bool:
        return not self._table

    @property
    def table_octets(self) -> int:
        return self._size

    def decode(self, block: bytes) -> tuple[list[tuple[str, str]], bool]:
        """The header list of ``block``, and whether it was over ``max_list`` (then the list
        is cut short, though the whole block was decoded)."""
        out: list[tuple[str, str]] = []
        size, over, fields = 0, False, False
        n = len(block)
        pos = 0
        while pos < n:
            b = block[pos]
            if b & 0x80:  # indexed field (the common case first, its index in one byte)
                index = b & 0x7F
                if index == 0x7F:
                    index, pos = _integer(block, pos, 0x7F)
                else:
                    pos += 1
                name, value = self._field(index)
            elif b & 0xE0 == 0x20:  # dynamic table size update: before any field only
                if fields:
                    raise HpackError("table size update after a header field")
                limit, pos = _integer(block, pos, 0x1F)
                if limit > self.max_table:
                    raise HpackError(f"table size update to {limit} over {self.max_table}")
                self._limit = limit
                self._evict(0)
                continue
            else:
                indexing = bool(b & 0x40)
                index, pos = _integer(block, pos, 0x3F if indexing else 0x0F)
                if over and not indexing:
                    # Nobody reads it and it changes no state: its strings are not decoded.
                    if index == 0:
                        pos = _skip_string(block, pos)
                    else:
                        self._field(index)
                    pos = _skip_string(block, pos)
                    continue
                name, pos = _string(block, pos) if index == 0 else (self._field(index)[0], pos)
                value, pos = _string(block, pos)
                if indexing:
                    self._add(name, value)
            fields = True
            if not over:
                size += _octets(name) + _octets(value) + 32
                if size > self.max_list:
                    over = True
                else:
                    out.append((name, value))
        return out, over

    def _field(self, index: int) -> tuple[str, str]:
        if 0 < index <= _NSTATIC:
            return _STATIC[index - 1]
        i = index - _NSTATIC - 1
        if index == 0 or i >= len(self._table):
            raise HpackError(f"header table index {index} out of range")
        entry = self._table[i]
        return entry[0], entry[1]

    def _add(self, name: str, value: str) -> None:
        # RFC 7541 4.4: an entry larger than the table empties it and is not added.
        entry = _octets(name) + _octets(value) + 32
        self._evict(entry)
        if entry <= self._limit:
            self._table.appendleft((name, value, entry))
            self._size += entry

    def _evict(self, room: int) -> None:
        while self._table and self._size + room > self._limit:
            self._size -= self._table.pop()[2]


def _integer(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    for _ in range(_INT_BYTES):
        if pos >= len(block):
            raise HpackError("truncated integer")
        b = block[pos]
        pos += 1
        value += (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise HpackError("integer too long")


def _octets(text: str) -> int:
    """RFC 7541 counts octets (UTF-8); ``isascii`` is O(1) in CPython."""
    return len(text) if text.isascii() else len(text.encode())


def _skip_string(block: bytes, pos: int) -> int:
    if pos >= len(block):
        raise HpackError("truncated string")
    length, pos = _integer(block, pos, 0x7F)
    if pos + length > len(block):
        raise HpackError("truncated string")
    return pos + length


def _string(block: bytes, pos: int) -> tuple[str, int]:
    if pos >= len(block):
        raise HpackError("truncated string")
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 0x7F)
    end = pos + length
    if end > len(block):
        raise HpackError("truncated string")
    raw = block[pos:end]
    try:
        if huffman:
            raw = decode_huffman(raw)
        return raw.decode(), end
    except (HPACKError, UnicodeDecodeError) as err:
        raise HpackError(f"bad header string: {err}") from err

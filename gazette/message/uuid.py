"""Message UUIDs: RFC 4122 version-1 UUIDs carrying a producer, a clock and flags.

Layout (byte offsets of the 16-byte UUID, big-endian fields), identical to Gazette's:

* ``[0:4]``   low 32 bits of the 60-bit timestamp (``clock >> 4``);
* ``[4:6]``   middle 16 bits of the timestamp;
* ``[6:8]``   high 12 bits of the timestamp, OR'd with the version nibble ``0x1000``;
* ``[8:10]``  the RFC 4122 clock-sequence field: variant bits ``0b10`` (2 MSBs), then the
  4-bit sequence counter (the 4 LSBs of a :class:`Clock`), then 10 bits of :class:`Flags`;
* ``[10:16]`` the node identifier, which Gazette calls the :class:`ProducerID`.

Invariants:

* A clock value is ``timestamp << 4 | counter`` where ``timestamp`` counts 100 ns intervals
  since 1582-10-15 (the UUID epoch). Clocks of one :class:`Clock` never decrease, and every
  :meth:`Clock.tick` strictly increases it, so the UUIDs of one producer are totally ordered.
* ``get_clock(build_uuid(p, c, f)) == c & (2**64 - 1)`` and the producer and flags round
  trip exactly, for any 6-byte producer and any flags below ``0x400``.
* The all-zero UUID has clock 0: Gazette treats it as "no UUID" (the message opts out of
  exactly-once processing).
"""

from __future__ import annotations

import array
import enum
import os
import sys
import time
import uuid as _uuid
from typing import Final, NamedTuple

# Its own module: a bytes subclass cannot be a compiled (mypyc native) class, and this module is
# compiled (gazette/_compiled.py).
from .producer_id import ProducerID

__all__ = [
    "ACK_TXN",
    "CONTINUE_TXN",
    "OUTSIDE_TXN",
    "UUID",
    "ZERO_UUID",
    "Clock",
    "UUIDColumns",
    "Flags",
    "G1582_NS100",
    "ProducerID",
    "build_uuid",
    "clock_from_time",
    "clock_of_int",
    "clock_of_uuid_int",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "new_producer_id",
    "UUIDWords",
    "uuid_columns",
    "uuid_text",
    "uuid_columns_of_ints",
    "uuid_words",
    "uuid_from_int",
]

UUID = _uuid.UUID
ZERO_UUID: Final = _uuid.UUID(int=0)

# The interval between the UUID epoch (1582-10-15) and the Unix epoch, in 100 ns units.
G1582_NS100: Final = 122192928000000000

# One microsecond in clock units: 10 intervals of 100 ns, shifted past the 4 counter bits.
_TICK: Final = 10 << 4
_U64: Final = (1 << 64) - 1
_U48: Final = (1 << 48) - 1
_FLAGS_MASK: Final = 0x3FF


class Flags(enum.IntFlag):
    """Transaction semantics, held in the 10 low bits of the UUID clock sequence."""

    #: Not part of a transaction: processed as soon as it is read.
    OUTSIDE_TXN = 0x0
    #: Begins or continues a transaction; processed only once a later ACK_TXN commits it.
    CONTINUE_TXN = 0x1
    #: Commits every CONTINUE_TXN of its producer having a smaller clock, and rolls back
    #: those having a larger one.
    ACK_TXN = 0x2


OUTSIDE_TXN: Final = Flags.OUTSIDE_TXN
CONTINUE_TXN: Final = Flags.CONTINUE_TXN
ACK_TXN: Final = Flags.ACK_TXN


def new_producer_id() -> ProducerID:
    """A random ProducerID with the multicast bit set, as RFC 4122 asks of random node ids.

    47 bits of entropy: unique enough provided a producer lives about as long as a process.
    """
    raw = bytearray(os.urandom(6))
    raw[0] |= 0x01
    return ProducerID(bytes(raw))


def _unix_ns_to_ticks(unix_ns: int) -> int:
    # Truncate toward zero, as Go's integer division does, so pre-1970 times agree too.
    ticks = unix_ns // 100 if unix_ns >= 0 else -((-unix_ns) // 100)
    return ticks + G1582_NS100


def clock_from_time(unix_ns: int) -> int:
    """The clock value of a wall time given in nanoseconds since the Unix epoch."""
    return (_unix_ns_to_ticks(unix_ns) << 4) & _U64


def clock_of_int(value: int) -> int:
    """Validate an integer clock value (an unsigned 64-bit integer)."""
    if not 0 <= value <= _U64:
        raise ValueError(f"a clock is an unsigned 64-bit integer, got {value}")
    return value


class Clock:
    """A monotonic clock of UUID timestamps: 60 bits of 100 ns intervals since 1582-10-15,
    followed by a 4-bit sequence counter.

    :meth:`tick` advances by one microsecond (Gazette's step), and :meth:`update` moves the
    clock forward to a wall time, never backward. Not safe for use from several threads;
    within one event loop it needs no lock because neither method suspends.
    """

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = clock_of_int(value)

    @classmethod
    def from_time(cls, unix_ns: int) -> Clock:
        """A Clock at the wall time ``unix_ns`` (nanoseconds since the Unix epoch)."""
        return cls(clock_from_time(unix_ns))

    @classmethod
    def now(cls) -> Clock:
        """A Clock at the current wall time."""
        return cls.from_time(time.time_ns())

    def update(self, unix_ns: int) -> None:
        """Advance to the wall time ``unix_ns`` unless the clock is already past it.

        An update to a new timestamp resets the sequence counter to zero.
        """
        nxt = clock_from_time(unix_ns)
        if nxt > self.value:
            self.value = nxt

    def tick(self) -> int:
        """Advance by one microsecond and return the new clock value."""
        self.value = (self.value + _TICK) & _U64
        return self.value

    def as_time(self) -> int:
        """The wall time of this clock, in nanoseconds since the Unix epoch (100 ns precision)."""
        return ((self.value >> 4) - G1582_NS100) * 100

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Clock):
            return self.value == other.value
        if isinstance(other, int):
            return self.value == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: Clock | int) -> bool:
        return self.value < int(other)

    def __le__(self, other: Clock | int) -> bool:
        return self.value <= int(other)

    def __gt__(self, other: Clock | int) -> bool:
        return self.value > int(other)

    def __ge__(self, other: Clock | int) -> bool:
        return self.value >= int(other)

    def __repr__(self) -> str:
        return f"Clock({self.value})"


def build_uuid(producer: bytes, clock: int, flags: int) -> UUID:
    """Build the version-1 UUID of ``producer`` at ``clock`` carrying ``flags``."""
    if not 0 <= flags <= _FLAGS_MASK:
        raise ValueError(f"flags must fit in 10 bits, got {flags:#x}")
    if len(producer) != 6:
        raise ValueError(f"a producer id is 6 bytes, got {len(producer)}")
    clock = int(clock) & _U64
    time_low = (clock >> 4) & 0xFFFFFFFF
    time_mid = (clock >> 36) & 0xFFFF
    time_hi = ((clock >> 52) & 0xFFFF) | 0x1000
    clock_seq = ((clock << 10) & 0x3C00) | flags | 0x8000
    value = (
        (time_low << 96)
        | (time_mid << 80)
        | ((time_hi & 0xFFFF) << 64)
        | (clock_seq << 48)
        | int.from_bytes(producer, "big")
    )
    return uuid_from_int(value)


_new_object = object.__new__
_set_attr = object.__setattr__


def uuid_from_int(value: int) -> UUID:
    """A UUID of a 128-bit integer, skipping ``uuid.UUID.__init__``'s argument parsing.

    This sits on the read path (once per message), where ``UUID(int=...)`` costs several
    times more than the two attribute stores it amounts to.
    """
    out = _new_object(UUID)
    _set_attr(out, "int", value)
    _set_attr(out, "is_safe", _uuid.SafeUUID.unknown)
    return out


def uuid_text(value: int) -> str:
    """The canonical ``8-4-4-4-12`` lowercase hex text of a UUID given as its 128-bit
    integer: ``str(uuid_from_int(value))``, without building the UUID."""
    h = value.to_bytes(16, "big").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def get_producer_id(u: UUID) -> ProducerID:
    """The ProducerID (node identifier) of a UUID."""
    return ProducerID((u.int & _U48).to_bytes(6, "big"))


def get_clock(u: UUID) -> int:
    """The clock (timestamp and sequence counter) of a UUID."""
    return clock_of_uuid_int(u.int)


def clock_of_uuid_int(v: int) -> int:
    """The clock of a UUID given as its 128-bit integer."""
    time_low = (v >> 96) & 0xFFFFFFFF
    time_mid = (v >> 80) & 0xFFFF
    time_hi = (v >> 64) & 0xFFFF
    seq = (v >> 58) & 0xF
    # The version nibble shifted by 52 lands on bit 64 and falls off a uint64, as in Gazette.
    return ((time_low << 4) | (time_mid << 36) | (time_hi << 52) | seq) & _U64


def get_flags(u: UUID) -> int:
    """The 10 flag bits of a UUID's clock sequence (a plain int: unknown bits are kept)."""
    return (u.int >> 48) & _FLAGS_MASK


class UUIDColumns(NamedTuple):
    """The producer (48-bit int), clock and flags of many UUIDs, as parallel lists: what
    the Sequencer reads of each message, computed for a whole batch at once."""

    producers: list[int]
    clocks: list[int]
    flags: list[int]


# Byte tables for bytes.translate: the low nibble of a byte; the 4-bit counter in the high
# byte of the clock-sequence field (bits 13..10 of the field); its 2 low flag bits.
_LOW_NIBBLE: Final = bytes(b & 0x0F for b in range(256))
_COUNTER: Final = bytes((b >> 2) & 0x0F for b in range(256))
_FLAGS_HIGH: Final = bytes(b & 0x03 for b in range(256))
_SWAP: Final = sys.byteorder == "little"
_Q_OK: Final = array.array("Q").itemsize == 8 and array.array("H").itemsize == 2


class UUIDWords(NamedTuple):
    """The producer (48-bit), clock and flags of many UUIDs as machine words (``array``
    ``'Q'``, ``'Q'``, ``'H'``, native byte order): :func:`uuid_columns` as buffers, which
    numpy views without a copy (``np.frombuffer``)."""

    producers: array.array[int]
    clocks: array.array[int]
    flags: array.array[int]


def _native_words(buf: bytes | bytearray, typecode: str) -> array.array[int]:
    words = array.array(typecode, buf)
    if _SWAP:
        words.byteswap()
    return words


def uuid_words(raw: bytes) -> UUIDWords:
    """The fields of ``len(raw) // 16`` UUIDs given as consecutive 16-byte big-endian values:
    the one decoder of a UUID's clock bits for batches (the read path's, and Spark's).

    Fields are gathered with strided slices (one C-level copy per byte of a field, for all
    UUIDs at once) into big-endian words, so no per-UUID arithmetic runs in Python: the
    producer is bytes ``[10:16]``; the clock's 60-bit timestamp is bytes ``[6:8]`` (version
    nibble masked off), ``[4:6]``, ``[0:4]``, byte-aligned within a 64-bit word, then
    shifted left by 4 over the whole batch (each word's top nibble is zero, so nothing
    crosses a word) and OR'd with the counters; flags are the 10 low bits of ``[8:10]``.
    """
    n = len(raw) // 16
    if not _Q_OK or n * 16 != len(raw):
        cols = uuid_columns_of_ints(
            [int.from_bytes(raw[i : i + 16], "big") for i in range(0, n * 16, 16)]
        )
        return UUIDWords(array.array("Q", cols.producers), array.array("Q", cols.clocks),
                         array.array("H", cols.flags))
    if n == 0:
        return UUIDWords(array.array("Q"), array.array("Q"), array.array("H"))
    producer = bytearray(8 * n)
    for k in range(6):
        producer[2 + k :: 8] = raw[10 + k :: 16]
    ticks = bytearray(8 * n)
    ticks[0::8] = raw[6::16].translate(_LOW_NIBBLE)
    ticks[1::8] = raw[7::16]
    ticks[2::8] = raw[4::16]
    ticks[3::8] = raw[5::16]
    for k in range(4):
        ticks[4 + k :: 8] = raw[k::16]
    counters = bytearray(8 * n)
    counters[7::8] = raw[8::16].translate(_COUNTER)
    clocks = (int.from_bytes(ticks, "big") << 4 | int.from_bytes(counters, "big")).to_bytes(
        8 * n, "big"
    )
    flags = bytearray(2 * n)
    flags[0::2] = raw[8::16].translate(_FLAGS_HIGH)
    flags[1::2] = raw[9::16]
    return UUIDWords(
        _native_words(producer, "Q"), _native_words(clocks, "Q"), _native_words(flags, "H")
    )


def uuid_columns(raw: bytes) -> UUIDColumns:
    """The columns of ``len(raw) // 16`` UUIDs given as consecutive 16-byte big-endian values
    (:func:`uuid_words`, as lists)."""
    if not _Q_OK or len(raw) % 16:
        return uuid_columns_of_ints(
            [int.from_bytes(raw[i : i + 16], "big") for i in range(0, len(raw) // 16 * 16, 16)]
        )
    words = uuid_words(raw)
    return UUIDColumns(words.producers.tolist(), words.clocks.tolist(), words.flags.tolist())


def uuid_columns_of_ints(values: list[int]) -> UUIDColumns:
    """The columns of UUIDs given as 128-bit integers."""
    producers: list[int] = []
    clocks: list[int] = []
    flags: list[int] = []
    add_p, add_c, add_f = producers.append, clocks.append, flags.append
    for v in values:
        add_p(v & _U48)
        add_c(clock_of_uuid_int(v))
        add_f((v >> 48) & _FLAGS_MASK)
    return UUIDColumns(producers, clocks, flags)

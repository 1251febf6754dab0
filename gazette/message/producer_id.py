"""The ProducerID: the 6-byte node identifier of a message UUID, naming its producer.

Invariant: a ProducerID is exactly 6 bytes (the constructor refuses any other length).

Kept apart from :mod:`gazette.message.uuid`, which re-exports it: a ``bytes`` subclass cannot
be a mypyc native class, and that module is compiled in the compiled build.
"""

from __future__ import annotations


class ProducerID(bytes):
    """The 6-byte node identifier of a message UUID, naming the producer that wrote it."""

    __slots__ = ()

    def __new__(cls, value: bytes = b"\x00" * 6) -> ProducerID:
        if len(value) != 6:
            raise ValueError(f"a ProducerID is 6 bytes, got {len(value)}: {value!r}")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"ProducerID({self.hex()})"

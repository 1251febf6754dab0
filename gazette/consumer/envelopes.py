"""Helpers for the envelopes a shard's application is handed.

``is_ack(envelope)`` tells a transaction acknowledgement (a message whose UUID flags carry
ACK_TXN) from a message of the application's own: as in Gazette, acknowledgements reach
``consume_message`` unless the application sets ``receive_acks = False``. It reads the
message's ``uuid_int`` when the type offers one (no UUID object is built), else ``get_uuid()``.
"""

from __future__ import annotations

from typing import Any, Final

from gazette.message import ACK_TXN, Envelope

__all__ = ["is_ack", "uuid_flags"]

_FLAGS_MASK: Final = 0x3FF
_ACK: Final = int(ACK_TXN)


def uuid_flags(envelope: Envelope) -> int:
    """The transaction flags of the envelope's message UUID (OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN)."""
    msg: Any = envelope.message
    value = getattr(msg, "uuid_int", None)
    if value is None:
        value = msg.get_uuid().int
    return (int(value) >> 48) & _FLAGS_MASK


def is_ack(envelope: Envelope) -> bool:
    """Whether the envelope holds a transaction acknowledgement (ACK_TXN), not an app message."""
    return bool(uuid_flags(envelope) & _ACK)

"""Helpers for the envelopes a shard's application is handed.

``is_ack(envelope)`` tells a transaction acknowledgement (a message whose UUID flags carry
ACK_TXN) from a message of the application's own: as in Gazette, acknowledgements reach
``consume_message`` unless the application sets ``receive_acks = False``. They are the message
layer's (``gazette.message.message``), named here where a consumer looks for them.
"""

from __future__ import annotations

from gazette.message.message import is_ack, uuid_flags

__all__ = ["is_ack", "uuid_flags"]

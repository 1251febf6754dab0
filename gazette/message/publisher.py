"""The Publisher: maps messages to journals, stamps them with UUIDs and appends them.

Two ways to publish:

* :meth:`Publisher.publish_committed` stamps OUTSIDE_TXN: read-committed readers process
  the message as soon as they read it. For producers that are not consumers (API servers,
  loaders).
* :meth:`Publisher.publish_uncommitted` stamps CONTINUE_TXN: readers hold the message
  until an acknowledgement commits it. :meth:`Publisher.build_ack_intents` then returns
  one ACK_TXN message per journal published to; appending those commits the transaction.
  For atomicity, the intents must be stored durably (a consumer puts them in its
  checkpoint) *before* being appended, and re-appended after a fault.

Invariants:

* Each publish ticks the clock once, so the UUIDs of a Publisher are strictly increasing
  in the order messages are handed to the appender, and ACKs get clocks above every
  message they acknowledge.
* No await separates stamping a UUID from the call to ``append``: appends of one
  Publisher reach the appender in clock order. The appender must keep that order per
  journal (it is what readers rely on to sequence a producer's messages).
* A message that fails validation, mapping or marshalling is not appended and leaves no
  pending ACK intent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from .framing import Framing, framing_for_content_type
from .mapping import MappingFunc
from .message import Message
from .uuid import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, Clock, ProducerID, build_uuid, new_producer_id

__all__ = ["AckIntent", "Appender", "Publisher"]


class Appender(Protocol):
    """Appends framed content to journals, asynchronously (the client's AppendService)."""

    async def append(self, journal: str, data: bytes) -> Any:
        """Start appending ``data`` to ``journal``, returning a handle on the append.

        Appends to one journal must be ordered as the calls were made; an implementation
        must therefore enqueue before its first suspension point.
        """
        ...


@dataclass(frozen=True, slots=True)
class AckIntent:
    """A framed ACK message which, appended to ``journal``, commits the messages
    published there by :meth:`Publisher.publish_uncommitted` since the last intents."""

    journal: str
    intent: bytes


class Publisher:
    """Maps, stamps and appends messages; see the module documentation.

    With no ``clock``, the Publisher keeps its own, updated from the wall time at each
    publish. A shared ``clock`` the caller updates now and then saves those time calls.
    """

    def __init__(
        self,
        appender: Appender,
        clock: Clock | None = None,
        producer: ProducerID | None = None,
    ) -> None:
        self._appender = appender
        self._auto_update = clock is None
        self.clock = clock if clock is not None else Clock()
        self.producer = producer if producer is not None else new_producer_id()
        # Journals published to uncommitted since the last intents, in first-publish
        # order: the acknowledgement message to send each, and its framing.
        self._intents: dict[str, tuple[Message, Framing]] = {}

    async def publish_committed(self, mapping: MappingFunc, msg: Message) -> Any:
        """Publish ``msg`` for immediate processing; returns the appender's handle."""
        _, _, handle = await self._publish(mapping, msg, OUTSIDE_TXN)
        return handle

    async def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> Any:
        """Publish ``msg`` within the open transaction; returns the appender's handle.

        Not for concurrent use: await each call before building intents.
        """
        journal, framing, handle = await self._publish(mapping, msg, CONTINUE_TXN)
        if journal not in self._intents:
            self._intents[journal] = (msg.new_acknowledgement(journal), framing)
        return handle

    def build_ack_intents(self) -> list[AckIntent]:
        """The ACK intents committing every message published uncommitted since the last
        call, one per journal. Gazette consumers must leave this to the consumer
        framework, which checkpoints the intents with its transaction."""
        out: list[AckIntent] = []
        for journal, (ack, framing) in self._intents.items():
            ack.set_uuid(build_uuid(self.producer, self.clock.tick(), ACK_TXN))
            out.append(AckIntent(journal, framing.marshal(ack)))
        self._intents.clear()
        return out

    async def _publish(
        self, mapping: MappingFunc, msg: Message, flags: int
    ) -> tuple[str, Framing, Any]:
        if self._auto_update:
            self.clock.update(time.time_ns())
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()
        # The UUID is stamped after mapping (which may inspect the message) and after the
        # journal is known, as its clock orders the message within that journal.
        journal, content_type = mapping(msg)
        framing = framing_for_content_type(content_type)
        msg.set_uuid(build_uuid(self.producer, self.clock.tick(), flags))
        data = framing.marshal(msg)
        return journal, framing, await self._appender.append(journal, data)

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
  pending ACK intent; for ``publish_*_many``, nothing of the call is appended then.
* With a :class:`BufferedAppender` (the client's AppendService) a publish queues its frame
  without suspending and returns the append's handle; it awaits only when the service
  applies back-pressure. Nothing awaits a commit per message: callers await the handles
  they care about (the last of each journal suffices, as a journal's appends commit in
  order) or the service's ``flush``. ``publish_*_many`` frame the messages of each journal
  in one call and queue them as one write.
* A message type offering ``set_uuid_int(value)`` beside its ``set_uuid`` (defined by the
  same class, as :class:`~gazette.message.message.JSONMessage` does) is stamped through it
  with the UUID's 128-bit integer, which spares building a ``uuid.UUID`` per message; any
  other gets ``set_uuid(UUID)`` (so a subclass overriding ``set_uuid`` alone is honoured).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from .framing import Framing, framing_for_content_type
from .mapping import MappingFunc
from .message import Message
from .targets import AppendTarget, BufferedAppender
from .uuid import (
    ACK_TXN,
    CONTINUE_TXN,
    G1582_NS100,
    OUTSIDE_TXN,
    Clock,
    ProducerID,
    build_uuid,
    new_producer_id,
    uuid_from_int,
)

__all__ = ["AckIntent", "AppendTarget", "BufferedAppender", "Publisher"]

_U64: Final = (1 << 64) - 1


H = TypeVar("H")
"""The type of an append's handle (``AsyncAppend`` for the client's AppendService)."""




@dataclass(frozen=True, slots=True)
class AckIntent:
    """A framed ACK message which, appended to ``journal``, commits the messages
    published there by :meth:`Publisher.publish_uncommitted` since the last intents."""

    journal: str
    intent: bytes


class Publisher(Generic[H]):
    """Maps, stamps and appends messages; see the module documentation.

    With no ``clock``, the Publisher keeps its own, updated from the wall time at each
    publish. A shared ``clock`` the caller updates now and then saves those time calls.

    With a :class:`BufferedAppender` (the AppendService), ``publish_*`` return the append's
    handle (an ``AsyncAppend``: await it for the commit) without suspending unless the
    service applies back-pressure; publish many, then await the last handle of each journal
    (or the service's ``flush``).
    """

    def __init__(
        self,
        appender: AppendTarget[H] | BufferedAppender[H],
        clock: Clock | None = None,
        producer: ProducerID | None = None,
    ) -> None:
        self._appender = appender
        self._buffered = appender if isinstance(appender, BufferedAppender) else None
        self._auto_update = clock is None
        self.clock = clock if clock is not None else Clock()
        self.producer = producer if producer is not None else new_producer_id()
        self._node = int.from_bytes(self.producer, "big")
        # What the stamping needs to know of each message type, found once.
        self._types: dict[type, _TypeInfo] = {}
        # Journals published to uncommitted since the last intents, in first-publish
        # order: the acknowledgement message to send each, and its framing.
        self._intents: dict[str, tuple[Message, Framing]] = {}

    async def publish_committed(self, mapping: MappingFunc, msg: Message) -> H:
        """Publish ``msg`` for immediate processing; returns the appender's handle."""
        journal, _, data = self._stamp(mapping, msg, _OUTSIDE)
        # _append, inline: once per message.
        svc = self._buffered
        if svc is None:
            return await self._appender.append(journal, data)  # type: ignore[union-attr]
        handle = svc.append_nowait(journal, data)
        if not svc.writable:
            await svc.wait_writable()
        return handle

    async def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> H:
        """Publish ``msg`` within the open transaction; returns the appender's handle.

        Not for concurrent use: await each call before building intents.
        """
        journal, framing, data = self._stamp(mapping, msg, _CONTINUE)
        if journal not in self._intents:
            self._intents[journal] = (msg.new_acknowledgement(journal), framing)
        svc = self._buffered  # _append, inline, as in publish_committed.
        if svc is None:
            return await self._appender.append(journal, data)  # type: ignore[union-attr]
        handle = svc.append_nowait(journal, data)
        if not svc.writable:
            await svc.wait_writable()
        return handle

    async def publish_committed_many(self, mapping: MappingFunc, msgs: Any) -> dict[str, H]:
        """Publish each message of the iterable ``msgs`` as :meth:`publish_committed` would,
        framing the messages of each journal together; returns the last handle per journal.

        The messages of one journal are appended in iteration order, as one write.
        """
        return await self._publish_many(mapping, msgs, _OUTSIDE)

    async def publish_uncommitted_many(self, mapping: MappingFunc, msgs: Any) -> dict[str, H]:
        """:meth:`publish_uncommitted` of each message of ``msgs``, framed per journal;
        returns the last handle per journal."""
        return await self._publish_many(mapping, msgs, _CONTINUE)

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

    async def _append(self, journal: str, data: bytes) -> H:
        svc = self._buffered
        if svc is None:
            return await self._appender.append(journal, data)  # type: ignore[union-attr]
        handle = svc.append_nowait(journal, data)
        if not svc.writable:
            await svc.wait_writable()
        return handle

    def _update_clock(self) -> None:
        # Clock.update(time.time_ns()) inlined: it runs once per message.
        nxt = ((time.time_ns() // 100 + G1582_NS100) << 4) & _U64
        clock = self.clock
        if nxt > clock.value:
            clock.value = nxt

    def _stamp(self, mapping: MappingFunc, msg: Message, flags: int) -> tuple[str, Framing, bytes]:
        """Validate, map, stamp and frame ``msg``; nothing is appended."""
        clock = self.clock
        if self._auto_update:
            # Clock.update(time.time_ns()), inlined.
            now = ((time.time_ns() // 100 + G1582_NS100) << 4) & _U64
            if now > clock.value:
                clock.value = now
        cls = type(msg)
        info = self._types.get(cls)
        if info is None:
            info = self._types[cls] = _TypeInfo(cls)
        if info.may_validate:
            validate = getattr(msg, "validate", None)
            if validate is not None:
                validate()
        # The UUID is stamped after mapping (which may inspect the message) and after the
        # journal is known, as its clock orders the message within that journal.
        journal, content_type = mapping(msg)
        framing = framing_for_content_type(content_type)
        # Clock.tick() and _uuid_int, inlined.
        tick = clock.value = (clock.value + _TICK) & _U64
        value = (
            (((tick >> 4) & 0xFFFFFFFF) << 96)
            | (((tick >> 36) & 0xFFFF) << 80)
            | ((((tick >> 52) & 0xFFFF) | 0x1000) << 64)
            | ((((tick << 10) & 0x3C00) | flags | 0x8000) << 48)
            | self._node
        )
        if info.set_uuid_int is not None:
            info.set_uuid_int(msg, value)
        else:
            msg.set_uuid(uuid_from_int(value))
        return journal, framing, framing.marshal(msg)

    async def _publish_many(self, mapping: MappingFunc, msgs: Any, flags: int) -> dict[str, H]:
        if self._auto_update:
            self._update_clock()
        node, tick, types = self._node, self.clock.tick, self._types
        groups: dict[str, tuple[Framing, list[Any]]] = {}
        for msg in msgs:
            cls = type(msg)
            info = types.get(cls)
            if info is None:
                info = types[cls] = _TypeInfo(cls)
            if info.may_validate:
                validate = getattr(msg, "validate", None)
                if validate is not None:
                    validate()
            journal, content_type = mapping(msg)
            group = groups.get(journal)
            if group is None:
                group = groups[journal] = (framing_for_content_type(content_type), [])
            value = _uuid_int(node, tick(), flags)
            if info.set_uuid_int is not None:
                info.set_uuid_int(msg, value)
            else:
                msg.set_uuid(uuid_from_int(value))
            group[1].append(msg)
        # Framed, and intents noted, only once every message is stamped and framed: a
        # failure appends nothing and leaves no intent.
        framed = [(j, f.marshal_many(batch)) for j, (f, batch) in groups.items()]
        if flags == _CONTINUE:
            for journal, (framing, batch) in groups.items():
                if journal not in self._intents:
                    self._intents[journal] = (batch[0].new_acknowledgement(journal), framing)
        return {journal: await self._append(journal, data) for journal, data in framed}


_TICK: Final = 10 << 4  # Clock.tick's step: one microsecond.


class _TypeInfo:
    """What stamping needs to know of a message type, looked up once per Publisher."""

    __slots__ = ("may_validate", "set_uuid_int")

    def __init__(self, cls: type) -> None:
        #: ``cls.set_uuid_int`` as a plain function if the class that defines
        #: ``cls.set_uuid`` defines it too (so an override of ``set_uuid`` alone is
        #: honoured), else None.
        self.set_uuid_int: Callable[[Any, int], None] | None = None
        defines = [vars(klass) for klass in cls.__mro__]
        setter = next((d for d in defines if "set_uuid" in d), None)
        if setter is not None and setter is next((d for d in defines if "set_uuid_int" in d), None):
            fn = setter["set_uuid_int"]
            self.set_uuid_int = fn if callable(fn) else None
        #: False if no instance can have a ``validate`` attribute: the class has none, and
        #: instances have no ``__dict__`` and no custom attribute lookup.
        self.may_validate = (
            hasattr(cls, "validate")
            or getattr(cls, "__dictoffset__", 1) != 0
            or hasattr(cls, "__getattr__")
            or getattr(cls, "__getattribute__", None) is not object.__getattribute__
        )


_OUTSIDE: Final = int(OUTSIDE_TXN)
_CONTINUE: Final = int(CONTINUE_TXN)


def _uuid_int(node: int, clock: int, flags: int) -> int:
    """The 128-bit integer of ``build_uuid(producer, clock, flags)`` for trusted arguments
    (``node`` the producer's 48-bit integer, ``flags`` a plain int below 0x400)."""
    clock &= _U64
    return (
        (((clock >> 4) & 0xFFFFFFFF) << 96)
        | (((clock >> 36) & 0xFFFF) << 80)
        | ((((clock >> 52) & 0xFFFF) | 0x1000) << 64)
        | ((((clock << 10) & 0x3C00) | flags | 0x8000) << 48)
        | node
    )

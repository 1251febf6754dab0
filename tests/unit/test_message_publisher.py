"""Publisher tests against an in-memory appender. The expected UUIDs (clock values and
flags per journal) follow Gazette's message/publisher_test.go, and the last test replays
its publisher + sequencer + reader integration case on an in-memory journal."""

from __future__ import annotations

from typing import Any

import pytest

from gazette.message import (
    ACK_TXN,
    CONTENT_TYPE_JSON_LINES,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    AckIntent,
    Chunk,
    ChunkSource,
    Clock,
    JSONFraming,
    JSONMessage,
    Publisher,
    ReadCommittedIter,
    Sequencer,
    UnknownContentTypeError,
    build_uuid,
    get_clock,
)
from gazette.message.mapping import MappingFunc


class MemoryJournals:
    """An appender keeping each journal's content in memory, in call order."""

    def __init__(self) -> None:
        self.content: dict[str, bytearray] = {}

    async def append(self, journal: str, data: bytes) -> int:
        buf = self.content.setdefault(journal, bytearray())
        buf += data
        return len(buf)

    def messages(self, journal: str) -> list[JSONMessage]:
        values = JSONFraming().decode(bytes(self.content.get(journal, b""))).values
        return JSONMessage.from_json_many(values)


def to(journal: str) -> MappingFunc:
    return lambda msg: (journal, CONTENT_TYPE_JSON_LINES)


def m(**fields: object) -> JSONMessage:
    return JSONMessage(dict(fields))


def expect(producer: bytes, clock: int, flags: int, **fields: object) -> JSONMessage:
    out = m(**fields)
    out.set_uuid(build_uuid(producer, clock, flags))
    return out


async def test_publish_committed() -> None:
    journals = MemoryJournals()
    pub = Publisher(journals, clock=Clock())
    for s in ["hello", "world", "beer!"]:
        await pub.publish_committed(to("a/journal"), m(Str=s))
    assert journals.messages("a/journal") == [
        expect(pub.producer, 160, OUTSIDE_TXN, Str="hello"),
        expect(pub.producer, 320, OUTSIDE_TXN, Str="world"),
        expect(pub.producer, 480, OUTSIDE_TXN, Str="beer!"),
    ]
    assert pub.build_ack_intents() == []  # Nothing was published uncommitted.


async def test_validation_and_mapping_errors_append_nothing() -> None:
    class Invalid(JSONMessage):
        def validate(self) -> None:
            raise ValueError("whoops!")

    class SlottedInvalid(JSONMessage):
        __slots__ = ()

        def validate(self) -> None:
            raise ValueError("slotted whoops!")

    journals = MemoryJournals()
    pub = Publisher(journals, clock=Clock())
    await pub.publish_committed(to("a/journal"), m())  # A valid type first, then others.
    journals.content.clear()
    with pytest.raises(ValueError, match="whoops!"):
        await pub.publish_committed(to("a/journal"), Invalid())
    with pytest.raises(ValueError, match="slotted whoops!"):
        await pub.publish_committed_many(to("a/journal"), [m(), SlottedInvalid()])
    with pytest.raises(UnknownContentTypeError):
        await pub.publish_uncommitted(lambda msg: ("a/journal", "text/plain"), m())
    assert journals.content == {}
    assert pub.build_ack_intents() == []


async def test_publish_uncommitted() -> None:
    journals = MemoryJournals()
    pub = Publisher(journals, clock=Clock())

    async def write(intents: list[AckIntent]) -> None:
        for intent in intents:
            await journals.append(intent.journal, intent.intent)

    await pub.publish_uncommitted(to("journal/one"), m(Str="value one"))
    await pub.publish_uncommitted(to("journal/two"), m(Str="value two"))
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["journal/one", "journal/two"]
    await write(intents)

    await pub.publish_uncommitted(to("journal/three"), m(Str="value three"))
    await pub.publish_uncommitted(to("journal/one"), m(Str="value four"))
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["journal/three", "journal/one"]
    await write(intents)

    p = pub.producer
    assert journals.messages("journal/one") == [
        expect(p, 160, CONTINUE_TXN, Str="value one"),
        expect(p, 480, ACK_TXN),
        expect(p, 960, CONTINUE_TXN, Str="value four"),
        expect(p, 1280, ACK_TXN),
    ]
    assert journals.messages("journal/two") == [
        expect(p, 320, CONTINUE_TXN, Str="value two"),
        expect(p, 640, ACK_TXN),
    ]
    assert journals.messages("journal/three") == [
        expect(p, 800, CONTINUE_TXN, Str="value three"),
        expect(p, 1120, ACK_TXN),
    ]


async def test_auto_updated_clock_follows_wall_time() -> None:
    journals = MemoryJournals()
    pub = Publisher(journals)
    before = Clock.now().value
    await pub.publish_committed(to("a/journal"), m())
    assert get_clock(journals.messages("a/journal")[0].get_uuid()) > before


async def test_publisher_with_sequencer_and_reader() -> None:
    """Gazette's publisher/sequencer/reader integration case: a transactional and a plain
    publisher interleave in one journal, read through a sequencer with a 3-message ring."""
    journals = MemoryJournals()
    clock = Clock()
    pub, txn_pub = Publisher(journals, clock=clock), Publisher(journals, clock=clock)
    mapping = to("a/journal")

    class Tail:
        """Reads what was appended since the last read, one message per read."""

        def __init__(self) -> None:
            self.offset = 0

        async def read(self) -> Chunk | None:
            buf = journals.content["a/journal"]
            end = buf.find(b"\n", self.offset) + 1
            if end == 0:
                return None
            chunk = Chunk("a/journal", self.offset, bytes(buf[self.offset : end]))
            self.offset = end
            return chunk

    replays: list[tuple[int, int]] = []

    def open_replay(journal: str, begin: int, end: int) -> ChunkSource:
        replays.append((begin, end))
        data = bytes(journals.content[journal][begin:end])

        class Once:
            done = False

            async def read(self) -> Chunk | None:
                if self.done:
                    return None
                self.done = True
                return Chunk(journal, begin, data)

        return Once()

    tail = Tail()
    it = ReadCommittedIter(
        tail, JSONFraming(), JSONMessage.from_json_many, Sequencer(ring_size=3), open_replay
    )

    async def pump() -> list[JSONMessage]:
        batch = await it.next_batch()
        return [e.message for e in batch]

    await txn_pub.publish_uncommitted(mapping, m(Str="one"))
    await pub.publish_committed(mapping, m(Str="two"))
    for i in txn_pub.build_ack_intents():
        await journals.append(i.journal, i.intent)

    # All served from the ring; "one" waits for its ACK.
    assert await pump() == [expect(pub.producer, 320, OUTSIDE_TXN, Str="two")]
    assert await pump() == [
        expect(txn_pub.producer, 160, CONTINUE_TXN, Str="one"),
        expect(txn_pub.producer, 480, ACK_TXN),
    ]

    # Enough interleaved messages to overflow the ring: the commit needs a replay.
    await txn_pub.publish_uncommitted(mapping, m(Str="three"))
    await pub.publish_committed(mapping, m(Str="four"))
    await txn_pub.publish_uncommitted(mapping, m(Str="five"))
    await pub.publish_committed(mapping, m(Str="six"))
    await txn_pub.publish_uncommitted(mapping, m(Str="seven"))
    for i in txn_pub.build_ack_intents():
        await journals.append(i.journal, i.intent)

    assert await pump() == [expect(pub.producer, 800, OUTSIDE_TXN, Str="four")]
    assert await pump() == [expect(pub.producer, 1120, OUTSIDE_TXN, Str="six")]
    assert replays == []
    assert await pump() == [
        expect(txn_pub.producer, 640, CONTINUE_TXN, Str="three"),
        expect(txn_pub.producer, 960, CONTINUE_TXN, Str="five"),
        expect(txn_pub.producer, 1280, CONTINUE_TXN, Str="seven"),
        expect(txn_pub.producer, 1440, ACK_TXN),
    ]
    assert len(replays) == 1  # "three" had left the ring.
    assert await pump() == []


class Custom:
    """A message type with set_uuid only."""

    def __init__(self) -> None:
        self.uuid: object = None

    def set_uuid(self, uuid: object) -> None:
        self.uuid = uuid

    def to_json(self) -> dict[str, str]:
        return {"UUID": str(self.uuid)}

    def new_acknowledgement(self, journal: str) -> Custom:
        return Custom()


class OverridesSetUUID(JSONMessage):
    """Overrides set_uuid alone: the Publisher must call it, not the inherited fast path."""

    __slots__ = ("seen",)

    def set_uuid(self, uuid: object) -> None:
        self.seen = uuid
        super().set_uuid(uuid)  # type: ignore[arg-type]


class OverridesSetUUIDInt(JSONMessage):
    __slots__ = ("seen",)

    def set_uuid_int(self, value: int) -> None:
        self.seen = value
        super().set_uuid_int(value)


@pytest.mark.parametrize("many", [False, True])
async def test_each_message_type_is_stamped_through_its_own_setter(many: bool) -> None:
    journals = MemoryJournals()
    pub = Publisher(journals, clock=Clock())
    plain, custom = m(n=0), Custom()
    overrides, overrides_int = OverridesSetUUID(dict(n=2)), OverridesSetUUIDInt(dict(n=3))
    msgs: list[Any] = [plain, custom, overrides, overrides_int]
    if many:
        await pub.publish_committed_many(to("a/journal"), msgs)
    else:
        for msg in msgs:
            await pub.publish_committed(to("a/journal"), msg)
    uuids = [build_uuid(pub.producer, 160 * (i + 1), OUTSIDE_TXN) for i in range(4)]
    assert plain.get_uuid() == uuids[0]
    assert custom.uuid == uuids[1]
    assert overrides.seen == uuids[2]
    assert overrides_int.seen == uuids[3].int
    assert [x.get_uuid() for x in journals.messages("a/journal")] == uuids

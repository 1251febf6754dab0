"""Iterator tests over in-memory chunk sources: chunking never changes what is read,
offset jumps drop partial frames, bad frames raise once and reading continues, and a
read-committed iterator replays evicted sequences."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Chunk,
    ChunkSource,
    DesyncError,
    Envelope,
    FixedFraming,
    JSONFraming,
    JSONMessage,
    MessageDecodeError,
    QueueOutcome,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    UnexpectedEOFError,
    build_uuid,
)
from gazette.message.uuid import ProducerID

JOURNAL = "a/journal"
A = ProducerID(b"\x01\x00\x00\x00\x00\x0a")
B = ProducerID(b"\x01\x00\x00\x00\x00\x0b")


class ListSource:
    """Serves the given chunks, then ends."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = list(chunks)
        self.closed = False

    async def read(self) -> Chunk | None:
        return self.chunks.pop(0) if self.chunks else None

    async def aclose(self) -> None:
        self.closed = True


def split(content: bytes, cuts: list[int], offset: int = 0) -> list[Chunk]:
    points = sorted({c for c in cuts if 0 < c < len(content)})
    out, prev = [], 0
    for p in [*points, len(content)]:
        out.append(Chunk(JOURNAL, offset + prev, content[prev:p]))
        prev = p
    return out


async def read_all(it: ReadUncommittedIter | ReadCommittedIter) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    while batch := await it.next_batch():
        out.extend((e.begin, e.end, e.message) for e in batch)
    return out


def msg(producer: ProducerID, clock: int, flags: int, **fields: object) -> JSONMessage:
    m = JSONMessage(dict(fields))
    m.set_uuid(build_uuid(producer, clock, flags))
    return m


@settings(max_examples=50)
@given(st.lists(st.integers(0, 400), max_size=12))
async def test_chunking_does_not_change_messages(cuts: list[int]) -> None:
    msgs = [JSONMessage({"n": i, "s": "x" * (i % 13)}) for i in range(20)]
    content = JSONFraming().marshal_many(msgs)
    it = ReadUncommittedIter(
        ListSource(split(content, cuts, offset=1000)), JSONFraming(), JSONMessage.from_json_many
    )
    got = await read_all(it)
    assert [m for _, _, m in got] == msgs
    # Envelopes tile the content exactly.
    assert got[0][0] == 1000 and got[-1][1] == 1000 + len(content)
    assert all(got[i][1] == got[i + 1][0] for i in range(len(got) - 1))
    assert it.offset == 1000 + len(content)


async def test_offset_jump_drops_the_partial_frame() -> None:
    content = b'{"n":1}\n{"n":2}\n'
    chunks = [
        Chunk(JOURNAL, 0, content[:12]),  # Ends inside {"n":2}.
        Chunk(JOURNAL, 100, b'{"n":3}\n'),  # Content from 12 to 100 was removed.
    ]
    got = await read_all(
        ReadUncommittedIter(ListSource(chunks), JSONFraming(), JSONMessage.from_json_many)
    )
    assert [(b, e, m.doc) for b, e, m in got] == [(0, 8, {"n": 1}), (100, 108, {"n": 3})]


async def test_bad_messages_raise_once_then_reading_continues() -> None:
    content = b'{"n":1}\nnot json\n{"n":2}\n[1]\n{"UUID":"nope"}\n{"n":3}\n'
    it = ReadUncommittedIter(
        ListSource([Chunk(JOURNAL, 0, content)]), JSONFraming(), JSONMessage.from_json_many
    )
    assert [e.message.doc for e in await it.next_batch()] == [{"n": 1}]
    with pytest.raises(MessageDecodeError, match=r"a/journal \[8, 17\)") as info:
        await it.next_batch()
    assert (info.value.journal, info.value.begin, info.value.end) == (JOURNAL, 8, 17)
    assert [e.message.doc for e in await it.next_batch()] == [{"n": 2}]
    with pytest.raises(MessageDecodeError, match="expected a JSON object"):
        await it.next_batch()
    with pytest.raises(MessageDecodeError, match="canonical UUID"):
        await it.next_batch()
    assert [e.message.doc for e in await it.next_batch()] == [{"n": 3}]
    assert await it.next_batch() == []


async def test_unexpected_eof_inside_a_frame() -> None:
    it = ReadUncommittedIter(
        ListSource([Chunk(JOURNAL, 0, b'{"n":1}\n{"n":')]),
        JSONFraming(),
        JSONMessage.from_json_many,
    )
    assert len(await it.next_batch()) == 1
    with pytest.raises(UnexpectedEOFError, match="5 bytes from offset 8"):
        await it.next_batch()
    assert await it.next_batch() == []


async def test_fixed_framing_desync_is_reported_with_offsets() -> None:
    f = FixedFraming()
    content = f.marshal(b"one") + b"junk!" + f.marshal(b"two")
    it = ReadUncommittedIter(
        ListSource(split(content, [3, 12, 14], offset=50)), f, lambda vs: [bytes(v) for v in vs]
    )
    assert [e.message for e in await it.next_batch()] == [b"one"]
    with pytest.raises(DesyncError) as info:
        await it.next_batch()
    assert (info.value.begin, info.value.skipped) == (61, 5)
    rest = await read_all(it)
    assert [m for _, _, m in rest] == [b"two"]


async def test_read_committed_with_replay() -> None:
    # B's transaction straddles so much of A's traffic that it leaves the ring.
    msgs = [
        msg(B, 160, CONTINUE_TXN, s="b1"),
        *[msg(A, 160 * (i + 1), OUTSIDE_TXN, s=f"a{i}") for i in range(5)],
        msg(B, 320, CONTINUE_TXN, s="b2"),
        msg(A, 160 * 7, CONTINUE_TXN, s="rolled back"),
        msg(B, 480, ACK_TXN),
        msg(A, 160 * 5, ACK_TXN),  # Rolls A back to its last OUTSIDE clock.
    ]
    content = JSONFraming().marshal_many(msgs)
    opened: list[tuple[str, int, int]] = []
    sources: list[ListSource] = []

    def open_replay(journal: str, begin: int, end: int) -> ChunkSource:
        opened.append((journal, begin, end))
        src = ListSource([Chunk(journal, begin, content[begin:end])])
        sources.append(src)
        return src

    it = ReadCommittedIter(
        ListSource(split(content, [40, 90, 200])),
        JSONFraming(),
        JSONMessage.from_json_many,
        Sequencer(ring_size=3),
        open_replay,
    )
    got = await read_all(it)
    assert [m.get("s") for _, _, m in got] == ["a0", "a1", "a2", "a3", "a4", "b1", "b2", None]
    assert opened == [(JOURNAL, 0, got[6][0])]  # From b1 to b2, which is still in the ring.
    assert sources[0].closed
    offsets, _ = it.sequencer.checkpoint()
    assert offsets == {JOURNAL: len(content)}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([A, B]), st.integers(1, 8), st.sampled_from([0, 1, 2, 9])),
        max_size=30,
    ),
    st.lists(st.integers(0, 3000), max_size=8),
    st.integers(0, 6),
    st.booleans(),
)
async def test_read_committed_agrees_with_stepping_a_sequencer(
    entries: list[tuple[ProducerID, int, int]], cuts: list[int], ring: int, plain: bool
) -> None:
    """ReadCommittedIter (batches, bulk UUID fields, queue_and_drain) delivers what a
    per-envelope Sequencer delivers over the same envelopes, whatever the chunking, with
    duplicates, rollbacks, replays and bad lines (flag 9 stands for a bad line) mixed in;
    with ``plain`` the decoder returns plain lists (no UUID fields handed over)."""
    lines = []
    for producer, clock, flags in entries:
        if flags == 9:
            lines.append(b'{"UUID":"not a uuid"}\n')
        else:
            lines.append(JSONFraming().marshal(msg(producer, clock << 4, flags, c=clock)))
    content = b"".join(lines)

    def decode(values: Any) -> Any:
        out = JSONMessage.from_json_many(values)
        return list(out) if plain else out

    def open_replay(journal: str, begin: int, end: int) -> ChunkSource:
        return ListSource([Chunk(journal, begin, content[begin:end])])

    it = ReadCommittedIter(
        ListSource(split(content, cuts)), JSONFraming(), decode, Sequencer(ring_size=ring),
        open_replay,
    )
    got: list[tuple[int, int]] = []
    while True:
        try:
            batch = await it.next_batch()
        except MessageDecodeError:
            continue
        if not batch:
            break
        got.extend((e.begin, e.end) for e in batch)

    # The reference: every valid envelope, one by one through queue_uncommitted and step.
    envelopes = []
    begin = 0
    for line in lines:
        if b"not a uuid" not in line:
            envelopes.append(
                Envelope(JOURNAL, begin, begin + len(line), JSONMessage.from_json(json.loads(line)))
            )
        begin += len(line)
    seq = Sequencer(ring_size=ring)
    expect: list[tuple[int, int]] = []
    for env in envelopes:
        if seq.queue_uncommitted(env) == QueueOutcome.ACK_COMMIT_REPLAY:
            journal, lo, hi = seq.replay_range()
            seq.start_replay([e for e in envelopes if e.begin >= lo and e.end <= hi])
        expect.extend((e.begin, e.end) for e in seq.dequeue_committed())
    assert got == expect
    assert it.sequencer.checkpoint()[0] == seq.checkpoint()[0]

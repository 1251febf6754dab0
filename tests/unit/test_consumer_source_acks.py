"""``ShardSource.sequence_without_acks``: the committed messages less acknowledgements, found
from the batch's UUID flags, equal filtering ``sequence``'s output with ``is_ack`` message by
message (what the transaction loop does for a source without the capability)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.consumer.envelopes import is_ack
from gazette.consumer.source import ShardSource, _Batch
from gazette.message import (
    ACK_TXN,
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Envelope,
    JSONMessage,
    ProducerID,
    build_uuid,
)
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb

JOURNAL = "in"
PRODUCERS = [ProducerID(bytes([1, 0, 0, 0, 0, p])) for p in range(1, 4)]

# (producer index, clock, flags): clocks drawn small so duplicates and roll-backs happen.
_msgs = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12),
                           st.sampled_from([OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN])), max_size=40)


def _source() -> ShardSource:
    spec = pc.ShardSpec(id="s")
    spec.sources.add(journal=JOURNAL)
    jspec = pb.JournalSpec(name=JOURNAL)
    jspec.labels.labels.add(name=CONTENT_TYPE, value=CONTENT_TYPE_JSON_LINES)
    return ShardSource(None, spec, {JOURNAL: jspec}, lambda _: JSONMessage)  # type: ignore[arg-type]


def _batches(msgs: Sequence[tuple[int, int, int]], cuts: list[int], with_uuids: bool) -> list[_Batch]:
    """The messages as read-uncommitted batches cut at ``cuts``, with UUID columns computed
    by the batch decoder (``from_json_many``) when ``with_uuids``."""
    out, offset, start = [], 0, 0
    for end in sorted({c % (len(msgs) + 1) for c in cuts} | {len(msgs)}):
        docs = [{"UUID": str(build_uuid(PRODUCERS[p], clock, flags)), "n": i}
                for i, (p, clock, flags) in enumerate(msgs[start:end], start)]
        batch = JSONMessage.from_json_many(docs)
        envs = []
        for msg in batch:
            envs.append(Envelope(JOURNAL, offset, offset + 10, msg))
            offset += 10
        if envs:
            out.append(_Batch(JOURNAL, envs, batch.uuids if with_uuids else None))
        start = end
    return out


@settings(max_examples=300, deadline=None)
@given(_msgs, st.lists(st.integers(0, 40), max_size=5), st.booleans())
async def test_without_acks_equals_filtering_each_message(
        msgs: list[tuple[int, int, int]], cuts: list[int], with_uuids: bool) -> None:
    fast, slow = _source(), _source()
    got, want = [], []
    for batch in _batches(msgs, cuts, with_uuids):
        got += [e.message.doc["n"] for e in await fast.sequence_without_acks(batch)]
        want += [e.message.doc["n"] for e in await slow.sequence(batch) if not is_ack(e)]
    assert got == want
    assert fast.checkpoint(0) == slow.checkpoint(0)


async def test_acknowledgements_are_dropped_and_the_rest_kept_in_order() -> None:
    msgs = [(0, 1, OUTSIDE_TXN), (1, 1, CONTINUE_TXN), (0, 2, CONTINUE_TXN), (1, 2, ACK_TXN),
            (0, 3, ACK_TXN), (2, 1, OUTSIDE_TXN)]
    source = _source()
    (batch,) = _batches(msgs, [], with_uuids=True)
    assert [e.message.doc["n"] for e in await source.sequence_without_acks(batch)] == [0, 1, 2, 5]

"""The Append RPC's wire by hand: the committed append's response (``append.encode_committed``)
is byte for byte what protobuf serializes of the message the broker otherwise builds, and a
first request decodes as protobuf decodes it, shared (and known valid) only when it is valid,
small and unproxied, and never changed by the appends that share it (property tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from test_pipeline import JOURNAL
from test_pipeline_fsm import FSMBroker, chunks

from gazette.broker import append as append_mod
from gazette.broker import wire
from gazette.broker.append import encode_committed, header_field
from gazette.errors import ValidationError
from gazette.fragment import set_sum
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import validate

int64s = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
names = st.text(min_size=0, max_size=40)
digests = st.one_of(st.binary(min_size=20, max_size=20),
                    st.lists(st.sampled_from([bytes(4), b"\x00\x00\x00\x01", b"\xff\xff\xff\xff"]),
                             min_size=5, max_size=5).map(b"".join))  # zero parts
labels = st.lists(st.tuples(st.text(min_size=1, max_size=8), st.text(max_size=8)), max_size=3)
ids = st.builds(lambda z, s: pb.ProcessSpec.ID(zone=z, suffix=s), names, names)


@st.composite
def headers(draw: st.DrawFn) -> pb.Header:
    members = draw(st.lists(ids, max_size=3))
    h = pb.Header(process_id=draw(ids), route=pb.Route(
        members=members, primary=draw(st.integers(-1, len(members) - 1)),
        endpoints=draw(st.lists(names, max_size=len(members)))))
    if draw(st.booleans()):
        h.etcd.CopyFrom(pb.Header.Etcd(cluster_id=draw(st.integers(0, (1 << 64) - 1)),
                                       revision=draw(int64s), raft_term=draw(st.integers(0, 99))))
    return h


@settings(max_examples=300)
@given(headers(), names, int64s, int64s, digests, st.integers(0, 5), labels,
       st.integers(0, (1 << 63) - 1))
def test_encode_committed_is_protobufs_serialization(
        header: pb.Header, journal: str, begin: int, end: int, digest: bytes, codec: int,
        regs: list[tuple[str, str]], chunks: int) -> None:
    registers = pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in regs])
    want = pb.AppendResponse(status=pb.OK, header=header)
    c = want.commit
    c.journal = journal
    c.begin = begin
    c.end = end
    set_sum(c.sum, digest)
    c.compression_codec = codec  # type: ignore[assignment]
    want.registers.CopyFrom(registers)
    want.total_chunks = chunks

    got = encode_committed(header_field(header), journal, begin, end, digest, codec,
                           registers.SerializeToString(), chunks)
    assert got == want.SerializeToString()
    assert pb.AppendResponse.FromString(got) == want


# -- The first request, decoded once per distinct encoding (``wire.decode_append_request``).

journals = st.one_of(st.sampled_from(["a/journal", "b/c/d", "x;meta/seg"]),
                     st.text(max_size=12))  # mostly invalid names


@settings(max_examples=300)
@given(journals, st.integers(-2, 1 << 40), st.booleans(), st.sampled_from([0, 1, 2, 3, 4, 9]),
       st.booleans())
def test_first_requests_decode_as_protobuf_and_only_valid_ones_are_shared(
        journal: str, offset: int, do_not_proxy: bool, suspend: int, with_header: bool) -> None:
    req = pb.AppendRequest(journal=journal, offset=offset, do_not_proxy=do_not_proxy)
    req.suspend = suspend  # type: ignore[assignment]  # an enum's value, maybe an unknown one
    if with_header:
        req.header.etcd.revision = 7
    data = req.SerializeToString()
    first, again = wire.decode_append_request(data), wire.decode_append_request(memoryview(data))
    if not data:  # the empty request is the commit chunk, whatever it was meant as
        assert first is wire.COMMIT and again is wire.COMMIT
        return
    assert first == req and again == req  # as protobuf decodes it, from bytes or a view
    try:
        validate.validate_append_request(req)
        valid = bool(journal)
    except ValidationError:
        valid = False
    shared = valid and not with_header and len(data) <= wire.FIRST_CACHE_BYTES
    assert (first is again) is shared
    assert wire.validated(first) is shared and wire.validated(again) is shared
    assert not wire.validated(req)  # a message of the caller's own is never taken as validated


def test_the_shared_first_requests_are_bounded() -> None:
    first = wire.decode_append_request(pb.AppendRequest(journal="bound/first").SerializeToString())
    assert wire.validated(first)
    for i in range(wire.FIRST_CACHE_MAX):
        wire.decode_append_request(pb.AppendRequest(journal=f"bound/{i}").SerializeToString())
    assert not wire.validated(first)  # dropped once the cache filled: decoded afresh
    again = wire.decode_append_request(pb.AppendRequest(journal="bound/first").SerializeToString())
    assert again is not first and wire.validated(again)
    assert len(wire._FIRSTS) <= wire.FIRST_CACHE_MAX


async def test_serving_appends_leaves_a_shared_first_request_as_it_was(tmp_path: Path) -> None:
    data = pb.AppendRequest(journal=JOURNAL).SerializeToString()
    first = wire.decode_append_request(data)
    assert isinstance(first, pb.AppendRequest) and wire.validated(first)
    async with asyncio.TaskGroup() as tg:
        broker = FSMBroker(tmp_path, tg)
        try:
            for part in (b"one\n", b"two\n"):  # the first builds the pipeline, the second reuses it
                resp = await append_mod.append(broker, first, chunks(part))  # type: ignore[arg-type]
                assert resp.status == pb.OK
        finally:
            broker.replica.cancel()
            assert broker.replica.retired is not None
            await asyncio.wait_for(broker.replica.retired, 5)
    assert first.SerializeToString() == data and wire.decode_append_request(data) is first

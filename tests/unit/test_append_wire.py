"""The committed append's response serialized by hand (``append.encode_committed``) is byte for
byte what protobuf serializes of the message the broker otherwise builds (property test)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.broker.append import encode_committed, header_field
from gazette.fragment import set_sum
from gazette.protocol import protocol_pb2 as pb

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

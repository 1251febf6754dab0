"""Group commit (``broker/group_commit.py``): whole Append calls served together.

Against the real append state machine, replica, spools and in-process peers of
``test_pipeline_fsm`` (three members): a group's calls land contiguously in their order, each
answered its own range, SHA-1 and chunk count, and every member holds all of it in one commit;
a peer failing fails every call (what it committed, it committed whole); calls the group cannot take (not plain, a
refusal, a read-only journal) are served alone with the answers they get alone; what groups
(``group_key``) is what the module docstring says.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import grpc
import grpc.aio
import pytest
import test_pipeline_fsm
from test_pipeline import JOURNAL
from test_pipeline_fsm import FSMBroker, do_append, fragments

from gazette.auth import Unauthenticated
from gazette.broker import metrics, wire
from gazette.broker.group_commit import GROUP_CALL_BYTES, AppendGroups
from gazette.broker.spool import THREAD_MIN
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.server import BatchCall, RpcServer, ServerConnection, ServerStream, ServicerContext

broker = test_pipeline_fsm.broker  # the fixture: an FSMBroker (tokens not checked)


def first_request(**fields: Any) -> Any:
    """The first request as the transport decodes it (shared and validated when plain)."""
    return wire.decode_append_request(pb.AppendRequest(journal=JOURNAL, **fields).SerializeToString())


async def _never(requests: Any, context: Any) -> None:
    raise AssertionError("a group's call is not served by the handler")


_HANDLER = grpc.stream_unary_rpc_method_handler(_never)


def call(first: Any, *contents: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> BatchCall:
    """A whole Append call as the transport hands it to a group (its stream's connection is
    never connected: the group's outcomes are what the tests look at)."""
    reqs: list[Any] = [first]
    for c in contents:
        reqs.append(wire.decode_append_request(pb.AppendRequest(content=c).SerializeToString()))
    reqs.append(wire.decode_append_request(b""))
    stream = ServerStream(ServerConnection(RpcServer()), 1, _HANDLER)  # never connected
    return BatchCall(stream, ServicerContext(stream, metadata, None), reqs)


def groups_of(b: FSMBroker) -> AppendGroups:
    return AppendGroups(b)  # type: ignore[arg-type]  # just enough of a broker


def answers(outcomes: list[Any]) -> list[pb.AppendResponse]:
    out = []
    for o in outcomes:
        # A committed append's response is serialized already; any other is a message.
        assert isinstance(o, bytes | pb.AppendResponse), o
        out.append(pb.AppendResponse.FromString(o) if isinstance(o, bytes) else o)
    return out


def spool_bytes(b: FSMBroker) -> list[bytes]:
    """What each member's spool holds of its current fragment."""
    held = []
    for spool in [b.replica.spool, *b.peer_spools()]:
        frag, file = spool.fragment, spool.file
        held.append(file.pread(0, frag.end - frag.begin) if file is not None else b"")
    return held


@pytest.mark.parametrize("seed,most", [(1, 300), (2, 300), (3, 300), (4, GROUP_CALL_BYTES // 3)])
async def test_a_group_lands_contiguously_with_each_call_answered_its_own(broker: FSMBroker, seed: int,
                                                                          most: int) -> None:
    """(The last case's group is long enough for a worker thread to write it: THREAD_MIN.)"""
    rng = random.Random(seed)
    before = await do_append(broker, b"before\n")
    first = first_request()
    contents = [[rng.randbytes(rng.randint(most // 2, most)) for _ in range(rng.randint(1, 3))]
                for _ in range(rng.randint(2, 12) if most < THREAD_MIN // 8 else 8)]
    if most >= THREAD_MIN // 8:
        assert sum(len(c) for call in contents for c in call) >= THREAD_MIN
    groups_before = metrics.APPENDS_TALLY.groups
    resps = answers(await groups_of(broker).serve_group([call(first, *c) for c in contents]))
    offset = before.commit.end
    for parts, resp in zip(contents, resps, strict=True):
        body = b"".join(parts)
        assert resp.status == pb.OK
        assert (resp.commit.begin, resp.commit.end) == (offset, offset + len(body))
        want = pb.SHA1Sum()
        hashed = hashlib.sha1(body).digest()
        want.part1, want.part2 = int.from_bytes(hashed[:8], "big"), int.from_bytes(hashed[8:16], "big")
        want.part3 = int.from_bytes(hashed[16:], "big")
        assert resp.commit.sum == want
        assert resp.total_chunks == len(parts)
        assert resp.header.etcd.revision > 0
        offset += len(body)
    # One commit: every member holds the same fragment, through all of it.
    frags = fragments(broker)
    assert len(frags) == 1 and next(iter(frags))[1] == offset
    everything = b"before\n" + b"".join(b"".join(c) for c in contents)
    assert all(held.endswith(everything) for held in spool_bytes(broker))
    assert metrics.APPENDS_TALLY.groups == groups_before + 1
    # The next append, alone, follows the group.
    after = await do_append(broker, b"after\n")
    assert after.commit.begin == offset


async def test_a_peer_failing_fails_every_call(broker: FSMBroker) -> None:
    await do_append(broker, b"before\n")
    broker.streams[0].fail_writes = ConnectionResetError("peer went away")
    first = first_request()
    outcomes = await groups_of(broker).serve_group([call(first, b"a" * 10), call(first, b"b" * 20)])
    assert [type(o) for o in outcomes] == [grpc.aio.AbortError] * 2
    # The group is one commit: the members that applied it before the failure keep all of it
    # (the at-least-once edge of a single append), never a part; the next append rebuilds the
    # pipeline and lands after it or after nothing.
    resp = await do_append(broker, b"after\n")
    assert resp.commit.begin in (7, 37)
    assert {f[1] for f in fragments(broker)} == {resp.commit.end}
    assert all(s.delta == 0 for s in [broker.replica.spool, *broker.peer_spools()])


async def test_calls_the_group_cannot_take_are_served_alone(broker: FSMBroker) -> None:
    await do_append(broker, b"before\n")
    # A read-only journal: each call is answered NOT_ALLOWED, as it would be alone.
    broker.spec.flags = pb.JournalSpec.O_RDONLY
    first = first_request()
    resps = answers(await groups_of(broker).serve_group([call(first, b"x"), call(first, b"y")]))
    assert [r.status for r in resps] == [pb.NOT_ALLOWED, pb.NOT_ALLOWED]
    assert {f[:2] for f in fragments(broker)} == {(0, 7)}


async def test_what_groups() -> None:  # async: a connection takes the running loop
    groups = AppendGroups(None)  # type: ignore[arg-type]  # group_key reads only the call
    plain = first_request()
    assert groups.group_key(call(plain, b"a")) == groups.group_key(call(plain, b"b", b"c"))
    # Another authorization, another group.
    assert groups.group_key(call(plain, b"a")) != groups.group_key(
        call(plain, b"a", metadata=(("authorization", "Bearer x"),)))
    # Alone: no content, a content chunk first, no commit, content over the bound, not plain.
    assert groups.group_key(call(plain)) is None
    uncommitted = call(plain, b"a")
    uncommitted.requests.pop()
    assert groups.group_key(uncommitted) is None
    assert groups.group_key(call(plain, b"a" * (GROUP_CALL_BYTES + 1))) is None
    for fields in ({"offset": 7}, {"suspend": pb.AppendRequest.SUSPEND_NO_RESUME},
                   {"check_registers": pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="a", value="b")]))},
                   {"union_registers": pb.LabelSet(labels=[pb.Label(name="a", value="b")])}):
        assert groups.group_key(call(first_request(**fields), b"a")) is None, fields
    # A first request the transport did not validate and share (one carrying a proxy's header).
    proxied = pb.AppendRequest(journal=JOURNAL)
    proxied.header.etcd.revision = 1
    assert groups.group_key(call(wire.decode_append_request(proxied.SerializeToString()), b"a")) is None


async def test_a_refused_token_ends_every_call(broker: FSMBroker) -> None:
    class Refusing:
        def verify(self, authorization: str | None, require: int) -> Any:
            raise Unauthenticated("no token")

    broker.verifier = Refusing()
    first = first_request()
    calls = [call(first, b"a"), call(first, b"b")]
    outcomes = await groups_of(broker).serve_group(calls)
    for c, o in zip(calls, outcomes, strict=True):
        assert isinstance(o, grpc.aio.AbortError)
        assert c.ctx.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_group_is_tallied_as_its_appends_one_by_one() -> None:
    one_by_one, grouped = metrics.AppendsTally(), metrics.AppendsTally()
    sizes, seconds = [10, 0, 300, 7], 0.003
    for n in sizes:
        one_by_one.committed(n, seconds)
        one_by_one.answered(pb.OK)
    grouped.group_committed(sizes, seconds)
    for attr in ("append_bytes", "by_status", "commit_counts"):
        assert getattr(grouped, attr) == getattr(one_by_one, attr), attr
    assert grouped.commit_sum == pytest.approx(one_by_one.commit_sum)
    assert (grouped.groups, grouped.grouped) == (1, len(sizes))

"""Index queries, after Gazette's index tests: local/remote, head, gaps, blocking, mod times."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gazette.broker.index import OFFSET_JUMP_AGE, Index
from gazette.fragment import CoverSet, Fragment, IndexClosedError
from gazette.protocol import protocol_pb2 as pb
from gazette.server.edge import grpc_status

OK = pb.Status.OK
NOT_YET = pb.Status.OFFSET_NOT_YET_AVAILABLE
BASE_TIME = 1_500_000_000


class FakeFile:
    def pread(self, offset: int, n: int) -> bytes:
        return b""


def build(*offsets: int) -> list[Fragment]:
    return [Fragment("", offsets[i], offsets[i + 1]) for i in range(0, len(offsets), 2)]


def with_mod_time(f: Fragment, t: int) -> Fragment:
    return Fragment(f.journal, f.begin, f.end, f.sum, f.codec, f.backing_store, t)


def span(resp: pb.ReadResponse) -> tuple[int, int]:
    return resp.fragment.begin, resp.fragment.end


async def query(
    ind: Index, offset: int, block: bool = False, end_offset: int = 0, begin_mod_time: int = 0
) -> pb.ReadResponse:
    req = pb.ReadRequest(
        offset=offset, block=block, end_offset=end_offset, begin_mod_time=begin_mod_time
    )
    resp, _ = await ind.query(req)
    return resp


async def test_remote_and_local_queries() -> None:
    ind = Index()
    s = build(100, 150, 150, 200, 200, 250)
    ind.replace_remote(CoverSet(s[:2]))

    resp, file = await ind.query(pb.ReadRequest(offset=110, block=True))
    assert (resp.status, resp.offset, resp.write_head, span(resp)) == (OK, 110, 200, (100, 150))
    assert file is None

    local = FakeFile()
    ind.spool_commit(s[2].with_file(local))
    resp, file = await ind.query(pb.ReadRequest(offset=210, block=True))
    assert (resp.offset, resp.write_head, span(resp)) == (210, 250, (200, 250))
    assert file is local


async def test_remote_replaces_local() -> None:
    ind = Index()
    ind.spool_commit(build(100, 200)[0].with_file(FakeFile()))
    resp, file = await ind.query(pb.ReadRequest(offset=110))
    assert span(resp) == (100, 200) and file is not None

    # Remote fragments cover the same span: the local one is dropped.
    ind.replace_remote(CoverSet(build(100, 150, 150, 200)))
    resp, file = await ind.query(pb.ReadRequest(offset=110))
    assert span(resp) == (100, 150) and file is None
    assert ind.first_refresh.is_set()


async def test_add_remote_replaces_equal_local_span() -> None:
    ind = Index(signer=lambda f, ttl: f"signed://{f.content_name()}?ttl={ttl:g}")
    ind.spool_commit(build(100, 200)[0].with_file(FakeFile()))
    remote = Fragment("", 100, 200, backing_store="file:///", mod_time=BASE_TIME)
    ind.add_remote(remote)
    resp, file = await ind.query(pb.ReadRequest(offset=150))
    assert file is None and resp.fragment.mod_time == BASE_TIME
    assert resp.fragment_url == f"signed://{remote.content_name()}?ttl=60"


async def test_query_at_head() -> None:
    ind = Index()
    ind.spool_commit(build(100, 200)[0])

    resp = await query(ind, -1)
    assert resp == pb.ReadResponse(status=NOT_YET, offset=200, write_head=200)

    # A blocking read at the head is woken by the next commit.
    task = asyncio.create_task(query(ind, 200, block=True))
    await asyncio.sleep(0)  # Let the query run up to its wait (a checkpoint, not a delay).
    assert not task.done()
    ind.spool_commit(build(200, 250)[0])
    resp = await asyncio.wait_for(task, 5)
    assert (resp.status, resp.offset, resp.write_head, span(resp)) == (OK, 200, 250, (200, 250))


async def test_query_at_missing_byte_zero() -> None:
    ind = Index()
    s = build(100, 200, 200, 300)
    ind.spool_commit(s[0])
    assert (await query(ind, 0)).status == NOT_YET

    # Once persisted (any mod time), a read from byte zero skips forward.
    ind.replace_remote(CoverSet([with_mod_time(s[0], BASE_TIME), s[1]]))
    resp = await query(ind, 0)
    assert (resp.status, resp.offset, resp.write_head, span(resp)) == (OK, 100, 300, (100, 200))


async def test_query_at_missing_middle() -> None:
    now = [float(BASE_TIME)]
    ind = Index(clock=lambda: now[0])
    s = build(100, 200, 300, 400)
    ind.spool_commit(s[0])
    ind.spool_commit(s[1])

    assert (await query(ind, 110)).status == OK
    assert (await query(ind, 210)).status == NOT_YET
    assert (await query(ind, 310)).status == OK

    # Persisted just now: no jump yet.
    ind.replace_remote(CoverSet([with_mod_time(f, BASE_TIME) for f in s]))
    assert (await query(ind, 210)).status == NOT_YET

    # A blocking read is satisfied by a fragment filling the gap.
    task = asyncio.create_task(query(ind, 210, block=True))
    await asyncio.sleep(0)
    ind.spool_commit(build(200, 250)[0])
    resp = await asyncio.wait_for(task, 5)
    assert (resp.offset, resp.write_head, span(resp)) == (210, 400, (200, 250))

    # Time passes the jump horizon; an unrelated update wakes the read, which jumps forward.
    task = asyncio.create_task(query(ind, 250, block=True))
    await asyncio.sleep(0)
    assert not task.done()
    now[0] = BASE_TIME + OFFSET_JUMP_AGE + 1
    ind.spool_commit(build(0, 1)[0])
    resp = await asyncio.wait_for(task, 5)
    assert (resp.status, resp.offset, span(resp), resp.fragment.mod_time) == (
        OK, 300, (300, 400), BASE_TIME,
    )  # fmt: skip
    assert resp.offset > 250  # The gap jump.

    # Non-blocking reads now jump immediately, too.
    assert (await query(ind, 250)).status == OK


async def test_query_with_begin_mod_time() -> None:
    begin_time = BASE_TIME
    s = build(100, 200, 200, 300, 300, 400, 400, 500, 500, 600)
    remote = [
        with_mod_time(s[0], begin_time - 10),
        with_mod_time(s[1], begin_time),
        with_mod_time(s[2], begin_time - 1),
        with_mod_time(s[3], begin_time + 100),
    ]
    ind = Index()
    ind.replace_remote(CoverSet(remote))
    ind.spool_commit(s[4])
    expect = [*remote, s[4]]
    for offset, i in [(50, 1), (150, 1), (200, 1), (350, 3), (400, 3), (500, 4)]:
        resp = await query(ind, offset, begin_mod_time=begin_time)
        assert resp.offset == expect[i].begin and resp.write_head == 600
        assert Fragment.from_proto(resp.fragment) == expect[i]


async def test_end_offset_does_not_block() -> None:
    ind = Index()
    ind.spool_commit(build(0, 100)[0])
    resp = await asyncio.wait_for(query(ind, 100, block=True, end_offset=100), 5)
    assert resp.status == NOT_YET


async def test_blocked_query_is_cancellable_and_close_releases() -> None:
    ind = Index()
    ind.spool_commit(build(100, 200)[0])
    task = asyncio.create_task(query(ind, -1, block=True))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    task = asyncio.create_task(query(ind, -1, block=True))
    await asyncio.sleep(0)
    ind.close()
    with pytest.raises(IndexClosedError) as info:
        await asyncio.wait_for(task, 5)
    # A read released by its replica stopping ends UNAVAILABLE (the client retries), not UNKNOWN.
    assert grpc_status(info.value) == (grpc.StatusCode.UNAVAILABLE, "index of journal was closed while waiting")


async def test_wait_for_offset_and_inspect() -> None:
    ind = Index()
    waiter = asyncio.create_task(ind.wait_for_offset(150))
    inspector = asyncio.create_task(ind.inspect())
    await asyncio.sleep(0)
    ind.spool_commit(build(100, 120)[0])
    await asyncio.sleep(0)
    assert not waiter.done() and not inspector.done()
    ind.replace_remote(CoverSet(build(100, 150)))
    await asyncio.wait_for(waiter, 5)
    assert [(f.begin, f.end) for f in await asyncio.wait_for(inspector, 5)] == [(100, 150)]
    assert ind.summary() == (100, 150, 0)

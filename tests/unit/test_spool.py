"""Spool transitions, after Gazette's spool tests, plus snapshot compression."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import threading
from typing import Any

import pytest

from gazette.broker.spool import Spool, SpoolFile, SpoolSnapshot
from gazette.fragment import ZERO_SUM, Fragment, SpoolError, codecs, sum_to_proto
from gazette.fragment.codecs import Codec
from gazette.protocol import protocol_pb2 as pb

CC = pb.CompressionCodec
OK = pb.Status.OK
MISMATCH = pb.Status.PROPOSAL_MISMATCH


def labels(value: str | None) -> pb.LabelSet:
    if value is None:
        return pb.LabelSet()
    return pb.LabelSet(labels=[pb.Label(name="reg", value=value)])


REG_EMPTY, REG_FOO, REG_BAR, REG_BAZ = labels(None), labels("foo"), labels("bar"), labels("baz")


def sha(s: bytes) -> pb.SHA1Sum:
    return sum_to_proto(hashlib.sha1(s).digest())


def frag(begin: int, end: int, content: bytes | None = None, codec: Codec = CC.NONE) -> pb.Fragment:
    m = pb.Fragment(journal="a/journal", begin=begin, end=end, compression_codec=codec)
    m.sum.CopyFrom(sha(content) if content else pb.SHA1Sum())
    return m


def proposal(f: pb.Fragment, registers: pb.LabelSet) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(proposal=f, registers=registers)


def content(data: bytes, delta: int = 0) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(content=data, content_delta=delta)


class Observer:
    def __init__(self) -> None:
        self.commits: list[Fragment] = []
        self.completes: list[SpoolSnapshot] = []

    def spool(self, **kw: Any) -> Spool:
        return Spool(
            "a/journal", on_commit=self.commits.append, on_complete=self.completes.append, **kw
        )


def read_all(snap: SpoolSnapshot) -> bytes:
    return b"".join(snap.iter_content())


def run_replicate_sequence(spool: Spool, codec: Codec, primary: bool) -> None:
    seq = [
        proposal(frag(0, 0, codec=codec), REG_EMPTY),  # Commit 0 (synchronize).
        content(b"an init", 0),
        content(b"ial write ", 7),
        proposal(frag(0, 17, b"an initial write ", codec), REG_FOO),  # Commit 1.
        content(b"WHO", 0),
        content(b"OPS!", 3),
        proposal(frag(0, 17, b"an initial write ", codec), REG_FOO),  # Rollback to commit 1.
        content(b"final write", 0),
        proposal(frag(0, 28, b"an initial write final write", codec), REG_BAR),  # Commit 2.
        content(b"extra ", 0),  # Streamed but never committed.
        content(b"partial content", 6),
        proposal(frag(28, 28, codec=codec), REG_BAR),  # Roll forward, completing the spool.
    ]
    for req in seq:
        resp = spool.apply(req, primary)
        if req.HasField("proposal"):
            assert resp == pb.ReplicateResponse(status=OK), req
            if spool.fragment.content_length == 0:
                assert spool.first_append_time is None
            else:
                assert spool.first_append_time == 86400.0
        else:
            assert resp == pb.ReplicateResponse()


def test_next_cases() -> None:
    spool = Observer().spool()
    assert spool.next() == frag(0, 0)

    spool.must_apply(proposal(frag(100, 100, codec=CC.SNAPPY), REG_EMPTY))
    assert spool.next() == frag(100, 100, codec=CC.SNAPPY)

    spool.apply(content(b"some"))
    spool.apply(content(b" content", 4))
    assert spool.next() == frag(100, 112, b"some content", CC.SNAPPY)
    assert spool.delta == 12


@pytest.mark.parametrize("codec", [CC.NONE, CC.GZIP, CC.SNAPPY, CC.ZSTANDARD])
@pytest.mark.parametrize("primary", [True, False])
def test_replicate_sequence(codec: Codec, primary: bool) -> None:
    obv = Observer()
    spool = obv.spool(clock=lambda: 86400.0)
    run_replicate_sequence(spool, codec, primary)

    assert len(obv.commits) == 2
    assert [(c.begin, c.end) for c in obv.commits] == [(0, 17), (0, 28)]
    assert all(c.file is not None for c in obv.commits)
    assert len(obv.completes) == 1
    snap = obv.completes[0]
    assert snap.primary is primary
    assert snap.fragment == Fragment.from_proto(frag(0, 28, b"an initial write final write", codec))
    assert snap.registers == REG_BAR
    assert snap.first_append_time == 86400.0
    assert read_all(snap) == b"an initial write final write"
    stored = b"".join(snap.iter_compressed(chunk_size=5))
    assert codecs.decompress(codec, stored) == b"an initial write final write"

    # The spool rolled to an empty fragment at 28, with the same registers.
    assert spool.fragment == Fragment("a/journal", 28, 28, ZERO_SUM, codec)
    assert spool.registers == REG_BAR
    assert spool.delta == 0 and spool.file is None


def test_reject_roll_before_current_end() -> None:
    spool = Observer().spool(clock=lambda: 86400.0)
    run_replicate_sequence(spool, CC.NONE, False)

    resp = spool.apply(proposal(frag(27, 27), REG_BAR))
    assert resp == pb.ReplicateResponse(
        status=MISMATCH, fragment=spool.fragment.to_proto(), registers=REG_BAR
    )
    assert spool.apply(proposal(frag(29, 29), REG_BAZ)) == pb.ReplicateResponse(status=OK)
    assert spool.registers == REG_BAZ


def test_more_mismatch_cases() -> None:
    obv = Observer()
    spool = obv.spool()
    spool.must_apply(proposal(frag(0, 0, codec=CC.GZIP), REG_EMPTY))
    spool.must_apply(content(b"abcd"))
    p = spool.next()
    spool.must_apply(proposal(p, REG_FOO))

    # Re-commit of exactly the current proposal succeeds.
    spool.must_apply(proposal(p, REG_FOO))
    # But not with other registers.
    resp = spool.apply(proposal(p, REG_BAR))
    assert resp.status == MISMATCH and resp.registers == REG_FOO

    spool.must_apply(content(b"efgh"))
    # A roll-back with incorrect registers is refused.
    assert spool.apply(proposal(spool.fragment.to_proto(), REG_BAR)).status == MISMATCH

    # A mismatched proposal within current bounds: no roll.
    p = spool.next()
    p.begin = 1
    assert spool.apply(proposal(p, REG_BAR)).status == MISMATCH
    assert spool.fragment.begin == 0 and spool.registers == REG_FOO and not obv.completes

    # Beyond current bounds: still a mismatch, but the spool rolls and takes the registers.
    p.end = 9
    assert spool.apply(proposal(p, REG_BAR)).status == MISMATCH
    assert (spool.fragment.begin, spool.fragment.end, spool.delta) == (9, 9, 0)
    assert spool.registers == REG_BAR
    assert len(obv.completes) == 1 and read_all(obv.completes[0]) == b"abcd"

    # Empty spool, proposal within bounds: unchanged.
    p.end = 8
    assert spool.apply(proposal(p, REG_BAZ)).status == MISMATCH
    assert spool.fragment.end == 9 and spool.registers == REG_BAR

    # Empty spool rolls beyond bounds; not a completion, as it is empty.
    p.end = 11
    assert spool.apply(proposal(p, REG_BAZ)).status == MISMATCH
    assert (spool.fragment.begin, spool.fragment.end) == (11, 11)
    assert spool.registers == REG_BAZ
    assert len(obv.completes) == 1


def test_reject_next_mismatch() -> None:
    spool = Observer().spool()
    assert spool.apply(content(b"foobar")) == pb.ReplicateResponse()

    foobar = pb.SHA1Sum(part1=0x8843D7F92416211D, part2=0xE9EBB963FF4CE281, part3=0x25932878)
    wrong_end = pb.Fragment(
        journal="a/journal", begin=0, end=5, sum=foobar, compression_codec=CC.NONE
    )
    expect = pb.ReplicateResponse(
        status=MISMATCH, fragment=spool.fragment.to_proto(), registers=REG_EMPTY
    )
    assert spool.apply(proposal(wrong_end, REG_FOO)) == expect

    bad_sum = pb.SHA1Sum(part1=0xFFFFFFFFFFFFFFFF, part2=foobar.part2, part3=foobar.part3)
    wrong_sum = pb.Fragment(
        journal="a/journal", begin=0, end=6, sum=bad_sum, compression_codec=CC.NONE
    )
    assert spool.apply(proposal(wrong_sum, REG_FOO)) == expect

    right = pb.Fragment(journal="a/journal", begin=0, end=6, sum=foobar, compression_codec=CC.NONE)
    assert spool.apply(proposal(right, REG_FOO)) == pb.ReplicateResponse(status=OK)
    assert spool.registers == REG_FOO


def test_content_delta_mismatch() -> None:
    spool = Observer().spool()
    spool.apply(content(b"foo", 0))
    with pytest.raises(SpoolError, match=r"invalid content_delta \(2; expected 3\)"):
        spool.apply(content(b"bar", 2))
    assert spool.delta == 3


def test_write_failure_leaves_spool_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Observer().spool()
    spool.apply(content(b"foo"))
    real = SpoolFile.pwrite
    calls = []

    def failing(self: SpoolFile, data: bytes, offset: int) -> None:
        calls.append(offset)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SpoolFile, "pwrite", failing)
    with pytest.raises(OSError):
        spool.apply(content(b"bar", 3))
    assert spool.delta == 3 and calls == [3]

    monkeypatch.setattr(SpoolFile, "pwrite", real)
    spool.apply(content(b"bar", 3))  # The same request, retried.
    spool.must_apply(proposal(spool.next(), REG_EMPTY))
    assert spool.fragment.sum == hashlib.sha1(b"foobar").digest()
    assert spool.fragment.file is not None
    assert spool.fragment.file.pread(0, 100) == b"foobar"


def test_missing_registers_are_empty() -> None:
    spool = Observer().spool()
    spool.apply(content(b"x"))
    assert spool.apply(pb.ReplicateRequest(proposal=spool.next())).status == OK
    assert spool.registers == REG_EMPTY
    # And a rollback without registers matches empty registers.
    assert spool.apply(pb.ReplicateRequest(proposal=spool.fragment.to_proto())).status == OK


def test_committed_reads_while_appending() -> None:
    obv = Observer()
    spool = obv.spool()
    spool.must_apply(content(b"a" * 1000))
    spool.must_apply(proposal(spool.next(), REG_EMPTY))
    committed = obv.commits[-1]
    assert committed.file is not None

    stop = threading.Event()
    seen: list[bytes] = []

    def reader() -> None:
        assert committed.file is not None
        while not stop.is_set():
            seen.append(committed.file.pread(0, 1000))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            spool.must_apply(content(b"b" * 4096, 0))
            if i % 2:
                spool.must_apply(proposal(spool.next(), REG_EMPTY))
            else:
                spool.must_apply(proposal(spool.fragment.to_proto(), REG_EMPTY))  # Rollback.
    finally:
        stop.set()
        t.join()
    assert seen and all(s == b"a" * 1000 for s in seen)
    assert spool.fragment.content_length == 1000 + 100 * 4096


def test_spool_file_closes_when_unreferenced(tmp_path: Any) -> None:
    f = SpoolFile(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # Unlinked on creation.
    f.pwrite(b"hello", 0)
    assert f.pread(0, 10) == b"hello"
    fd = f.fileno()
    del f
    import os

    with pytest.raises(OSError):
        os.fstat(fd)


BIG = bytes(range(256)) * 1024  # 256 KiB: at THREAD_MIN, so written by a worker thread


async def test_worker_write_commits_like_an_inline_one() -> None:
    spool = Observer().spool()
    spool.apply(content(b"foo"))
    w = spool.write_content(BIG, 3)
    assert w is not None
    with pytest.raises(AssertionError, match="in flight"):
        spool.apply(proposal(spool.fragment.to_proto(), REG_EMPTY))  # a rollback must wait
    await w.settle()
    assert spool.delta == 3 + len(BIG)
    spool.must_apply(proposal(spool.next(), REG_EMPTY))
    assert spool.fragment.sum == hashlib.sha1(b"foo" + BIG).digest()
    assert spool.fragment.file is not None
    assert spool.fragment.file.pread(0, 1 << 20) == b"foo" + BIG
    assert spool.write_content(b"short", 0) is None  # short chunks are applied inline


async def test_worker_write_failure_leaves_spool_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Observer().spool()
    spool.apply(content(b"foo"))
    real = SpoolFile.pwrite

    def failing(self: SpoolFile, data: bytes, offset: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SpoolFile, "pwrite", failing)
    w = spool.write_content(BIG, 3)
    assert w is not None
    with pytest.raises(OSError, match="No space"):
        await w.settle()
    assert spool.delta == 3
    w.settle_now()  # settling again is a no-op

    monkeypatch.setattr(SpoolFile, "pwrite", real)
    w = spool.write_content(BIG, 3)  # the same chunk, retried
    assert w is not None
    w.settle_now()
    spool.must_apply(proposal(spool.next(), REG_EMPTY))
    assert spool.fragment.sum == hashlib.sha1(b"foo" + BIG).digest()


async def test_cancelled_settle_waits_for_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cancelled owner must not give up the spool while the worker may still write into it:
    # a later chunk at the same offset would otherwise be overwritten by the stale one.
    spool = Observer().spool()
    started, release = threading.Event(), threading.Event()
    real = SpoolFile.pwrite

    def slow(self: SpoolFile, data: bytes, offset: int) -> None:
        started.set()
        assert release.wait(10)
        real(self, data, offset)

    monkeypatch.setattr(SpoolFile, "pwrite", slow)
    w = spool.write_content(BIG, 0)
    assert w is not None
    task = asyncio.ensure_future(w.settle())
    await asyncio.to_thread(started.wait, 10)
    blocked = threading.Event()
    real_wait = concurrent.futures.wait

    def observed_wait(fs: Any) -> Any:
        blocked.set()  # the cancelled settle now blocks on the worker
        return real_wait(fs)

    monkeypatch.setattr(concurrent.futures, "wait", observed_wait)
    # The worker may finish only once the cancelled settle is waiting for it.
    threading.Thread(target=lambda: blocked.wait(10) and release.set()).start()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert release.is_set()  # the cancelled settle returned only once the worker was done
    assert spool.delta == len(BIG)  # the chunk landed: the owner now rolls it back as usual
    spool.must_apply(proposal(spool.fragment.to_proto(), REG_EMPTY))
    assert spool.delta == 0

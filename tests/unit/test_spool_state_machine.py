"""Stateful property test: a Spool, its Index and a FileStore against a byte-string model.

Any interleaving of content chunks (applied at once, or by a worker thread), commits, rollbacks, rolls (with gaps and codec changes),
mismatched proposals and persists must leave fragments that exactly tile the committed bytes,
each summed over its content, and every committed offset must read back the model's bytes,
from the spool file or from the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gazette.broker import spool as spool_mod
from gazette.broker.index import Index
from gazette.broker.spool import Spool, SpoolSnapshot
from gazette.fragment import ZERO_SUM, Fragment, sum_to_proto
from gazette.fragment.codecs import Codec
from gazette.fragment.stores import FileStore
from gazette.protocol import protocol_pb2 as pb

CC = pb.CompressionCodec
JOURNAL = "a/journal"
CODECS = [CC.NONE, CC.GZIP, CC.SNAPPY, CC.ZSTANDARD]


def regs(v: str | None) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name="reg", value=v)] if v else [])


class SpoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.thread_min, spool_mod.THREAD_MIN = spool_mod.THREAD_MIN, 100
        self.root = tempfile.mkdtemp(prefix="spool-sm-")
        self.store = FileStore("file:///", self.root)
        self.index = Index()
        self.completed: list[SpoolSnapshot] = []
        self.spool = Spool(
            JOURNAL, on_commit=self.index.spool_commit, on_complete=self.completed.append
        )
        # Model: journal offset -> byte, for every committed offset.
        self.journal: dict[int, int] = {}
        self.tiles: list[tuple[int, int]] = []  # Completed non-empty fragments.
        self.begin = 0  # Current fragment.
        self.end = 0
        self.pending = b""
        self.codec: Codec = CC.NONE
        self.registers = regs(None)

    def teardown(self) -> None:
        spool_mod.THREAD_MIN = self.thread_min
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def span(self, begin: int, end: int) -> bytes:
        return bytes(self.journal[o] for o in range(begin, end))

    def expected_next(self) -> Fragment:
        data = self.span(self.begin, self.end) + self.pending
        end = self.end + len(self.pending)
        digest = hashlib.sha1(data).digest() if data else ZERO_SUM
        return Fragment(JOURNAL, self.begin, end, digest, self.codec)

    # -- Rules.

    @rule(data=st.binary(min_size=0, max_size=300))
    def write(self, data: bytes) -> None:
        resp = self.spool.apply(pb.ReplicateRequest(content=data, content_delta=len(self.pending)))
        assert resp == pb.ReplicateResponse()
        self.pending += data

    @rule(data=st.binary(min_size=1, max_size=300), blocking=st.booleans())
    def write_in_worker(self, data: bytes, blocking: bool) -> None:
        # The event loop's content transition: chunks of THREAD_MIN or more (lowered here)
        # are written and hashed by a worker thread, then settled.
        w = self.spool.write_content(data, len(self.pending))
        if len(data) >= spool_mod.THREAD_MIN:
            assert w is not None
            assert self.spool.delta == len(self.pending)  # not pending until settled
            if blocking:
                w.settle_now()
            else:
                self.loop.run_until_complete(w.settle())
        else:
            assert w is None
        assert self.spool.delta == len(self.pending) + len(data)
        self.pending += data

    @rule(reg=st.sampled_from([None, "foo", "bar"]))
    def commit(self, reg: str | None) -> None:
        expect = self.expected_next()
        assert Fragment.from_proto(self.spool.next()) == expect
        resp = self.spool.apply(
            pb.ReplicateRequest(proposal=expect.to_proto(), registers=regs(reg))
        )
        if not self.pending:
            # An empty commit is a rollback: it succeeds only with unchanged registers.
            ok = regs(reg) == self.registers
            assert resp.status == (pb.Status.OK if ok else pb.Status.PROPOSAL_MISMATCH)
            return
        assert resp.status == pb.Status.OK
        for i, b in enumerate(self.pending):
            self.journal[self.end + i] = b
        self.end += len(self.pending)
        self.pending = b""
        self.registers = regs(reg)

    @rule()
    def rollback(self) -> None:
        f = self.spool.fragment
        assert (f.begin, f.end) == (self.begin, self.end)
        req = pb.ReplicateRequest(proposal=f.to_proto(), registers=self.registers)
        assert self.spool.apply(req).status == pb.Status.OK
        self.pending = b""

    @rule(gap=st.integers(0, 4), codec=st.sampled_from(CODECS))
    def roll(self, gap: int, codec: Codec) -> None:
        to = self.end + gap
        req = pb.ReplicateRequest(
            proposal=Fragment(JOURNAL, to, to, ZERO_SUM, codec).to_proto(),
            registers=self.registers,
        )
        resp = self.spool.apply(req, primary=True)
        if 0 < gap <= len(self.pending):
            # Within reach of pending content: neither a roll nor a commit.
            assert resp.status == pb.Status.PROPOSAL_MISMATCH
            assert Fragment.from_proto(resp.fragment) == Fragment.from_proto(
                self.spool.fragment.to_proto()
            )
            return
        assert resp.status == pb.Status.OK
        if self.end > self.begin:
            self.tiles.append((self.begin, self.end))
        self.begin = self.end = to
        self.pending = b""
        self.codec = codec

    @rule(flip=st.integers(0, 19))
    def mismatched_commit(self, flip: int) -> None:
        bad = self.expected_next()
        digest = bytearray(bad.sum)
        digest[flip] ^= 1
        req = pb.ReplicateRequest(
            proposal=Fragment(JOURNAL, bad.begin, bad.end, bytes(digest), bad.codec).to_proto(),
            registers=self.registers,
        )
        resp = self.spool.apply(req)
        if bad.end == self.end and bad.sum == ZERO_SUM and self.end == self.begin:
            return  # Flipping the zero sum of an empty fragment: not interesting.
        assert resp.status == pb.Status.PROPOSAL_MISMATCH
        assert resp.registers == self.registers

    @precondition(lambda self: bool(self.completed))
    @rule()
    def persist_oldest(self) -> None:
        snap = self.completed.pop(0)
        stored = self.loop.run_until_complete(self.store.persist(snap))
        assert stored.backing_store == "file:///" and stored.mod_time > 0
        self.index.add_remote(stored)

    @rule(at=st.floats(0, 1))
    def read(self, at: float) -> None:
        if not self.journal:
            return
        offsets = sorted(self.journal)
        offset = offsets[int(at * (len(offsets) - 1))]
        resp, file = self.loop.run_until_complete(
            self.index.query(pb.ReadRequest(journal=JOURNAL, offset=offset))
        )
        assert resp.status == pb.Status.OK
        f = Fragment.from_proto(resp.fragment)
        assert f.begin <= offset < f.end and resp.offset == offset
        want = self.span(offset, f.end)
        if file is not None:
            got = file.pread(offset - f.begin, f.end - offset)
        else:
            assert f.backing_store == "file:///"

            async def collect() -> bytes:
                return b"".join([c async for c in self.store.open(f, offset)])

            got = self.loop.run_until_complete(collect())
        assert got == want

    @rule(at=st.integers(-1, 3))
    def read_unavailable(self, at: int) -> None:
        offset = -1 if at == -1 else self.end + at
        if offset in self.journal:
            return
        resp, file = self.loop.run_until_complete(
            self.index.query(pb.ReadRequest(journal=JOURNAL, offset=offset))
        )
        head = self.index.end_offset
        if offset == -1 or offset >= head:
            assert resp.status == pb.Status.OFFSET_NOT_YET_AVAILABLE
            assert resp.write_head == head and file is None

    # -- Invariants.

    @invariant()
    def fragments_tile_committed_bytes(self) -> None:
        tiles = [*self.tiles, (self.begin, self.end)]
        covered = [o for b, e in tiles for o in range(b, e)]
        assert covered == sorted(self.journal)  # Exactly tiled, no overlap.
        f = self.spool.fragment
        assert (f.begin, f.end, f.codec) == (self.begin, self.end, self.codec)
        want = self.span(self.begin, self.end)
        assert f.sum == (hashlib.sha1(want).digest() if want else ZERO_SUM)
        assert self.spool.registers == self.registers
        assert self.spool.delta == len(self.pending)

    @invariant()
    def completed_spools_hold_their_content(self) -> None:
        for snap in self.completed:
            data = b"".join(snap.iter_content())
            assert data == self.span(snap.fragment.begin, snap.fragment.end)
            assert snap.fragment.sum == hashlib.sha1(data).digest()
            assert sum_to_proto(snap.fragment.sum) == snap.fragment.to_proto().sum

    @invariant()
    def index_spans_committed_content(self) -> None:
        begin, end, _ = self.index.summary()
        if self.journal:
            assert (begin, end) == (min(self.journal), max(self.journal) + 1)


SpoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestSpoolMachine = SpoolMachine.TestCase

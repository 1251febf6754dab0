"""An in-process fake broker for app authors' tests (Gazette's ``brokertest``): the Journal
service (grpc.aio on 127.0.0.1:0) over in-memory journals, no etcd, no disks.

Use ``start_broker(FakeCluster())`` in a test, point a ``JournalClient`` at its address, and
append and read as against a real broker; script failures to test retries.

It implements List, Apply, Read, Append and ListFragments over a dict of journals held
by a ``FakeCluster`` (which several ``FakeBroker`` servers may share), with the
semantics of Gazette's broker for the parts clients see:
- Read: a metadata response (fragment, offset, write_head, header on the first) per
  fragment, then its content in chunks; OFFSET_NOT_YET_AVAILABLE at the head of a
  non-blocking read; blocking reads wait for appends; an offset before the first
  retained fragment jumps forward; ``fragment_url`` delegation when configured.
- Append: first request names the journal, then content, then an empty request
  commits; registers are checked, unioned and subtracted; offsets are checked.
- Scripted failures (``read_failures``/``append_failures``) answer the next calls with a
  status or abort them with a gRPC code.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSelector, LabelSet, with_meta_labels

pb_grpc: Any = importlib.import_module("gazette.protocol.protocol_pb2_grpc")

Failure = int | Any  # (a grpc.StatusCode) A pb.Status to answer with, or a gRPC code to abort with.


def sha1_sum(data: bytes) -> pb.SHA1Sum:
    d = hashlib.sha1(data).digest()
    p1, p2, p3 = struct.unpack(">QQI", d)
    return pb.SHA1Sum(part1=p1, part2=p2, part3=p3)


@dataclass
class FakeFragment:
    begin: int
    content: bytearray
    mod_time: int = 0
    backing_store: str = ""
    url: str = ""  # When set, reads with do_not_proxy are delegated to this URL.

    @property
    def end(self) -> int:
        return self.begin + len(self.content)


@dataclass
class FakeJournal:
    spec: pb.JournalSpec
    mod_revision: int
    create_revision: int
    fragments: list[FakeFragment] = field(default_factory=list)
    registers: LabelSet = field(default_factory=LabelSet)
    head: int = 0
    spool_open: bool = False

    def proto_fragment(self, f: FakeFragment) -> pb.Fragment:
        return pb.Fragment(journal=self.spec.name, begin=f.begin, end=f.end,
                           sum=sha1_sum(bytes(f.content)),
                           compression_codec=self.spec.fragment.compression_codec or pb.NONE,
                           backing_store=f.backing_store, mod_time=f.mod_time)


class FakeCluster:
    """Journal state shared by fake brokers."""

    def __init__(self) -> None:
        self.journals: dict[str, FakeJournal] = {}
        self.revision = 1
        self.changed = asyncio.Condition()

    def create(self, name: str, labels: dict[str, str] | None = None, **fragment: Any) -> FakeJournal:
        spec = pb.JournalSpec(name=name, replication=1)
        for k, v in sorted((labels or {}).items()):
            spec.labels.labels.add(name=k, value=v)
        spec.fragment.length = fragment.get("length", 1 << 20)
        spec.fragment.compression_codec = fragment.get("codec", pb.SNAPPY)
        spec.fragment.stores.extend(fragment.get("stores", ["file:///"]))
        spec.fragment.refresh_interval.seconds = 60
        if "retention" in fragment:
            spec.fragment.retention.seconds = fragment["retention"]
        return self.upsert(spec)

    def upsert(self, spec: pb.JournalSpec) -> FakeJournal:
        self.revision += 1
        j = self.journals.get(spec.name)
        if j is None:
            j = self.journals[spec.name] = FakeJournal(pb.JournalSpec(), self.revision, self.revision)
        j.spec.CopyFrom(spec)
        j.mod_revision = self.revision
        return j

    def write(self, name: str, data: bytes) -> tuple[int, int]:
        """Commit ``data`` to ``name`` (as an append would); returns its [begin, end)."""
        j = self.journals[name]
        begin = j.head
        if not j.spool_open or (j.spec.fragment.length and
                                j.fragments[-1].end - j.fragments[-1].begin >= j.spec.fragment.length):
            j.fragments.append(FakeFragment(j.head, bytearray(), mod_time=0))
            j.spool_open = True
        j.fragments[-1].content += data
        j.head += len(data)
        return begin, j.head

    def roll(self, name: str, persisted_at: int | None = None) -> None:
        """Close the current spool (as persisted to the store at ``persisted_at``)."""
        j = self.journals[name]
        if j.fragments and j.spool_open:
            j.fragments[-1].mod_time = persisted_at if persisted_at is not None else int(time.time())
            j.fragments[-1].backing_store = j.spec.fragment.stores[0] if j.spec.fragment.stores else ""
        j.spool_open = False

    def drop_before(self, name: str, offset: int) -> None:
        """Remove fragments ending at or before ``offset`` (as retention would)."""
        j = self.journals[name]
        j.fragments = [f for f in j.fragments if f.end > offset]

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()


class FakeBroker(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self, cluster: FakeCluster, suffix: str = "fake-broker", chunk_size: int = 5) -> None:
        self.cluster = cluster
        self.process_id = pb.ProcessSpec.ID(zone="local", suffix=suffix)
        self.endpoint = ""
        self.chunk_size = chunk_size
        self.list_page = 2  # Journals per ListResponse message.
        self.route_to: FakeBroker | None = None  # Advertise this broker as the journals' primary.
        self.read_failures: list[Failure] = []
        self.append_failures: list[Failure] = []
        self.calls: list[tuple[str, str]] = []
        self.before_apply: Any = None  # Called before each Apply (e.g. to race an edit).
        self.server: Any = None

    async def start(self) -> FakeBroker:
        self.server = grpc.aio.server()
        pb_grpc.add_JournalServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        await self.server.start()
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)

    def header(self) -> pb.Header:
        owner = self.route_to or self
        hdr = pb.Header(process_id=self.process_id)
        hdr.route.members.append(owner.process_id)
        hdr.route.endpoints.append(owner.endpoint)
        hdr.route.primary = 0
        hdr.etcd.revision = self.cluster.revision
        hdr.etcd.cluster_id = 1
        return hdr

    # --- List / Apply / ListFragments -------------------------------------------------

    async def List(self, req: pb.ListRequest, ctx: Any) -> AsyncIterator[pb.ListResponse]:
        self.calls.append(("List", ""))
        sel = LabelSelector.from_proto(req.selector)
        matched = []
        for name in sorted(self.cluster.journals):
            j = self.cluster.journals[name]
            if sel.matches(with_meta_labels(LabelSet.from_proto(j.spec.labels), name)):
                entry = pb.ListResponse.Journal(spec=j.spec, mod_revision=j.mod_revision,
                                                create_revision=j.create_revision)
                entry.route.CopyFrom(self.header().route)
                matched.append(entry)
        yield pb.ListResponse(status=pb.OK, header=self.header(), journals=matched[:self.list_page])
        for i in range(self.list_page, len(matched), self.list_page):
            yield pb.ListResponse(journals=matched[i:i + self.list_page])

    async def Apply(self, req: pb.ApplyRequest, ctx: Any) -> pb.ApplyResponse:
        self.calls.append(("Apply", ""))
        if self.before_apply is not None:
            self.before_apply()
        js = self.cluster.journals
        for ch in req.changes:
            name = ch.upsert.name if ch.HasField("upsert") else ch.delete
            cur = js.get(name)
            if ch.expect_mod_revision == -1:
                continue
            if (cur.mod_revision if cur else 0) != ch.expect_mod_revision:
                return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=self.header())
        for ch in req.changes:
            if ch.HasField("upsert"):
                self.cluster.upsert(ch.upsert)
            else:
                js.pop(ch.delete, None)
                self.cluster.revision += 1
        return pb.ApplyResponse(status=pb.OK, header=self.header())

    async def ListFragments(self, req: pb.FragmentsRequest, ctx: Any) -> pb.FragmentsResponse:
        self.calls.append(("ListFragments", req.journal))
        j = self.cluster.journals.get(req.journal)
        if j is None:
            return pb.FragmentsResponse(status=pb.JOURNAL_NOT_FOUND, header=self.header())
        out = pb.FragmentsResponse(status=pb.OK, header=self.header())
        frags = [f for f in j.fragments if f.begin >= req.next_page_token]
        for f in frags:
            if req.begin_mod_time and f.mod_time and f.mod_time < req.begin_mod_time:
                continue
            if req.end_mod_time and f.mod_time >= req.end_mod_time:
                continue
            if req.page_limit and len(out.fragments) == req.page_limit:
                out.next_page_token = f.begin
                break
            out.fragments.add(spec=j.proto_fragment(f))
        return out

    # --- Read -----------------------------------------------------------------------

    async def _fail(self, failures: list[Failure], ctx: Any) -> int | None:
        if not failures:
            return None
        f = failures.pop(0)
        if isinstance(f, grpc.StatusCode):
            await ctx.abort(f, "scripted failure")
        return int(f)

    async def Read(self, req: pb.ReadRequest, ctx: Any) -> AsyncIterator[pb.ReadResponse]:
        self.calls.append(("Read", req.journal))
        status = await self._fail(self.read_failures, ctx)
        if status is not None:
            yield pb.ReadResponse(status=status, header=self.header())  # type: ignore[arg-type]
            return
        j = self.cluster.journals.get(req.journal)
        if j is None:
            yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=self.header())
            return
        offset = j.head if req.offset < 0 else req.offset
        first = True
        while True:
            frag = next((f for f in j.fragments if f.end > offset), None)
            if frag is None or offset >= j.head:
                if not req.block:
                    resp = pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=offset,
                                           write_head=j.head)
                    if first:
                        resp.header.CopyFrom(self.header())
                    yield resp
                    return
                async with self.cluster.changed:
                    await self.cluster.changed.wait_for(lambda at=offset: j.head > at)  # type: ignore[misc]
                continue
            offset = max(offset, frag.begin)
            meta = pb.ReadResponse(status=pb.OK, offset=offset, write_head=j.head,
                                   fragment=j.proto_fragment(frag))
            if first:
                meta.header.CopyFrom(self.header())
                first = False
            if frag.url and req.do_not_proxy:
                meta.fragment_url = frag.url
                yield meta
                return
            yield meta
            if req.metadata_only:
                return
            end = frag.end
            while offset < end:
                n = min(self.chunk_size, end - offset)
                if req.end_offset:
                    n = min(n, req.end_offset - offset)
                yield pb.ReadResponse(offset=offset, content=bytes(
                    frag.content[offset - frag.begin:offset - frag.begin + n]))
                offset += n
                if req.end_offset and offset >= req.end_offset:
                    return

    # --- Append ---------------------------------------------------------------------

    async def Append(self, it: Any, ctx: Any) -> pb.AppendResponse:
        requests = it.__aiter__()
        first = await requests.__anext__()
        self.calls.append(("Append", first.journal))
        status = await self._fail(self.append_failures, ctx)
        if status is not None:
            return pb.AppendResponse(status=status, header=self.header())  # type: ignore[arg-type]
        j = self.cluster.journals.get(first.journal)
        if j is None:
            return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=self.header())
        if first.HasField("check_registers"):
            sel = LabelSelector.from_proto(first.check_registers)
            if not sel.matches(j.registers):
                return pb.AppendResponse(status=pb.REGISTER_MISMATCH, header=self.header(),
                                         registers=j.registers.to_proto())
        if first.offset and first.offset != j.head:
            return pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, header=self.header())
        content = bytearray()
        committed = False
        async for req in requests:
            if not req.content:
                committed = True
            else:
                content += req.content
        if not committed:
            await ctx.abort(grpc.StatusCode.ABORTED, "append stream closed before commit")
        begin, end = self.cluster.write(first.journal, bytes(content)) if content else (j.head, j.head)
        regs = j.registers
        if first.HasField("union_registers"):
            regs = regs.union(LabelSet.from_proto(first.union_registers))
        if first.HasField("subtract_registers"):
            regs = regs.subtract(LabelSet.from_proto(first.subtract_registers))
        j.registers = regs
        await self.cluster.notify()
        return pb.AppendResponse(
            status=pb.OK, header=self.header(), registers=regs.to_proto(),
            commit=pb.Fragment(journal=first.journal, begin=begin, end=end,
                               sum=sha1_sum(bytes(content)), compression_codec=pb.NONE))


async def start_broker(cluster: FakeCluster | None = None, **kwargs: Any) -> FakeBroker:
    return await FakeBroker(cluster or FakeCluster(), **kwargs).start()

"""The Append RPC: atomic, serialized appends to a journal through its primary.

Flow (Gazette's append state machine, for the local pipeline):

    resolve → (proxy to the primary | acquire the replica's pipeline)
    → validate preconditions (registers, offsets, suspension)
    → maybe roll the spool → stream content chunks into the spool
    → on the client's empty "commit" chunk followed by end-of-stream:
      propose spool.next() with updated registers → respond with the commit.

Invariants:
* One append holds a replica's pipeline at a time, so appends never interleave.
* Content is applied to the spool uncommitted; readers see it only after the
  commit proposal is applied. Any other ending (the client disconnects, sends
  a bad chunk, the RPC is cancelled, the journal refuses writes) proposes the
  spool's current fragment, rolling the pending content back, before the
  pipeline is released. A journal offset is never assigned twice.
* The response's ``commit`` places exactly this append's bytes: begin/end
  offsets and the SHA1 of the client's content.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from gazette import labels
from gazette.broker import metrics
from gazette.broker.fragment import Fragment, sum_to_proto
from gazette.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    from gazette.broker.replica import Replica
    from gazette.broker.server import Broker

log = logging.getLogger(__name__)


class AppendStreamError(Exception):
    """The client's request stream broke the Append protocol."""


def may_write(spec: pb.JournalSpec) -> bool:
    return spec.flags == pb.JournalSpec.NOT_SPECIFIED or bool(spec.flags & (pb.JournalSpec.O_WRONLY | pb.JournalSpec.O_RDWR))


def may_read(spec: pb.JournalSpec) -> bool:
    return spec.flags == pb.JournalSpec.NOT_SPECIFIED or bool(spec.flags & (pb.JournalSpec.O_RDONLY | pb.JournalSpec.O_RDWR))


def maybe_roll(cur: Fragment, first_append: float | None, roll_to: int,
               spec: pb.JournalSpec.Fragment, now: float) -> Fragment:
    """The fragment the next append extends: the current one, or an empty one at its end.

    Rolls when the spool is empty (trivially, to pick up the spec's codec), longer than the
    spec's fragment length, asked to move to ``roll_to``, or begun in an earlier flush interval.
    """
    length = cur.content_length
    flush = length == 0 or length > spec.length or (roll_to != 0 and roll_to != cur.begin)
    interval = spec.flush_interval.seconds
    if interval > 0 and first_append is not None and int(first_append) // interval != int(now) // interval:
        flush = True
    if not flush:
        return cur
    end = cur.end
    if roll_to != 0:
        assert end <= roll_to, "invalid roll_to offset"
        end = roll_to
    return Fragment(cur.journal, end, end, codec=spec.compression_codec)


def _response(status: int, header: pb.Header) -> pb.AppendResponse:
    resp = pb.AppendResponse(status=status)  # type: ignore[arg-type]
    resp.header.CopyFrom(header)
    return resp


async def append(broker: Broker, first: pb.AppendRequest, rest: AsyncIterator[pb.AppendRequest]) -> pb.AppendResponse:
    """Serves one Append; ``rest`` yields the content chunks after ``first``."""
    min_rev = first.min_etcd_revision
    while True:
        res = await broker.resolver.resolve(
            first.journal,
            may_proxy=not first.do_not_proxy,
            require_primary=True,
            min_etcd_revision=min_rev,
            proxy_header=first.header if first.HasField("header") else None,
        )
        if res.status == pb.SUSPENDED and first.suspend == pb.AppendRequest.SUSPEND_RESUME:
            assert res.spec is not None
            min_rev = await broker.update_suspend(res, pb.JournalSpec.Suspend.NONE, res.spec.suspend.offset)
            continue
        if res.status != pb.OK:
            return _response(res.status, res.header)
        assert res.spec is not None
        if not res.is_local:
            return await _proxy(broker, first, rest, res.header)
        n, desired = len(res.route.members), res.spec.replication
        if n > desired:  # allocator will shrink the route: wait for it
            min_rev = res.header.etcd.revision + 1
            continue
        if n < desired:
            return _response(pb.INSUFFICIENT_JOURNAL_BROKERS, res.header)
        if res.replica is None:
            min_rev = res.header.etcd.revision + 1
            continue
        break

    replica = res.replica
    await replica.wait_first_refresh()
    await replica.wait_primary_ready()
    async with replica.pipeline:
        status, roll_to = _preconditions(replica, first, res.spec)
        if status == pb.SUSPENDED and first.suspend == pb.AppendRequest.SUSPEND_RESUME:
            status = pb.OK
        if status != pb.OK:
            return _response(status, res.header)
        resp = await _stream(replica, first, rest, res.spec, roll_to, res.header)
    metrics.APPENDS.labels(pb.Status.Name(resp.status)).inc()
    return resp


def _preconditions(replica: Replica, first: pb.AppendRequest, spec: pb.JournalSpec) -> tuple[int, int]:
    spool = replica.spool
    registers = spool.registers
    fresh = replica.fresh_roll_offset()
    if fresh:
        replica.apply(pb.ReplicateRequest(proposal=pb.Fragment(journal=replica.journal, begin=fresh, end=fresh,
                                                                compression_codec=spec.fragment.compression_codec),
                                          registers=registers))
    if first.HasField("check_registers") and len(registers.labels) != 0:
        sel = labels.LabelSelector.from_proto(first.check_registers)
        if not sel.matches(labels.LabelSet.from_proto(registers)):
            return pb.REGISTER_MISMATCH, 0
    index_max = replica.index.end_offset
    end = spool.fragment.end
    max_offset = max(end, index_max)
    if end < spec.suspend.offset:
        return pb.OK, spec.suspend.offset
    if end != max_offset and first.offset == 0 and may_write(spec):
        return pb.INDEX_HAS_GREATER_OFFSET, 0
    if first.offset != 0 and first.offset != max_offset:
        return pb.WRONG_APPEND_OFFSET, 0
    if first.suspend == pb.AppendRequest.SUSPEND_NO_RESUME and spec.suspend.level != pb.JournalSpec.Suspend.NONE:
        return pb.SUSPENDED, 0
    if first.offset != 0 and end != max_offset:
        return pb.OK, max_offset
    return pb.OK, 0


async def _stream(
    replica: Replica,
    first: pb.AppendRequest,
    rest: AsyncIterator[pb.AppendRequest],
    spec: pb.JournalSpec,
    roll_to: int,
    header: pb.Header,
) -> pb.AppendResponse:
    spool = replica.spool
    proposal = maybe_roll(spool.fragment, spool.first_append_time, roll_to, spec.fragment, time.time())
    if proposal != spool.fragment:
        replica.apply(pb.ReplicateRequest(proposal=proposal.to_proto(), registers=spool.registers))

    begin = spool.fragment.end
    started = time.monotonic()
    summer = hashlib.sha1()
    delta = 0
    chunks = 0
    committed = False
    status = pb.OK
    writable = may_write(spec)
    try:
        async for req in rest:
            if req.journal:
                raise AppendStreamError("expected Content chunk")
            if committed:
                raise AppendStreamError("expected EOF after empty Content chunk")
            content = req.content  # each access of a bytes field copies it: read it once
            if not content:
                committed = True
                continue
            if not writable:
                status = pb.NOT_ALLOWED
                break
            if first.suspend in (pb.AppendRequest.SUSPEND_IF_FLUSHED, pb.AppendRequest.SUSPEND_NOW, pb.AppendRequest.SUSPEND_KEEP):
                status = pb.NOT_ALLOWED
                break
            replica.apply_content(content, delta)
            summer.update(content)
            delta += len(content)
            chunks += 1
        if status == pb.OK and not committed:
            raise AppendStreamError("unexpected EOF before the commit chunk")
        if status == pb.OK and delta == 0 and (first.HasField("union_registers") or first.HasField("subtract_registers")):
            raise AppendStreamError("register modification requires non-empty Append")
    except BaseException:  # including cancellation: roll back before releasing the pipeline
        replica.rollback()
        raise
    if status != pb.OK:
        replica.rollback()
        return _response(status, header)

    regs = labels.LabelSet.from_proto(spool.registers)
    if first.HasField("subtract_registers"):
        regs = regs.subtract(labels.LabelSet.from_proto(first.subtract_registers))
    if first.HasField("union_registers"):
        regs = labels.LabelSet.from_proto(first.union_registers).union(regs)
    new_regs = regs.to_proto()
    nxt = spool.next()
    replica.apply(pb.ReplicateRequest(proposal=nxt, registers=new_regs, acknowledge=True))
    metrics.APPEND_BYTES.inc(delta)
    metrics.COMMIT_SECONDS.observe(time.monotonic() - started)

    resp = _response(pb.OK, header)
    resp.commit.journal = replica.journal
    resp.commit.begin = begin
    resp.commit.end = begin + delta
    resp.commit.sum.CopyFrom(sum_to_proto(summer.digest()))
    resp.commit.compression_codec = spool.fragment.codec
    resp.registers.CopyFrom(new_regs)
    resp.total_chunks = chunks
    return resp


async def _proxy(broker: Broker, first: pb.AppendRequest, rest: AsyncIterator[pb.AppendRequest], header: pb.Header) -> pb.AppendResponse:
    stub = broker.peer_stub(header.route.endpoints[header.route.primary] if header.route.endpoints else "")
    fwd = pb.AppendRequest()
    fwd.CopyFrom(first)
    fwd.header.CopyFrom(header)

    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield fwd
        async for req in rest:
            yield req

    resp: pb.AppendResponse = await stub.Append(requests())
    return resp

"""Group commit: the Append calls that arrived whole in one read of a connection, committed
together.

A writer's client multiplexes its appends on one connection, so one read of the socket often
holds several whole Append calls (HEADERS, the first request, content, the empty commit chunk
and END_STREAM each). The transport hands them here together (``rpc/server.py``'s batched
methods; ``Broker.register_services`` registers :class:`AppendGroups` for Append), and the
calls of one group are served by one run of the append state machine, one write of their
content, and one commit, where each would otherwise run all of it alone.

Invariants:

* Only *plain* calls group, and only with calls of the same first request (the same shared,
  validated message: ``wire.decode_append_request``) and the same authorization: no offset,
  no register check or change, suspension mode ``SUSPEND_RESUME`` (the default), one or more
  non-empty content chunks of at most :data:`GROUP_CALL_BYTES` in all, then the commit chunk
  and the end of the stream. Any other call is served alone, by ``append.serve_append``.
* A group is served by one state machine run for its first call's request. If it does not
  reach STREAM_CONTENT ready to take the content (an error status, a proxy, a suspended or
  read-only journal, a metered append rate), nothing was written, and every call is served
  alone, concurrently, exactly as it would have been without the group.
* The calls' content lands contiguously in their order (the transport's: the order their
  streams opened), each call's range ``[begin, end)`` right after the previous one's. One
  proposal commits them all or rolls them all back: each call is answered its own commit
  (offsets, SHA-1 of its content, chunk count), or the error that failed the group.
* Errors end each call as ``serve_append`` would end it (``edge.end_rpc``'s mapping).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import grpc.aio

from gazette import auth
from gazette.auth import Claims, token_of
from gazette.broker import metrics
from gazette.broker.append import (
    STREAM_CONTENT,
    AppendFSM,
    append_plan,
    encode_committed,
    maybe_roll,
    run_append,
)
from gazette.broker.context import BrokerContext
from gazette.broker.spool import EMPTY_SHA1
from gazette.broker.wire import COMMIT, ContentChunk, validated
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.server import BatchCall, BufferedRequests
from gazette.server.edge import end_rpc

GROUP_CALL_BYTES: Final = 128 * 1024
"""A call whose content is larger is served alone: its own write costs more than the state
machine's run that grouping would save it."""

_SUSPEND_RESUME: Final[int] = pb.AppendRequest.SUSPEND_RESUME


def _plain(first: pb.AppendRequest) -> bool:
    return (first.offset == 0 and first.suspend == _SUSPEND_RESUME
            and not first.HasField("check_registers") and not first.HasField("union_registers")
            and not first.HasField("subtract_registers"))


class AppendGroups:
    """The Append method's batch servicer (``rpc.server.BatchServicer``)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def group_key(self, call: BatchCall) -> object | None:
        reqs = call.requests
        n = len(reqs)
        if n < 3 or reqs[n - 1] is not COMMIT:
            return None
        first = reqs[0]
        if isinstance(first, ContentChunk) or not validated(first) or not _plain(first):
            return None
        size = 0
        for i in range(1, n - 1):
            chunk = reqs[i]
            if type(chunk) is not ContentChunk:
                return None
            size += len(chunk.content)
        if size > GROUP_CALL_BYTES:
            return None
        return (id(first), token_of(call.ctx.invocation_metadata()))

    async def serve_group(self, calls: list[BatchCall]) -> list[Any]:
        broker = self.broker
        first: pb.AppendRequest = calls[0].requests[0]
        failed: Exception | None = None
        claims: Claims | None = None
        fsm: AppendFSM | None = None
        outcomes: list[Any] | None = None
        try:
            claims = broker.verifier.verify(token_of(calls[0].ctx.invocation_metadata()), auth.APPEND)
            fsm = AppendFSM(broker, first, claims, None)
            await fsm.run_to_stream()
            if fsm.state == STREAM_CONTENT:
                outcomes = await _stream(fsm, calls)
        except Exception as err:  # noqa: BLE001 - each call ends with it (a cancellation passes)
            failed = err
        finally:
            if fsm is not None:
                fsm.release()
        if failed is not None:
            return [await _ended(call, failed) for call in calls]
        if outcomes is None:
            return list(await asyncio.gather(*(_alone(broker, call, claims) for call in calls)))
        return outcomes


async def _stream(fsm: AppendFSM, calls: list[BatchCall]) -> list[Any] | None:
    """STREAM_CONTENT through the acknowledgements for the whole group (``AppendFSM.stream``
    for content that is all here); None, having written nothing, if the calls must be served
    alone."""
    res, pln = fsm.res, fsm.pln
    assert res is not None and res.spec is not None and pln is not None
    plan = append_plan(res)
    if fsm.status != pb.OK or not plan.writable or plan.max_append_rate or fsm.broker.config.max_append_rate:
        return None
    spool = pln.spool
    frag = spool.fragment
    proposal = maybe_roll(frag, spool.first_append_time, fsm.roll_to, res.spec.fragment, time.time())
    if proposal is not frag and proposal != frag:
        await pln.scatter(pb.ReplicateRequest(proposal=proposal.to_proto(), registers=fsm.registers))
        frag = proposal

    begin = frag.end
    started = time.monotonic()
    parts: list[memoryview] = []
    spans: list[tuple[int, int, int]] = []  # each call's begin, end and chunks
    offset = begin
    for call in calls:
        reqs = call.requests
        n = len(reqs) - 1  # the commit chunk's index
        size = 0
        for i in range(1, n):
            content = reqs[i].content
            parts.append(content)
            size += len(content)
        spans.append((offset, offset + size, n - 1))
        offset += size
    digests: list[bytes] = []

    def sums() -> None:  # each call's SHA-1, while a worker writes and hashes a long group
        for call in calls:
            reqs = call.requests
            summer = EMPTY_SHA1.copy()
            for i in range(1, len(reqs) - 1):
                summer.update(reqs[i].content)
            digests.append(summer.digest())

    err: BaseException | None = None
    try:
        await pln.scatter_content(b"".join(parts), 0, sums)
    except BaseException as e:  # noqa: BLE001 - including cancellation: roll back, then re-raise
        err = e
    commit = err is None and not pln.broken
    final = spool.next_fragment() if commit else spool.fragment
    await fsm.conclude(final, fsm.registers, not pln.peers)
    if err is not None:
        raise err
    if fsm.err is not None:
        raise fsm.err
    assert commit
    head, journal, codec = plan.header_field(res.header), spool.journal, final.codec
    registers = fsm.registers_wire  # as the local spool committed them
    metrics.APPENDS_TALLY.group_committed([hi - lo for lo, hi, _ in spans], time.monotonic() - started)
    out: list[Any] = []
    for (lo, hi, chunks), digest in zip(spans, digests, strict=True):
        out.append(encode_committed(head, journal, lo, hi, digest, codec, registers, chunks))
    return out


async def _alone(broker: BrokerContext, call: BatchCall, claims: Claims | None) -> Any:
    """``call`` served by itself, as ``serve_append`` serves it: its response or its error."""
    reqs = call.requests
    failed: Exception
    try:
        return await run_append(broker, reqs[0], BufferedRequests(reqs[1:]), claims, True)
    except Exception as err:  # noqa: BLE001 - mapped below (a cancellation passes)
        failed = err
    return await _ended(call, failed)


async def _ended(call: BatchCall, err: Exception) -> BaseException:
    """``err`` as it ends ``call``: the abort ``edge.end_rpc`` raises for it."""
    outcome: BaseException = err
    try:
        await end_rpc("Append", call.ctx, err)
    except grpc.aio.AbortError as aborted:
        outcome = aborted
    return outcome

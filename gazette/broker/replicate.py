"""The Replicate RPC: a peer serving a primary's pipeline, and the primary's end of the stream.

Peer side (:func:`serve`), Gazette's ``Replicate`` (broker/replicate_api.go):

* The first request carries a header (route and etcd revision of the primary's resolution),
  a proposal, registers and ``acknowledge``. The peer reads its keyspace through that
  revision, then resolves the journal. If it is not a replica of that journal (any status
  but OK), or its route is not the primary's, it answers that status (WRONG_ROUTE for a
  different route) with its own header and ends the stream, so the primary can tell
  whether to read through a later revision.
* It then owns the replica's spool for the life of the stream (the replica's
  ``spool_lock``): local appends and other Replicate streams wait. Waiting for the spool
  is abandoned, and the journal re-resolved, if the journal's assignments change meanwhile.
* Each request is applied to the spool in order; a response is sent only when
  ``acknowledge`` is set (the first carries the peer's header). A proposal the spool cannot
  take answers PROPOSAL_MISMATCH with the spool's fragment and registers; an unacknowledged
  request that fails ends the stream with an error. When the stream ends, however it
  ends, uncommitted content is rolled back and the spool is released.
* Spools completed by acknowledged proposals (a pipeline's synchronisation closing a
  fragment after a change of topology) are persisted at once rather than after the
  persister's replica delay, so content that only this peer holds reaches the store soon.

Content requests take a fast path: their wire form is parsed here, without building a
message, and the spool is handed a view of the received bytes (no copy). A long chunk is
written and hashed by a worker thread while the next request is read; it is settled before
the spool takes anything else, and when the stream ends. Anything that is
not a plain content request goes through the generated parser.

Primary side: :class:`GrpcPeerStream` adapts a gRPC stream-stream call (whose requests are
pre-serialized bytes) to the pipeline's ``PeerStream``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc

from gazette.allocator import routes_equivalent
from gazette.broker.context import BrokerContext
from gazette.broker.replica import acquire_unless
from gazette.broker.spool import ContentWrite, Spool
from gazette.broker.wire import Content, decode_request
from gazette.errors import GazetteError
from gazette.fragment.errors import SpoolError
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import validate
from gazette.protocol.errors import ValidationError
from gazette.server.cluster import ForeignCluster, MisroutedRequest

log = logging.getLogger(__name__)


class ReplicateStreamError(GazetteError):
    """The Replicate stream broke the protocol; ends the RPC with ``code``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        # Per instance, shadowing the class's (the one error class whose code varies).
        self.grpc_code = code.name  # type: ignore[misc]


def _validate(req: pb.ReplicateRequest) -> None:
    try:
        validate.validate_replicate_request(req)
    except ValidationError as err:
        raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None


_ProposalShape = tuple[str, str, int, str, bytes]


def _proposal_shape(req: pb.ReplicateRequest) -> _ProposalShape | None:
    """What the validity of a header-less proposal depends on, besides its offsets and
    content fields; None for any other request."""
    if req.HasField("header") or not req.HasField("proposal"):
        return None
    p = req.proposal
    return (p.journal, p.path_postfix, p.compression_codec, req.deprecated_journal,
            req.registers.SerializeToString())


class _Validator:
    """Validates a stream's requests. A proposal of the same journal, path postfix, codec,
    deprecated journal and registers as the last one found valid (every commit of an
    append stream) only has its offsets and content fields checked: validation of its
    names and labels would repeat exactly."""

    __slots__ = ("_shape",)

    def __init__(self) -> None:
        self._shape: _ProposalShape | None = None

    def __call__(self, req: pb.ReplicateRequest) -> None:
        shape = _proposal_shape(req)
        if shape is not None and shape == self._shape:
            p = req.proposal
            if p.begin <= p.end and req.content_delta == 0 and not req.content:
                return
        _validate(req)
        self._shape = shape


def _status(status: int, header: pb.Header) -> pb.ReplicateResponse:
    resp = pb.ReplicateResponse(status=status)  # type: ignore[arg-type]
    resp.header.CopyFrom(header)
    return resp


async def serve(broker: BrokerContext, requests: AsyncIterator[Any],
                send: Callable[[pb.ReplicateResponse], Awaitable[Any]]) -> None:
    """Serves one Replicate stream (see the module docstring); ``requests`` yields raw bytes
    or messages, responses go to ``send`` (a servicer context's ``write``). Protocol
    violations raise ReplicateStreamError. A coroutine rather than an async generator, which
    the compiled build cannot compile."""
    try:
        raw = await anext(requests)
    except StopAsyncIteration:
        raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, "expected an initial ReplicateRequest") from None
    try:
        first = decode_request(raw)
    except Exception as err:  # noqa: BLE001 - undecodable bytes from the client
        raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ReplicateRequest: {err}") from None
    if isinstance(first, tuple) or not first.HasField("proposal"):
        raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, "expected first ReplicateRequest to have a proposal")
    _validate(first)
    if not first.HasField("header"):
        raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, "expected first ReplicateRequest to have Header")

    journal = first.proposal.journal
    while True:
        try:
            res = await broker.resolver.resolve(
                journal, may_proxy=False, require_primary=False, proxy_header=first.header
            )
        except (ForeignCluster, MisroutedRequest) as refused:
            raise ReplicateStreamError(grpc.StatusCode.FAILED_PRECONDITION, str(refused)) from None
        if res.status != pb.OK:
            await send(_status(res.status, res.header))
            return
        if not routes_equivalent(res.route, first.header.route):
            await send(_status(pb.WRONG_ROUTE, res.header))
            return
        replica = res.replica
        if replica is None or replica.cancelled:
            await send(_status(pb.NOT_JOURNAL_BROKER, res.header))
            return
        if await acquire_unless(replica.spool_lock, replica.route_signal if res.signal is None else res.signal):
            break  # else the assignments changed while we waited: resolve again

    spool = replica.spool
    check = _Validator()
    pending: ContentWrite | None = None
    try:
        header: pb.Header | None = res.header
        req: pb.ReplicateRequest | Content = first
        async_iter = requests
        while True:
            if pending is not None:
                await _settle(pending)
                pending = None
            if isinstance(req, tuple):
                # A long chunk is written by a worker while we read the next request.
                pending = _write_content(spool, req)
            else:
                resp = _apply(spool, req)
                if req.acknowledge:
                    if header is not None:
                        resp.header.CopyFrom(header)
                        header = None
                    await send(resp)
                elif resp.status != pb.OK:
                    raise ReplicateStreamError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"no acknowledgement requested but status != OK: {pb.Status.Name(resp.status)}",
                    )
            try:
                raw = await anext(async_iter)
            except StopAsyncIteration:
                return
            try:
                req = decode_request(raw)
            except Exception as err:  # noqa: BLE001
                raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ReplicateRequest: {err}") from None
            if not isinstance(req, tuple):
                check(req)
                if req.HasField("header"):
                    raise ReplicateStreamError(grpc.StatusCode.INVALID_ARGUMENT, "unexpected Header after the first request")
    finally:
        # Roll back uncommitted content and release the spool, however the stream ended.
        if pending is not None:
            pending.settle_now(raise_error=False)
        spool.must_apply(pb.ReplicateRequest(proposal=spool.fragment.to_proto(), registers=spool.registers))
        replica.spool_lock.release()


def _write_content(spool: Spool, req: Content) -> ContentWrite | None:
    content, delta = req
    try:
        # A memoryview works wherever the spool uses content (pwrite, sha1): no copy.
        return spool.write_content(content, delta)
    except SpoolError as err:
        raise ReplicateStreamError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None


async def _settle(write: ContentWrite) -> None:
    try:
        await write.settle()
    except SpoolError as err:
        raise ReplicateStreamError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None


def _apply_content(spool: Spool, req: Content) -> None:
    content, delta = req
    try:
        spool._apply_content(content, delta)  # noqa: SLF001 - the content transition
    except SpoolError as err:
        raise ReplicateStreamError(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None


def _apply(spool: Spool, req: pb.ReplicateRequest) -> pb.ReplicateResponse:
    if not req.HasField("proposal"):
        content = req.content
        _apply_content(spool, (memoryview(content), req.content_delta))
        return pb.ReplicateResponse()
    # Acknowledged proposals are synchronisations (or commits): a spool they complete is
    # persisted at once, as a primary's would be (see the module docstring).
    return spool.apply(req, primary=req.acknowledge)


class GrpcPeerStream:
    """A Replicate call to a peer whose request serializer passes bytes through."""

    __slots__ = ("_call",)

    def __init__(self, call: Any) -> None:
        self._call = call

    async def write(self, data: bytes) -> None:
        await self._call.write(data)

    async def read(self) -> pb.ReplicateResponse | None:
        resp = await self._call.read()
        if resp is grpc.aio.EOF:
            return None
        return cast(pb.ReplicateResponse, resp)

    async def done_writing(self) -> None:
        await self._call.done_writing()

    def ended(self) -> bool:
        return bool(self._call.done())

    def cancel(self) -> None:
        self._call.cancel()


class FailedPeerStream:
    """Stands in for a peer that could not be dialed: every operation fails with ``err``."""

    def __init__(self, err: BaseException) -> None:
        self._err = err

    async def write(self, data: bytes) -> None:
        raise self._err

    async def read(self) -> pb.ReplicateResponse | None:
        raise self._err

    async def done_writing(self) -> None:
        return None

    def ended(self) -> bool:
        return True

    def cancel(self) -> None:
        return None


__all__ = [
    "FailedPeerStream",
    "GrpcPeerStream",
    "ReplicateStreamError",
    "serve",
]

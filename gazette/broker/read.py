"""The Read and ListFragments RPCs.

A read resolves its journal (any assigned broker may serve it), then loops:
query the index for the fragment covering the offset; send that metadata
response (the first one carries the Header); then stream the fragment's
content from its local spool file, or from its store (decompressed), in
responses of at most ``CHUNK_SIZE`` bytes; continue with the next fragment.

Invariants:
* Only committed content is sent: the index knows only committed fragments.
* Responses are in offset order; a metadata response whose offset exceeds
  the previous end reports an offset jump (a gap in the journal).
* A read stops at ``end_offset``, after metadata with ``metadata_only``, at a
  non-OK status (non-blocking reads end with OFFSET_NOT_YET_AVAILABLE), or
  after metadata that delegates the read to a store URL with ``do_not_proxy``.
* Memory: a read whose client does not read holds one response (at most
  ``CHUNK_SIZE`` of content) while the transport's flow control keeps it from
  producing the next, and nothing more: stored content is read in items of about
  ``CHUNK_SIZE`` (compressed content too, however well it compresses: see
  ``stores.read_stored``), and nothing here keeps an item once its last response
  is made. (Stores were read 1 MiB at a time and the item kept twice: 200
  stalled readers held 1.3 MiB each.)
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from gazette.auth import Claims
from gazette.broker import metrics
from gazette.broker.context import BrokerContext
from gazette.fragment import Fragment
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.specs import may_read

if TYPE_CHECKING:
    from gazette.broker.replica import Replica

log = logging.getLogger(__name__)

CHUNK_SIZE = (1 << 17)  # larger than Gazette's 32 KiB: gRPC per-message cost dominates in Python
DEFAULT_PAGE_LIMIT = 1000


def _status(status: int, header: pb.Header) -> pb.ReadResponse:
    resp = pb.ReadResponse(status=status)  # type: ignore[arg-type]
    resp.header.CopyFrom(header)
    return resp


async def read(broker: BrokerContext, req: pb.ReadRequest,
               claims: Claims | None = None) -> AsyncIterator[pb.ReadResponse]:
    res = await broker.resolver.resolve(
        req.journal,
        may_proxy=not req.do_not_proxy,
        require_primary=False,
        min_etcd_revision=req.min_etcd_revision,
        proxy_header=req.header if req.HasField("header") else None,
        claims=claims,
    )
    if res.status != pb.OK:
        yield _status(res.status, res.header)
        return
    assert res.spec is not None
    if not may_read(res.spec):
        yield _status(pb.NOT_ALLOWED, res.header)
        return
    if not res.is_local:
        async for resp in _proxy(broker, req, res.header):
            yield resp
        return
    if res.replica is None:  # assigned, but the replica is starting: retry at the next revision
        res = await broker.resolver.resolve(
            req.journal, may_proxy=False, require_primary=False, min_etcd_revision=res.header.etcd.revision + 1
        )
        if res.replica is None:
            yield _status(pb.NOT_JOURNAL_BROKER if res.status == pb.OK else res.status, res.header)
            return
    async for resp in serve_read(res.replica, req, res.header):
        yield resp


async def serve_read(replica: Replica, req: pb.ReadRequest, header: pb.Header) -> AsyncIterator[pb.ReadResponse]:
    r = pb.ReadRequest()
    r.CopyFrom(req)
    first = True
    while True:
        resp, file = await replica.index.query(r)
        if first:
            resp.header.CopyFrom(header)
            first = False
        yield resp
        if (
            resp.status != pb.OK
            or r.metadata_only
            or (file is None and r.do_not_proxy and resp.fragment_url)
            or (r.end_offset and resp.offset >= r.end_offset)
        ):
            return
        offset = resp.offset
        frag = Fragment.from_proto(resp.fragment)
        end = frag.end if not r.end_offset else min(frag.end, r.end_offset)
        if file is not None:
            while offset < end:
                n = min(CHUNK_SIZE, end - offset)
                data = file.pread(offset - frag.begin, n)
                if not data:
                    raise OSError(f"short read of spool {frag} at {offset}")
                yield pb.ReadResponse(offset=offset, content=data)
                offset += len(data)
                metrics.READ_BYTES.inc(len(data))
        else:
            store = replica.stores.get(frag.backing_store)
            async for data in store.open(frag, offset, chunk=CHUNK_SIZE):
                pos, size = 0, len(data)
                while pos < size and offset < end:
                    n = min(CHUNK_SIZE, end - offset, size - pos)
                    if n == size:
                        resp = pb.ReadResponse(offset=offset, content=data)
                    else:
                        with memoryview(data) as view:
                            resp = pb.ReadResponse(offset=offset, content=view[pos:pos + n].tobytes())
                    pos += n
                    if pos >= size:
                        del data  # freed before we wait on the client: the response has it
                    yield resp
                    del resp
                    offset += n
                    metrics.READ_BYTES.inc(n)
                if offset >= end:
                    break
        r.offset = offset
        if r.end_offset and offset >= r.end_offset:
            return


async def _proxy(broker: BrokerContext, req: pb.ReadRequest, header: pb.Header) -> AsyncIterator[pb.ReadResponse]:
    pid = header.process_id
    endpoint = ""
    for i, m in enumerate(header.route.members):
        if m.zone == pid.zone and m.suffix == pid.suffix and i < len(header.route.endpoints):
            endpoint = header.route.endpoints[i]
    fwd = pb.ReadRequest()
    fwd.CopyFrom(req)
    fwd.header.CopyFrom(header)
    call = broker.peer_stub(endpoint).Read(fwd)
    try:
        async for resp in call:
            yield resp
    finally:
        call.cancel()


async def list_fragments(broker: BrokerContext, req: pb.FragmentsRequest,
                         claims: Claims | None = None) -> pb.FragmentsResponse:
    res = await broker.resolver.resolve(
        req.journal,
        may_proxy=not req.do_not_proxy,
        require_primary=False,
        proxy_header=req.header if req.HasField("header") else None,
        claims=claims,
    )
    out = pb.FragmentsResponse(status=res.status)  # type: ignore[arg-type]
    out.header.CopyFrom(res.header)
    if res.status != pb.OK:
        return out
    if not res.is_local:
        fwd = pb.FragmentsRequest()
        fwd.CopyFrom(req)
        fwd.header.CopyFrom(res.header)
        endpoint = ""
        for i, m in enumerate(res.header.route.members):
            if m == res.header.process_id and i < len(res.header.route.endpoints):
                endpoint = res.header.route.endpoints[i]
        resp: pb.FragmentsResponse = await broker.peer_stub(endpoint).ListFragments(fwd)
        return resp
    replica = res.replica
    if replica is None:
        out.status = pb.NOT_JOURNAL_BROKER
        return out
    await replica.wait_first_refresh()
    limit = req.page_limit or DEFAULT_PAGE_LIMIT
    ttl = req.signatureTTL.ToTimedelta().total_seconds() if req.HasField("signatureTTL") else 0.0
    matched = []
    for f in replica.index.fragments():
        if req.next_page_token and f.begin < req.next_page_token:
            continue
        if req.begin_mod_time and (f.mod_time == 0 or f.mod_time < req.begin_mod_time):
            continue
        if req.end_mod_time and (f.mod_time == 0 or f.mod_time > req.end_mod_time):
            continue
        matched.append(f)
    for f in matched[:limit]:
        entry = out.fragments.add()
        entry.spec.CopyFrom(f.to_proto())
        if ttl and f.backing_store and f.mod_time:
            url = replica._sign(f, ttl)
            if url:
                entry.signed_url = url
    if len(matched) > limit:
        out.next_page_token = matched[limit].begin
    return out

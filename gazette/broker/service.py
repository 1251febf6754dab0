"""The ``protocol.Journal`` gRPC service of a broker.

Each RPC validates its request, resolves the journal at the keyspace's
revision, and either serves it from the local replica or proxies it to the
broker that should (unless ``do_not_proxy``), so any broker accepts any
request. Protocol-level refusals (JOURNAL_NOT_FOUND, NOT_ALLOWED, ...) are
responses carrying a ``Status`` and a ``Header``, as in Gazette; only
malformed requests and internal faults are gRPC errors: handlers raise typed errors
and ``gazette.server.edge.grpc_edge`` ends the RPC with each error's own code (a
``ValidationError`` INVALID_ARGUMENT naming the field). A server never crashes on a
request: unexpected exceptions end that RPC alone.

Every RPC first verifies its token for the capability it needs (Gazette's: List LIST, Apply
APPLY, Read/ListFragments READ, Append APPEND, Replicate REPLICATE; FragmentStoreHealth APPLY,
where Gazette asks READ: it makes the broker dial and write to a store the caller names)
before it looks at the request; a journal outside the token's selector is not listed and
resolves as JOURNAL_NOT_FOUND, and applying or deleting one is PERMISSION_DENIED.

FragmentStoreHealth answers Gazette's statuses (OK, or FRAGMENT_STORE_UNHEALTHY with the
error) for a valid, permitted request; a malformed one is INVALID_ARGUMENT (Gazette's
``Validate``, and a ``file://`` path with ``.``/``..`` segments). With authorization off
anyone holds every capability, so the broker checks only stores some journal spec names (a
caller could otherwise make it dial an endpoint of their choosing, e.g. an ``s3://`` URL's
``endpoint=``, and send it a signed PUT): another store is FAILED_PRECONDITION, saying so.
Too many requests waiting on checks: RESOURCE_EXHAUSTED (``broker/store_health.py``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

from gazette import auth
from gazette.allocator import keys
from gazette.auth import NO_AUTH, Claims, token_of
from gazette.broker import append as append_mod
from gazette.broker import read as read_mod
from gazette.broker import replicate as replicate_mod
from gazette.broker.context import BrokerContext
from gazette.errors import GazetteError, ValidationError
from gazette.protocol import labels, validate
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.server import cluster
from gazette.server.edge import grpc_edge

log = logging.getLogger(__name__)

MAX_JOURNALS_PER_LIST_RESPONSE = 1000


class StoreNotNamed(GazetteError):
    """With authorization off, a FragmentStoreHealth request for a store no journal names."""

    grpc_code = "FAILED_PRECONDITION"
    http_status = 400


def check_store_path(url: str) -> None:
    """INVALID_ARGUMENT for a ``file://`` store whose path has ``.`` or ``..`` segments: it
    would name a directory outside (or beside) the broker's file root."""
    if url.startswith("file:"):
        path = urlsplit(url).path
        if any(seg in (".", "..") for seg in unquote(path).split("/")):
            raise ValidationError("fragment_store", f"path cannot traverse the file root ({path})")


class JournalService(pb_grpc.JournalServicer):
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._named: frozenset[str] = frozenset()
        self._named_at = -1  # the keyspace revision _named is of

    def _named_stores(self) -> frozenset[str]:
        """The fragment stores journal specs name, as of the keyspace's revision."""
        ks = self.broker.keyspace
        if self._named_at != ks.revision:
            named: set[str] = set()
            for kv in ks.prefixed(keys.items_key(ks.root, "")):
                spec: pb.JournalSpec | None = kv.value
                if spec is not None:
                    named.update(spec.fragment.stores)
            self._named, self._named_at = frozenset(named), ks.revision
        return self._named

    # -- List / Apply -----------------------------------------------------------------

    def _verify(self, context: Any, require: int) -> Claims:
        return self.broker.verifier.verify(token_of(context.invocation_metadata()), require)

    @grpc_edge
    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse | bytes]:
        claims = self._verify(context, auth.LIST)
        validate.validate_list_request(request)
        try:
            selector = labels.LabelSelector.from_proto(request.selector)
        except ValueError as err:
            if isinstance(err, ValidationError):
                raise
            raise ValidationError("selector", str(err)) from err
        ks = self.broker.keyspace
        min_rev = request.watch_resume.etcd.revision + 1 if request.HasField("watch_resume") else 0
        last: tuple[int, int] | None = None
        while True:
            if min_rev > ks.revision:
                await ks.wait_for_revision(min_rev)
            min_rev = ks.revision + 1
            pages, key = self.broker.list_journals(selector, claims, MAX_JOURNALS_PER_LIST_RESPONSE)
            if key == last and request.watch:
                await ks.wait_for_revision(min_rev)
                continue
            last = key
            for page in pages:
                yield page
            if not request.watch:
                return
            yield pb.ListResponse()  # end of this snapshot

    @grpc_edge
    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
        claims = self._verify(context, auth.APPLY)
        validate.validate_apply_request(request)
        cluster.check_changes_permitted(
            claims, [cluster.SpecChange.of(ch, "name") for ch in request.changes], labels.with_meta_labels)
        return await self.broker.apply_journals(request)

    # -- Read -------------------------------------------------------------------------

    @grpc_edge
    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        claims = self._verify(context, auth.READ)
        validate.validate_read_request(request)
        async for resp in read_mod.read(self.broker, request, claims):  # a failed proxy: its status
            yield resp

    # -- Append -----------------------------------------------------------------------

    async def Append(self, request_iterator: AsyncIterator[pb.AppendRequest], context: Any) -> pb.AppendResponse | bytes:
        # The whole RPC is compiled code (append.serve_append), which ends it at the edge
        # itself (edge.end_rpc): here, every append passes through one coroutine fewer.
        return await append_mod.serve_append(self.broker, request_iterator, context)

    # -- Fragments --------------------------------------------------------------------

    @grpc_edge
    async def ListFragments(self, request: pb.FragmentsRequest, context: Any) -> pb.FragmentsResponse:
        claims = self._verify(context, auth.READ)
        validate.validate_fragments_request(request)
        return await read_mod.list_fragments(self.broker, request, claims)

    @grpc_edge
    async def FragmentStoreHealth(
        self, request: pb.FragmentStoreHealthRequest, context: Any
    ) -> pb.FragmentStoreHealthResponse:
        self._verify(context, auth.APPLY)
        validate.validate_fragment_store_health_request(request)
        url = request.fragment_store
        check_store_path(url)
        named = url in self._named_stores()
        if not named and self.broker.verifier is NO_AUTH:
            raise StoreNotNamed(
                f"no journal names fragment store {url}: with authorization off, a broker checks "
                "only stores journals use (with --auth-keys, a caller holding APPLY may check any)")
        resp = pb.FragmentStoreHealthResponse(status=pb.OK)
        resp.header.CopyFrom(self.broker.resolver.header())
        ok, error = await self.broker.store_health.request(
            url, named=named, check_delete=request.check_delete, prefix=request.check_delete_prefix)
        if not ok:
            resp.status = pb.FRAGMENT_STORE_UNHEALTHY
            resp.store_health_error = error
        return resp

    @grpc_edge
    async def Replicate(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        """A primary's pipeline stream: see ``replicate.serve``. Requests arrive as raw bytes
        (see ``Broker.register_services`` in ``broker/server.py``) or, registered otherwise, as
        messages; responses are written through the context."""
        self._verify(context, auth.REPLICATE)
        try:
            await replicate_mod.serve(self.broker, request_iterator.__aiter__(), context.write)
        except replicate_mod.ReplicateStreamError as err:
            log.warning("served Replicate RPC failed", extra={"err": str(err), "peer": context.peer()})
            raise

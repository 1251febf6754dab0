"""Routed client of the broker Journal service (grpc.aio).

Invariants:
- One channel per endpoint, opened on first use and closed by ``close``.
- Requests about one journal go to the endpoint its cached route names (the primary for
  appends); with no usable route they go to the default address, where any broker
  proxies. Response headers update the cache, so the next request goes direct.
- A transport failure on a routed endpoint invalidates that journal's route: the next
  attempt falls back to the default address.
- Raw calls raise ``TransportError`` for gRPC failures and a ``BrokerStatusError``
  subclass for non-OK statuses; they never return a non-OK response.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from google.protobuf import duration_pb2

from gazette.auth import Authorizer
from gazette.client.channels import (
    CHANNEL_OPTIONS,
    ChannelPool,
    PooledClient,
    apply_in_batches,
    channel_for,
    grpc_target,
)
from gazette.client.errors import (
    ApplyError,
    FragmentsError,
    ListError,
    ResponseValidationError,
    TransportError,
)
from gazette.client.route_cache import RouteCache, pick
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.channel import insecure_channel
from gazette.rpc.seam import ChannelFactory
from gazette.rpc.tls import ClientTLS

# The generated stubs are untyped; load them as Any rather than type-check generated code.
pb_grpc: Any = importlib.import_module("gazette.protocol.protocol_pb2_grpc")

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_ADDRESS",
    "JournalClient",
    "channel_for",
    "grpc_target",
    "label_selector",
    "rpc_error",
]

DEFAULT_ADDRESS = "http://localhost:8080"

def rpc_error(err: grpc.aio.AioRpcError, endpoint: str = "", journal: str = "") -> TransportError:
    return TransportError(err.code(), err.details() or "", endpoint, journal)


def label_selector(include: Iterable[tuple[str, str]] = (),
                   exclude: Iterable[tuple[str, str]] = ()) -> pb.LabelSelector:
    """A LabelSelector from (name, value) pairs, kept in Gazette's sorted order."""
    sel = pb.LabelSelector()
    for name, value in sorted(include):
        sel.include.labels.add(name=name, value=value)
    for name, value in sorted(exclude):
        sel.exclude.labels.add(name=name, value=value)
    return sel


class JournalClient(PooledClient):
    """Async client of the Journal service, routing by journal.

    Channels to brokers come from ``channel_factory`` (default: ``gazette.rpc``'s, or grpcio's
    with ``GAZETTE_RPC=grpcio``; ``https://`` addresses dial TLS trusting ``tls``), one per
    endpoint, closed with the client. With ``auth`` every call carries its token."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, zone: str = "",
                 route_cache: RouteCache | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 channel_factory: ChannelFactory = insecure_channel,
                 tls: ClientTLS | None = None, auth: Authorizer | None = None) -> None:
        grpc_target(address)  # Validate eagerly: a bad address is a configuration error.
        self.address = address
        self.zone = zone
        self.routes = route_cache if route_cache is not None else RouteCache()
        self.tls, self.auth = tls, auth
        self.channels = ChannelPool(list(CHANNEL_OPTIONS) + list(channel_options), channel_factory, tls, auth)

    # --- channels and routing -------------------------------------------------------

    def stub(self, endpoint: str | None = None) -> Any:
        """Stub for ``endpoint`` (the default address when None)."""
        return self.channels.stub(endpoint or self.address, pb_grpc.JournalStub)

    def endpoint_for(self, journal: str, require_primary: bool,
                     route: pb.Route | None = None) -> str:
        """Endpoint to dispatch a request about ``journal`` to: by ``route`` if given,
        else by the cached route, else the default address."""
        if route is None or len(route.members) == 0:
            route = self.routes.route(journal)
        chosen = pick(route, require_primary, self.zone, self.channels)
        return chosen or self.address

    def update_route(self, journal: str, route: pb.Route | None) -> None:
        if route is not None and len(route.members) != 0:
            self.routes.update(journal, route)

    def note_failure(self, journal: str, endpoint: str) -> None:
        """A transport failure at ``endpoint``: stop routing ``journal`` there."""
        if endpoint != self.address:
            self.routes.invalidate(journal)

    # --- raw calls ------------------------------------------------------------------

    async def list(self, selector: pb.LabelSelector | None = None) -> pb.ListResponse:
        """All journals matching ``selector``, as one ListResponse.

        The broker streams a first response (status, header, journals) followed by more
        journals; they are joined here, as bytes: serialized messages concatenated decode as
        one whose repeated fields are appended, so the pages are parsed once, not copied
        journal by journal (50,000 journals: 0.15 s less). Routes of listed journals are
        cached."""
        req = pb.ListRequest(selector=selector or pb.LabelSelector())
        call = self.channels.channel(self.address).unary_stream(
            "/protocol.Journal/List", request_serializer=pb.ListRequest.SerializeToString)(req)
        pages: list[bytes] = []
        try:
            async for page in call:
                if not pages:
                    first = pb.ListResponse.FromString(page)
                    if first.status != pb.OK:
                        raise ListError(first.status)
                elif page[:1] != b"\x1a" and not pb.ListResponse.FromString(page).journals:
                    raise ResponseValidationError("unexpected empty ListResponse.journals in a listing")
                pages.append(page)
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.address) from None
        if not pages:
            raise ResponseValidationError("broker closed the List stream without a response")
        out = pb.ListResponse.FromString(b"".join(pages)) if len(pages) > 1 else first
        # The cache keeps the last ``size`` routes it was given: giving it only those leaves
        # it exactly as giving it all would (50,000 journals listed cost 0.2 s of updates).
        for j in out.journals[-self.routes.size:]:
            self.update_route(j.spec.name, j.route)
        return out

    async def apply(self, changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
                    batch_size: int = 0) -> pb.ApplyResponse:
        """Apply journal changes. With ``batch_size`` > 0 they go in several
        transactions of at most that many changes (so may partly apply)."""
        all_changes = list(changes.changes if isinstance(changes, pb.ApplyRequest) else changes)
        return await apply_in_batches(all_changes, batch_size, self._apply)

    async def _apply(self, changes: Sequence[pb.ApplyRequest.Change]) -> pb.ApplyResponse:
        try:
            resp: pb.ApplyResponse = await self.stub().Apply(pb.ApplyRequest(changes=changes))
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.address) from None
        if resp.status != pb.OK:
            detail = ""
            if resp.status == pb.ETCD_TRANSACTION_FAILED:
                detail = ("a journal was created, changed or deleted since its revision "
                          "was read; list it again and retry")
            raise ApplyError(resp.status, detail=detail)
        return resp

    async def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                             end_mod_time: int = 0, signature_ttl: float | None = None,
                             page_limit: int = 0) -> pb.FragmentsResponse:
        """Every fragment of ``journal`` (all pages joined), routed by the journal."""
        req = pb.FragmentsRequest(journal=journal, begin_mod_time=begin_mod_time,
                                  end_mod_time=end_mod_time, page_limit=page_limit)
        if signature_ttl:
            ttl = duration_pb2.Duration()
            ttl.FromNanoseconds(int(signature_ttl * 1e9))
            req.signatureTTL.CopyFrom(ttl)
        out: pb.FragmentsResponse | None = None
        while True:
            endpoint = self.endpoint_for(journal, require_primary=False)
            try:
                resp = await self.stub(endpoint).ListFragments(req)
            except grpc.aio.AioRpcError as err:
                self.note_failure(journal, endpoint)
                raise rpc_error(err, endpoint, journal) from None
            if resp.HasField("header"):
                self.update_route(journal, resp.header.route)
            if resp.status != pb.OK:
                raise FragmentsError(resp.status, journal)
            req.next_page_token = resp.next_page_token
            resp.next_page_token = 0
            if out is None:
                out = resp
            else:
                out.fragments.extend(resp.fragments)
            if req.next_page_token == 0:
                return out

    async def fragment_store_health(self, store: str) -> pb.FragmentStoreHealthResponse:
        try:
            resp: pb.FragmentStoreHealthResponse = await self.stub().FragmentStoreHealth(
                pb.FragmentStoreHealthRequest(fragment_store=store))
            return resp
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.address) from None

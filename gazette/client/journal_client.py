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
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.protobuf import duration_pb2

from gazette.auth import Authorizer, authorize_channel
from gazette.client.errors import (
    ApplyError,
    FragmentsError,
    ListError,
    ResponseValidationError,
    TransportError,
)
from gazette.client.route_cache import RouteCache, pick
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.channel import insecure_channel, secure_channel
from gazette.rpc.seam import ChannelFactory, RpcChannel
from gazette.rpc.tls import ClientTLS

# The generated stubs are untyped; load them as Any rather than type-check generated code.
pb_grpc: Any = importlib.import_module("gazette.protocol.protocol_pb2_grpc")

DEFAULT_ADDRESS = "http://localhost:8080"

# Brokers send content chunks of just under 32 KiB, but List and ListFragments answers
# can be large; accept up to 16 MiB as Gazette's clients do.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5000),
]


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """Map a broker endpoint (``http://host:port``, ``https://...``, ``unix://path`` or
    a bare ``host:port``) to a gRPC dial target and whether it needs TLS."""
    endpoint = endpoint.strip()
    if not endpoint:
        raise ValueError("empty broker address")
    if "://" not in endpoint:
        return endpoint, False
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        return f"unix:{parts.netloc}{parts.path}", False
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported broker address scheme {parts.scheme!r} in {endpoint!r}")
    if not parts.hostname:
        raise ValueError(f"broker address {endpoint!r} has no host")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = parts.hostname
    if ":" in host:  # IPv6 literal.
        host = f"[{host}]"
    return f"{host}:{port}", tls


def channel_for(endpoint: str, factory: ChannelFactory, options: Sequence[tuple[str, Any]],
                tls: ClientTLS | None = None, auth: Authorizer | None = None) -> RpcChannel:
    """A channel to ``endpoint``: a TLS channel trusting ``tls`` for ``https://``, else
    ``factory``'s; its calls carry ``auth``'s tokens."""
    target, secure = grpc_target(endpoint)
    if secure:
        return authorize_channel(secure_channel(target, options, tls), auth)
    return authorize_channel(factory(target, list(options)), auth)


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


class JournalClient:
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
        self._options = list(CHANNEL_OPTIONS) + list(channel_options)
        self._channel_factory = channel_factory
        self.tls, self.auth = tls, auth
        self._channels: dict[str, RpcChannel] = {}
        self._stubs: dict[str, Any] = {}

    # --- channels and routing -------------------------------------------------------

    def stub(self, endpoint: str | None = None) -> Any:
        """Stub for ``endpoint`` (the default address when None)."""
        endpoint = endpoint or self.address
        stub = self._stubs.get(endpoint)
        if stub is None:
            channel = self._channels[endpoint] = channel_for(
                endpoint, self._channel_factory, self._options, self.tls, self.auth)
            stub = self._stubs[endpoint] = pb_grpc.JournalStub(channel)
        return stub

    def endpoint_for(self, journal: str, require_primary: bool,
                     route: pb.Route | None = None) -> str:
        """Endpoint to dispatch a request about ``journal`` to: by ``route`` if given,
        else by the cached route, else the default address."""
        if route is None or len(route.members) == 0:
            route = self.routes.route(journal)
        chosen = pick(route, require_primary, self.zone, self._channels)
        return chosen or self.address

    def update_route(self, journal: str, route: pb.Route | None) -> None:
        if route is not None and len(route.members) != 0:
            self.routes.update(journal, route)

    def note_failure(self, journal: str, endpoint: str) -> None:
        """A transport failure at ``endpoint``: stop routing ``journal`` there."""
        if endpoint != self.address:
            self.routes.invalidate(journal)

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels.values():
            await channel.close()

    async def __aenter__(self) -> JournalClient:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # --- raw calls ------------------------------------------------------------------

    async def list(self, selector: pb.LabelSelector | None = None) -> pb.ListResponse:
        """All journals matching ``selector``, as one ListResponse.

        The broker streams a first response (status, header, journals) followed by more
        journals; they are joined here. Routes of listed journals are cached."""
        req = pb.ListRequest(selector=selector or pb.LabelSelector())
        call = self.stub().List(req)
        out: pb.ListResponse | None = None
        try:
            async for resp in call:
                if out is None:
                    if resp.status != pb.OK:
                        raise ListError(resp.status)
                    out = resp
                elif len(resp.journals) == 0:
                    raise ResponseValidationError("unexpected empty ListResponse.journals in a listing")
                else:
                    out.journals.extend(resp.journals)
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, self.address) from None
        if out is None:
            raise ResponseValidationError("broker closed the List stream without a response")
        for j in out.journals:
            self.update_route(j.spec.name, j.route)
        return out

    async def apply(self, changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
                    batch_size: int = 0) -> pb.ApplyResponse:
        """Apply journal changes. With ``batch_size`` > 0 they go in several
        transactions of at most that many changes (so may partly apply)."""
        all_changes = list(changes.changes if isinstance(changes, pb.ApplyRequest) else changes)
        size = batch_size if batch_size > 0 else max(len(all_changes), 1)
        resp = pb.ApplyResponse()
        for start in range(0, max(len(all_changes), 1), size):
            req = pb.ApplyRequest(changes=all_changes[start:start + size])
            try:
                resp = await self.stub().Apply(req)
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

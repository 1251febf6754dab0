"""An application's own configuration and set-up (Gazette's ``Application.NewConfig`` and
``InitApplication`` of ``mainboilerplate/runconsumer``): optional capabilities of an
``Application``.

* ``add_flags(parser)``: the app adds its own flags (and their environment variables) beside
  the consumer's; the parsed namespace reaches ``init_application`` as ``args.config``.
* ``init_application(args)``: runs once, before the process binds its port and announces
  itself: the app registers its gRPC services (``args.add_service``) and HTTP routes
  (``args.routes``), and keeps what it needs (the resolver, the journal client) to serve them.

Invariants: nothing of the process is reachable before ``init_application`` returned; an
exception from it ends the process with the error (a misconfigured app never announces).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

from aiohttp import web
from google.protobuf.descriptor import ServiceDescriptor

from gazette.client import JournalClient
from gazette.consumer.client import ShardClient
from gazette.consumer.resolver import Resolver
from gazette.rpc.seam import RpcChannel
from gazette.server.edge import grpc_edge_bound
from gazette.server.grpc import GrpcServer, add_service

__all__ = ["FlagsAdder", "InitArgs", "Initializer"]


@dataclass
class InitArgs:
    config: argparse.Namespace | None
    """The parsed flags, the app's own included (None when run without flags)."""
    server: GrpcServer
    resolver: Resolver
    """Maps a shard to its local primary or the remote one (see ``gazette.consumer.resolver``)."""
    journal_client: JournalClient
    peers: ShardClient
    """Channels to the other consumer processes (``peers.channel(endpoint)``), to proxy the
    app's own requests to the primary of a shard."""
    routes: list[web.RouteDef] = field(default_factory=list)
    """Append aiohttp routes here; they are served on the consumer's port."""

    def add_service(self, descriptor: ServiceDescriptor, servicer: Any) -> None:
        """Serves a generated gRPC servicer on the consumer's port. Errors its methods raise
        end the RPC as the framework's own do: a ``GazetteError`` with its ``grpc_code``, a
        proxied call's status unchanged (``gazette.server.edge``)."""
        edged = SimpleNamespace(**{m.name: grpc_edge_bound(getattr(servicer, m.name)) for m in descriptor.methods})
        add_service(self.server, descriptor, edged)

    def channel(self, endpoint: str) -> RpcChannel:
        return self.peers.channel(endpoint)


@runtime_checkable
class FlagsAdder(Protocol):
    def add_flags(self, parser: Any) -> None:
        """Adds the app's flags to ``parser`` (an argparse argument group: ``add_argument``)."""


@runtime_checkable
class Initializer(Protocol):
    def init_application(self, args: InitArgs) -> Any: ...

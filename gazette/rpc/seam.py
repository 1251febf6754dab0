"""The typed seam between gazette's RPC callers and a gRPC transport.

Generated stubs and gazette's own callers need only what :class:`RpcChannel` names: the four
multi-callable factories and ``close``. Both grpcio's ``grpc.aio.Channel`` and our
:class:`gazette.rpc.channel.Channel` provide it, so a caller takes a :data:`ChannelFactory`
(``JournalClient(channel_factory=...)``) instead of depending on either: tests inject
in-process channels, operators keep ``GAZETTE_RPC=grpcio`` as the default's switch.

Invariants: a factory returns a new, lazily-connecting channel for ``target`` (``host:port``)
with the given channel options; its caller owns it and closes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["ChannelFactory", "RpcChannel"]


class RpcChannel(Protocol):
    """A gRPC channel, as generated stubs use it."""

    def unary_unary(self, method: str, request_serializer: Callable[[Any], bytes] | None = ...,
                    response_deserializer: Callable[[Any], Any] | None = ...,
                    _registered_method: bool = ...) -> Any: ...

    def unary_stream(self, method: str, request_serializer: Callable[[Any], bytes] | None = ...,
                     response_deserializer: Callable[[Any], Any] | None = ...,
                     _registered_method: bool = ...) -> Any: ...

    def stream_unary(self, method: str, request_serializer: Callable[[Any], bytes] | None = ...,
                     response_deserializer: Callable[[Any], Any] | None = ...,
                     _registered_method: bool = ...) -> Any: ...

    def stream_stream(self, method: str, request_serializer: Callable[[Any], bytes] | None = ...,
                      response_deserializer: Callable[[Any], Any] | None = ...,
                      _registered_method: bool = ...) -> Any: ...

    async def close(self, grace: float | None = None) -> None: ...


ChannelFactory = Callable[[str, Sequence[tuple[str, Any]]], RpcChannel]
"""Builds a channel to ``target`` with channel ``options``."""

"""Channels to gazette processes: endpoint parsing, one channel per endpoint, and apply batching.

``ChannelPool`` is the one per-endpoint channel cache of the code base: a broker's channels to
its peers, ``JournalClient``'s to brokers and ``ShardClient``'s to consumers are each one.

Invariants:

* A pool holds at most one channel per endpoint, opened on first use (TLS trusting the pool's
  ``tls`` for ``https://`` endpoints, the pool's factory otherwise; every call carries the
  pool's ``auth`` tokens), and at most one stub per endpoint and stub type; ``close`` closes
  every channel it opened and forgets them (a later use opens a new one).
* ``apply_in_batches`` sends changes in order, in requests of at most ``batch_size`` changes
  (all in one when ``batch_size`` <= 0, one empty request when there are none), stopping at the
  first failure (raised by ``send``): earlier batches stay applied.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

from gazette.auth import Authorizer, authorize_channel
from gazette.rpc.channel import insecure_channel, secure_channel
from gazette.rpc.seam import ChannelFactory, RpcChannel
from gazette.rpc.tls import ClientTLS

__all__ = ["CHANNEL_OPTIONS", "ChannelPool", "PooledClient", "apply_in_batches", "channel_for", "grpc_target"]

T = TypeVar("T")
C = TypeVar("C")
R = TypeVar("R")

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


class ChannelPool:
    """One channel per endpoint (see the module docstring), with ``options``."""

    def __init__(self, options: Sequence[tuple[str, Any]], factory: ChannelFactory = insecure_channel,
                 tls: ClientTLS | None = None, auth: Authorizer | None = None) -> None:
        self.options = list(options)
        self.factory = factory
        self.tls, self.auth = tls, auth
        self._channels: dict[str, RpcChannel] = {}
        self._stubs: dict[tuple[str, Callable[[RpcChannel], Any]], Any] = {}

    def __contains__(self, endpoint: object) -> bool:
        """Whether a channel to ``endpoint`` is open (a warm endpoint to prefer)."""
        return endpoint in self._channels

    def channel(self, endpoint: str) -> RpcChannel:
        """The channel to ``endpoint``, opened on first use."""
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = self._channels[endpoint] = channel_for(
                endpoint, self.factory, self.options, self.tls, self.auth)
        return channel

    def stub(self, endpoint: str, stub_type: Callable[[RpcChannel], T]) -> T:
        """A ``stub_type`` (a generated stub class) over the channel to ``endpoint``."""
        stub: T | None = self._stubs.get((endpoint, stub_type))
        if stub is None:
            stub = self._stubs[(endpoint, stub_type)] = stub_type(self.channel(endpoint))
        return stub

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels.values():
            await channel.close()


class PooledClient:
    """A client whose channels are its ``channels`` pool: an async context manager that closes
    them on exit (``JournalClient``, ``ShardClient``)."""

    channels: ChannelPool

    async def close(self) -> None:
        await self.channels.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


async def apply_in_batches(changes: Sequence[C], batch_size: int,
                           send: Callable[[Sequence[C]], Awaitable[R]]) -> R:
    """Sends ``changes`` in batches (see the module docstring); the last batch's response."""
    size = batch_size if batch_size > 0 else max(len(changes), 1)
    resp: R | None = None
    for start in range(0, max(len(changes), 1), size):
        resp = await send(changes[start:start + size])
    assert resp is not None  # at least one batch is sent
    return resp

"""Connecting to etcd: endpoint parsing and a client tuned to reconnect quickly.

Invariants:

* ``connect`` never waits for etcd to be reachable (the channel is lazy); calls made while it
  is down fail and callers retry (the keyspace watch, the member process's first load).
* A client reconnects within about a second of etcd coming back (capped gRPC backoff).
* Channels are plaintext (aetcd opens no other): an ``https://`` endpoint is refused with an
  ``EtcdEndpointError`` rather than dialled without TLS. A TLS-only etcd is reached through a
  local proxy that holds the client certificate (``etcd grpc-proxy start --endpoints
  https://... --cacert ... --cert ... --key ...``), given as ``http://`` to ``--etcd.address``.
"""

from __future__ import annotations

import aetcd
import aetcd.exceptions

from gazette.etcd.errors import EtcdError

__all__ = ["CHANNEL_OPTIONS", "TRANSIENT_ERRORS", "EtcdEndpointError", "connect", "parse_endpoint"]


class EtcdEndpointError(EtcdError, ValueError):
    """An etcd endpoint that cannot be used (``--etcd.address``, ``ETCD_ADDRESS``)."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400

# What a call fails with while etcd is down, restarting or unreachable: worth retrying. gRPC's
# core reports a stream torn down by a server going away as INTERNAL ("Internal error from
# Core"), which aetcd maps to InternalError; a real internal error of etcd's is retried too,
# and a caller that retries forever logs each failure.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Splits "host:port" or "http://host:port[/]" into (host, port). An ``https://`` endpoint
    is an ``EtcdEndpointError``: gazette's etcd client has no TLS (see the module docstring)."""
    rest = endpoint.strip()
    if rest.lower().startswith("https://"):
        raise EtcdEndpointError(
            f"etcd endpoint {endpoint!r}: TLS to etcd is not supported (the etcd client opens "
            "plaintext channels only); give --etcd.address (ETCD_ADDRESS) an http:// endpoint, "
            "e.g. a local 'etcd grpc-proxy' holding the TLS client certificate")
    if rest.startswith("http://"):
        rest = rest[len("http://"):]
    rest = rest.rstrip("/")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise EtcdEndpointError(f"etcd endpoint {endpoint!r} is not of the form host:port "
                                "(--etcd.address, ETCD_ADDRESS)")
    return host.strip("[]"), int(port_text)


# gRPC channel options for etcd clients. The reconnect backoff is capped low so a client
# reconnects within about a second of etcd coming back (gRPC's default grows to two minutes).
# Keepalive stays above etcd's minimum ping interval (5s) so the server does not drop us.
CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 30_000,
    "grpc.keepalive_timeout_ms": 10_000,
}


async def connect(endpoint: str, *, rpc_timeout: int | None = None) -> aetcd.Client:
    """Returns a connected aetcd client for `endpoint` ("host:port" or "http://host:port").

    The gRPC channel is lazy: this does not wait for etcd to be reachable, and calls made
    while it is down fail with `aetcd.exceptions.ConnectionFailedError`. `rpc_timeout` bounds
    each of the client's unary calls (seconds; None: unbounded).
    """
    host, port = parse_endpoint(endpoint)
    client = aetcd.Client(
        host=host, port=port, timeout=rpc_timeout, options=dict(CHANNEL_OPTIONS)
    )
    await client.connect()
    return client

"""Connecting to etcd: endpoint parsing and a client tuned to reconnect quickly.

Invariants:

* ``connect`` never waits for etcd to be reachable (the channel is lazy); calls made while it
  is down fail and callers retry (the keyspace watch, the member process's first load).
* A client reconnects within about a second of etcd coming back (capped gRPC backoff).
"""

from __future__ import annotations

import aetcd
import aetcd.exceptions

__all__ = ["CHANNEL_OPTIONS", "TRANSIENT_ERRORS", "connect", "parse_endpoint"]

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
    """Splits "host:port" or "http://host:port[/]" into (host, port)."""
    rest = endpoint.strip()
    for scheme in ("http://", "https://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme):]
            break
    rest = rest.rstrip("/")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not of the form host:port")
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

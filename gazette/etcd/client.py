"""Connecting to etcd: endpoint parsing and a client tuned to reconnect quickly.

Invariants:

* ``connect`` never waits for etcd to be reachable (the channel is lazy); calls made while it
  is down fail and callers retry (the keyspace watch, the member process's first load).
* A client reconnects within about a second of etcd coming back (capped gRPC backoff).
* The endpoint's scheme decides the channel, as Gazette's ``--etcd.address`` does: ``http://``
  (or a bare ``host:port``) is plaintext, ``https://`` is TLS, verifying etcd's certificate
  against the given CA file (the system's roots without one) and presenting a client
  certificate when one is given (etcd's ``--client-cert-auth``). TLS settings given for a
  plaintext endpoint are an ``EtcdEndpointError``: a client never falls back to plaintext
  when it was told to use certificates.
"""

from __future__ import annotations

from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.watcher
import grpc

from gazette.etcd.errors import EtcdError
from gazette.rpc.tls import ClientTLS

__all__ = ["CHANNEL_OPTIONS", "TRANSIENT_ERRORS", "EtcdEndpointError", "EtcdTLSError", "check_tls", "connect",
           "is_tls_endpoint", "parse_endpoint", "tls_failure"]


class EtcdEndpointError(EtcdError, ValueError):
    """An etcd endpoint that cannot be used (``--etcd.address``, ``ETCD_ADDRESS``), or TLS
    settings that cannot be used with it."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class EtcdTLSError(EtcdError):
    """The TLS handshake with etcd failed: etcd refused this client's certificate (or got
    none), or this client refused etcd's. Not transient: retrying will not fix the files.
    ``cut_short``: TLS gave no reason (the connection closed mid-handshake, as a busy etcd
    may): worth retrying as etcd being unavailable, and reported as this if it persists."""

    def __init__(self, message: str, cut_short: bool = False) -> None:
        super().__init__(message)
        self.cut_short = cut_short


# What a call fails with while etcd is down, restarting or unreachable: worth retrying. gRPC's
# core reports a stream torn down by a server going away as INTERNAL ("Internal error from
# Core"), which aetcd maps to InternalError; a real internal error of etcd's is retried too,
# and a caller that retries forever logs each failure.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
)


def is_tls_endpoint(endpoint: str) -> bool:
    """Whether `endpoint` is dialled over TLS (its scheme is ``https://``)."""
    return endpoint.strip().lower().startswith("https://")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Splits "host:port" or "http[s]://host:port[/]" into (host, port); anything else is an
    ``EtcdEndpointError``. Whether it is TLS is `is_tls_endpoint`."""
    rest = endpoint.strip()
    for scheme in ("http://", "https://"):
        if rest.lower().startswith(scheme):
            rest = rest[len(scheme):]
            break
    rest = rest.rstrip("/")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host or "/" in host or "://" in host or not port_text.isdigit():
        raise EtcdEndpointError(f"etcd endpoint {endpoint!r} is not of the form http[s]://host:port "
                                "(--etcd.address, ETCD_ADDRESS)")
    return host.strip("[]"), int(port_text)


def check_tls(endpoint: str, tls: ClientTLS | None) -> None:
    """Raises ``EtcdEndpointError`` if `tls` names files for a plaintext `endpoint`, and
    ``TLSConfigError`` (naming the file) if a file it names cannot be used."""
    if tls is None:
        return
    if not is_tls_endpoint(endpoint) and (tls.ca_file or tls.cert_file or tls.key_file):
        raise EtcdEndpointError(
            f"etcd endpoint {endpoint!r} is plaintext but TLS files are given: use an https:// "
            "endpoint, or drop the TLS files")
    tls.context  # noqa: B018 - loads (and so checks) every file now


def tls_failure(endpoint: str, err: grpc.aio.AioRpcError) -> EtcdTLSError | None:
    """An ``EtcdTLSError`` naming the flags to check if `err` (from a call to `endpoint`) is
    a failed TLS handshake, else None. gRPC reports one as UNAVAILABLE, like etcd being down:
    only its details tell them apart."""
    details = err.details() or ""
    if err.code() != grpc.StatusCode.UNAVAILABLE or "handshake" not in details.lower():
        return None
    # BoringSSL's reason ("...:SSL routines:OPENSSL_internal:REASON[: text]: OK"), else all.
    _, sep, why = details.rpartition("OPENSSL_internal:")
    why = why.removesuffix(": OK").strip() if sep else details
    return EtcdTLSError(f"etcd at {endpoint}: TLS handshake failed ({why}): check --etcd.cert-file, "
                        "--etcd.cert-key-file and --etcd.trusted-ca-file", cut_short=not sep)


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


class _TLSClient(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """An aetcd client whose channel is TLS.

    aetcd (1.0) opens only ``grpc.aio.insecure_channel`` and takes no credentials, so this
    overrides ``connect`` alone: it builds the same stubs and watcher aetcd's does, over a
    ``secure_channel``. Every other method is aetcd's and uses ``self.channel``/the stubs.
    aetcd's username/password authentication is left out (gazette never passes them): so
    ``connect`` awaits nothing, and no other task can interleave with it (aetcd's guard
    against concurrent connects is not needed).
    """

    def __init__(self, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        self.channel = aetcd.rpc.secure_channel(target, self._credentials, options=list(self._options.items()))
        self.kvstub = aetcd.rpc.KVStub(self.channel)
        self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
        self.leasestub = aetcd.rpc.LeaseStub(self.channel)
        self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd.watcher.Watcher(
            aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


async def connect(endpoint: str, *, rpc_timeout: int | None = None, tls: ClientTLS | None = None) -> aetcd.Client:
    """Returns a connected aetcd client for `endpoint` ("host:port", "http://host:port" or
    "https://host:port").

    An ``https://`` endpoint is dialled over TLS with `tls` (its CA file, else the system's
    roots; its client certificate and key, if any). `tls` with files for a plaintext endpoint
    is an ``EtcdEndpointError``; a file that cannot be used is a ``TLSConfigError``.

    The gRPC channel is lazy: this does not wait for etcd to be reachable, and calls made
    while it is down fail with `aetcd.exceptions.ConnectionFailedError` (over TLS, a handshake
    etcd refuses fails the same way, as UNAVAILABLE). `rpc_timeout` bounds each of the
    client's unary calls (seconds; None: unbounded).
    """
    host, port = parse_endpoint(endpoint)
    check_tls(endpoint, tls)
    kwargs: dict[str, Any] = {"host": host, "port": port, "timeout": rpc_timeout, "options": dict(CHANNEL_OPTIONS)}
    client: aetcd.Client
    if is_tls_endpoint(endpoint):
        ca, key, chain = (tls or ClientTLS()).pem()
        client = _TLSClient(grpc.ssl_channel_credentials(ca, key, chain), **kwargs)
    else:
        client = aetcd.Client(**kwargs)
    await client.connect()
    return client


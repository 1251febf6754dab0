"""TLS for gazette's ports and dials: server contexts (TLS, or mTLS with a client CA) and
client settings, as Gazette's ``--*.server-cert-file``/``--*.peer-cert-file`` flags configure.

A server context offers ALPN ``h2`` and ``http/1.1``: gRPC and the HTTP gateway share one
port, and the multiplexer tells them apart after the handshake by the bytes they send (the
HTTP/2 preface) as it does in the clear. A client context offers ``h2`` only.

Invariants:

* TLS 1.2 is the floor; certificates are verified against the given CA file, else the
  system's; a server with a CA file requires and verifies client certificates (mTLS), one
  without does not ask for them.
* A file that is missing or does not hold what it should is a :class:`TLSConfigError`
  naming the file, raised when the context is built (at start-up, not at first dial).
* Under TLS a connection writes through its transport (nothing writes the raw socket: the
  kernel would send plaintext), see ``gazette.rpc.connection``.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass

from gazette.errors import GazetteError

__all__ = ["ClientTLS", "ServerTLS", "TLSConfigError"]

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection may take to finish its TLS handshake


class TLSConfigError(GazetteError):
    """A certificate, key or CA file cannot be used."""


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str, what: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file or None)
    except FileNotFoundError as err:
        raise TLSConfigError(f"{what}: no such file: {err.filename or cert_file}") from None
    except (ssl.SSLError, OSError) as err:
        raise TLSConfigError(f"{what}: cannot load certificate {cert_file!r} with key "
                             f"{key_file or cert_file!r}: {err}") from None


def _load_ca(ctx: ssl.SSLContext, ca_file: str, what: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise TLSConfigError(f"{what}: no such file: {ca_file}") from None
    except (ssl.SSLError, OSError) as err:
        raise TLSConfigError(f"{what}: cannot load CA file {ca_file!r}: {err}") from None


@dataclass(frozen=True)
class ServerTLS:
    """A server port's TLS: its certificate and key, and (for mTLS) the CA of its clients."""

    cert_file: str
    key_file: str = ""
    ca_file: str = ""

    @functools.cached_property
    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(ctx, self.cert_file, self.key_file, "server certificate")
        if self.ca_file:
            _load_ca(ctx, self.ca_file, "server CA (client certificates)")
            ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx


@dataclass(frozen=True)
class ClientTLS:
    """How to dial ``https://`` endpoints: the CA to trust (the system's when empty) and
    optionally a client certificate and key (for servers requiring mTLS)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @functools.cached_property
    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca_file:
            _load_ca(ctx, self.ca_file, "trusted CA")
        if self.cert_file:
            _load_chain(ctx, self.cert_file, self.key_file, "client certificate")
        ctx.set_alpn_protocols(["h2"])
        return ctx

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(root CA, private key, certificate chain) as grpcio's credentials take them."""
        def read(path: str, what: str) -> bytes | None:
            if not path:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as err:
                raise TLSConfigError(f"{what}: cannot read {path!r}: {err.strerror}") from None
        return (read(self.ca_file, "trusted CA"), read(self.key_file or self.cert_file, "client key"),
                read(self.cert_file, "client certificate"))

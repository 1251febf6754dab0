"""Process flags in Gazette's style: ``--group.name`` flags that default to their environment
variable (``GROUP_NAME``), and typed reads of them that exit with one line naming a bad flag.

Security flags are Gazette's: a server's ``--{role}.server-cert-file``/``-cert-key-file``/
``-ca-file`` (TLS; a CA file requires client certificates) and ``--{role}.peer-*`` (its dials
to peers), ``--auth-keys`` (signing and verifying bearer tokens), and a client's
``--{role}.cert-file``/``-cert-key-file``/``trusted-ca-file`` and ``--{role}.auth-keys``/
``--{role}.auth-token``. A file that cannot be used exits at start-up naming it.

etcd's are Gazette's too: ``--etcd.address`` (``https://`` dials TLS) with
``--etcd.cert-file``/``-cert-key-file``/``-trusted-ca-file`` (``ETCD_CERT_FILE``, ...).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gazette.auth import Authorizer, KeyedAuth
    from gazette.rpc.tls import ClientTLS, ServerTLS

__all__ = ["Flag", "Flags", "add_flags", "client_security_flags", "etcd_tls_flags", "server_security_flags"]

T = TypeVar("T")

Flag = tuple[str, str, Any, str]
"""(flag, environment variable, default, help)."""


def server_security_flags(role: str) -> list[Flag]:
    """A server's TLS flags (``--broker.server-cert-file``, ...) and ``--auth-keys``."""
    env = role.upper()
    return [
        (f"--{role}.server-cert-file", f"{env}_SERVER_CERT_FILE", "",
         "Path to the server TLS certificate. Turns TLS on; if absent, the other TLS settings are ignored"),
        (f"--{role}.server-cert-key-file", f"{env}_SERVER_CERT_KEY_FILE", "", "Path to the server TLS private key"),
        (f"--{role}.server-ca-file", f"{env}_SERVER_CA_FILE", "",
         "Path to the trusted CA of client certificates. When present, clients must present a certificate it signed"),
        (f"--{role}.peer-cert-file", f"{env}_PEER_CERT_FILE", "", "Path to the client TLS certificate for peer-to-peer requests"),
        (f"--{role}.peer-cert-key-file", f"{env}_PEER_CERT_KEY_FILE", "", "Path to the client TLS private key for peer-to-peer requests"),
        (f"--{role}.peer-ca-file", f"{env}_PEER_CA_FILE", "",
         "Path to the trusted CA of peer server certificates. When absent, the system CA pool is used"),
        ("--auth-keys", "AUTH_KEYS", "",
         "Whitespace or comma separated, base64-encoded keys used to sign (first key) and verify (all keys) "
         "Authorization tokens. AA== lets requests without a token through. Empty: authorization off"),
    ]


def client_security_flags(role: str) -> list[Flag]:
    """A client's TLS and token flags for dialing ``role`` (``--broker.cert-file``, ...)."""
    env = role.upper()
    return [
        (f"--{role}.cert-file", f"{env}_CERT_FILE", "", "Path to the client TLS certificate"),
        (f"--{role}.cert-key-file", f"{env}_CERT_KEY_FILE", "", "Path to the client TLS private key"),
        (f"--{role}.trusted-ca-file", f"{env}_TRUSTED_CA_FILE", "",
         "Path to the trusted CA for client verification of server certificates"),
        (f"--{role}.auth-keys", f"{env}_AUTH_KEYS", "",
         "Whitespace or comma separated, base64-encoded keys. The first key is used to sign Authorization tokens"),
        (f"--{role}.auth-token", f"{env}_AUTH_TOKEN", "", "Bearer token to use for authentication"),
    ]


def etcd_tls_flags() -> list[Flag]:
    """How a process dials an ``https://`` ``--etcd.address`` (Gazette's EtcdConfig flags)."""
    return [
        ("--etcd.cert-file", "ETCD_CERT_FILE", "", "Path to the client TLS certificate (for an https:// --etcd.address)"),
        ("--etcd.cert-key-file", "ETCD_CERT_KEY_FILE", "", "Path to the client TLS private key"),
        ("--etcd.trusted-ca-file", "ETCD_TRUSTED_CA_FILE", "",
         "Path to the trusted CA for client verification of etcd's certificate. When absent, the system CA pool is used"),
    ]


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    """Adds ``flags``, each defaulting to its environment variable."""
    for flag, env, default, help_ in flags:
        dest = flag[2:].replace(".", "_").replace("-", "_")
        if isinstance(default, bool):  # a switch, as Go's boolean flags: present is on
            value = os.environ.get(env)
            on = default if value is None else value.strip().lower() in _TRUE
            parser.add_argument(flag, dest=dest, action="store_true", default=on, help=f"{help_} [${env}]")
            continue
        parser.add_argument(flag, dest=dest, default=os.environ.get(env, default),
                            help=f"{help_} [${env}] (default {default})")


_TRUE = frozenset({"1", "t", "true", "y", "yes", "on"})


class Flags:
    """Typed reads of parsed flags; a bad value exits naming the flag."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns

    def get(self, name: str) -> str:
        return str(getattr(self.ns, name.replace(".", "_").replace("-", "_")))

    def switch(self, name: str) -> bool:
        """A boolean flag (added with a ``bool`` default)."""
        return bool(getattr(self.ns, name.replace(".", "_").replace("-", "_")))

    def integer(self, name: str) -> int:
        try:
            return int(self.get(name))
        except ValueError:
            raise SystemExit(f"gazette: invalid --{name} {self.get(name)!r} (expected an integer)") from None

    def seconds(self, name: str) -> float:
        """A Go-style duration flag (``20s``, ``30ms``), in seconds."""
        from gazette.durations import parse_duration

        try:
            return parse_duration(self.get(name)).total_seconds()
        except ValueError as err:
            raise SystemExit(f"gazette: invalid --{name}: {err}") from None

    def server_tls(self, role: str) -> ServerTLS | None:
        """``--{role}.server-*``: the port's TLS (None without a certificate)."""
        from gazette.rpc.tls import ServerTLS

        cert = self.get(f"{role}.server-cert-file")
        if not cert:
            return None
        tls = ServerTLS(cert, self.get(f"{role}.server-cert-key-file"), self.get(f"{role}.server-ca-file"))
        return self._checked(tls, f"{role}.server-cert-file")

    def peer_tls(self, role: str) -> ClientTLS | None:
        """``--{role}.peer-*``: how the process dials ``https://`` peers."""
        return self._client_tls(f"{role}.peer-cert-file", f"{role}.peer-cert-key-file", f"{role}.peer-ca-file")

    def client_tls(self, role: str) -> ClientTLS | None:
        """``--{role}.cert-file`` and friends: how a client dials ``https://`` servers."""
        return self._client_tls(f"{role}.cert-file", f"{role}.cert-key-file", f"{role}.trusted-ca-file")

    def _client_tls(self, cert: str, key: str, ca: str) -> ClientTLS | None:
        from gazette.rpc.tls import ClientTLS

        tls = ClientTLS(ca_file=self.get(ca), cert_file=self.get(cert), key_file=self.get(key))
        if not (tls.ca_file or tls.cert_file):
            return None
        return self._checked(tls, cert if tls.cert_file else ca)

    @staticmethod
    def _checked(tls: T, flag: str) -> T:
        from gazette.rpc.tls import TLSConfigError

        try:
            tls.context  # type: ignore[attr-defined]  # noqa: B018 - loads every file now
        except TLSConfigError as err:
            raise SystemExit(f"gazette: invalid --{flag}: {err}") from None
        return tls

    def etcd_address(self, name: str = "etcd.address") -> str:
        """``--etcd.address``, checked now: a malformed endpoint exits naming the flag (rather
        than failing with a traceback as the process dials etcd)."""
        from gazette.etcd.client import EtcdEndpointError, parse_endpoint

        address = self.get(name)
        try:
            parse_endpoint(address)
        except EtcdEndpointError as err:
            raise SystemExit(f"gazette: invalid --{name}: {err}") from None
        return address

    def etcd_tls(self) -> ClientTLS | None:
        """``--etcd.cert-file`` and friends, checked now against ``--etcd.address``: None for a
        plaintext address without them, ``ClientTLS()`` (the system's roots) for an
        ``https://`` one without them; files given for a plaintext address, or a file that
        cannot be used, exit naming the flag."""
        from gazette.etcd.client import is_tls_endpoint
        from gazette.rpc.tls import ClientTLS

        tls = ClientTLS(ca_file=self.get("etcd.trusted-ca-file"), cert_file=self.get("etcd.cert-file"),
                        key_file=self.get("etcd.cert-key-file"))
        given = [f"--etcd.{n}" for n, v in (("cert-file", tls.cert_file), ("cert-key-file", tls.key_file),
                                             ("trusted-ca-file", tls.ca_file)) if v]
        if not is_tls_endpoint(self.etcd_address()):
            if given:
                raise SystemExit(f"gazette: invalid {given[0]}: --etcd.address {self.get('etcd.address')!r} is "
                                 "not https:// (TLS files need an https:// etcd endpoint)")
            return None
        if tls.key_file and not tls.cert_file:
            raise SystemExit("gazette: invalid --etcd.cert-key-file: no --etcd.cert-file to go with it")
        if tls.ca_file:  # checked alone first, so that its error names its own flag
            self._checked(ClientTLS(ca_file=tls.ca_file), "etcd.trusted-ca-file")
        return self._checked(tls, "etcd.cert-file")

    def auth_keys(self, name: str = "auth-keys") -> KeyedAuth | None:
        """``--auth-keys`` (or ``--{role}.auth-keys``): the keyed auth, None when empty."""
        from gazette.auth import KeyedAuth

        keys = self.get(name)
        if not keys:
            return None
        try:
            return KeyedAuth(keys)
        except ValueError as err:
            raise SystemExit(f"gazette: invalid --{name}: {err}") from None

    def client_auth(self, role: str) -> Authorizer | None:
        """How a client authorizes its calls to ``role``: ``--{role}.auth-token`` as given, else
        tokens signed with ``--{role}.auth-keys``, else none."""
        from gazette.auth import BearerAuth

        token = self.get(f"{role}.auth-token")
        if token:
            return BearerAuth(token)
        return self.auth_keys(f"{role}.auth-keys")

    def process_id(self, role: str, default_suffix: str) -> tuple[str, str]:
        """(zone, suffix) of ``--{role}.zone`` and ``--{role}.id`` (``default_suffix`` when the
        id is empty), validated as a ProcessSpec.ID."""
        from gazette.protocol import protocol_pb2 as pb
        from gazette.protocol.errors import ValidationError
        from gazette.protocol.validate import validate_process_id

        zone, suffix = self.get(f"{role}.zone"), self.get(f"{role}.id") or default_suffix
        try:
            validate_process_id(pb.ProcessSpec.ID(zone=zone, suffix=suffix))
        except ValidationError as err:
            raise SystemExit(f"gazette: invalid --{role}.zone/--{role}.id: {err}") from None
        return zone, suffix

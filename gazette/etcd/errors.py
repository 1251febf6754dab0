"""Errors of gazette's use of etcd.

::

    EtcdError (GazetteError)      base of everything below
    ├── TxnFailedError            a revision-checked transaction did not apply (compare failed)
    ├── client.EtcdEndpointError  an endpoint that cannot be used (malformed, or TLS files for http://)
    ├── client.EtcdTLSError       the TLS handshake with etcd failed (a certificate refused)
    ├── keyspace.KeySpaceError    the mirror: layout and decoding
    └── testing.etcd_process.*    running an etcd server (binary not found, start failed)
"""

from __future__ import annotations

from gazette.errors import GazetteError

__all__ = ["EtcdError", "TxnFailedError"]


class EtcdError(GazetteError):
    """Base of errors about etcd."""


class TxnFailedError(EtcdError):
    """A revision-checked etcd transaction did not apply: what it read has changed."""

"""The root of every error gazette raises on purpose, and how each maps onto RPC outcomes.

::

    GazetteError                          anything gazette raised deliberately
    ├── ValidationError (ValueError)      a message, spec or value breaks a rule    INVALID_ARGUMENT / 400
    │   └── protocol.labels.SelectorError a label selector's text does not parse
    ├── protocol.errors.StatusError       an operation ended with a non-OK Status
    ├── client.errors.ClientError         the journal client (transport, broker statuses)
    ├── message.errors.MessageError       framing, mapping, sequencing
    ├── fragment.errors.FragmentError     fragments, codecs, stores
    ├── etcd.EtcdError, KeySpaceError     etcd process and mirror
    ├── allocator.errors.AllocatorError   announcement and assignment
    └── broker.*                          append streams, replication, flow control, resolution

Every package's error tree hangs from ``GazetteError`` (``except GazetteError`` catches
anything gazette raised on purpose; anything else is a bug). This module is the bottom layer:
it imports nothing from gazette, so every package may derive from it.

Invariants:

* Each class says how an RPC that fails with it ends: ``grpc_code`` (the name of a
  ``grpc.StatusCode`` member) and ``http_status``. Subclasses inherit their root's mapping
  unless they say otherwise. The one edge (``gazette.server.edge``) reads these attributes;
  handlers never map exceptions by hand.
* The default for an error nobody classified is ``UNKNOWN`` / 500: a deliberate error that
  reaches a client unclassified is a server fault, and gRPC's ``UNKNOWN`` is what grpcio
  itself answers for an unhandled exception, so clients see the same code either way.
* A ``ValidationError`` names the *field* it concerns as a dotted attribute path on the message
  that was validated (``fragment.length``, ``labels.labels[2].name``); evaluating that path on
  the message reaches the offending value. The empty path means the message as a whole.
  ``str()`` is ``"<field>: <rule>"``, or just the rule when the path is empty. Validators build
  the path inside out: the innermost raises with the field it knows and every enclosing
  validator prepends its segment (``add_parent``) as the exception passes through.
"""

from __future__ import annotations

import logging
import secrets
from typing import ClassVar

__all__ = ["GazetteError", "ValidationError", "incident"]


class GazetteError(Exception):
    """Base class of errors raised deliberately by gazette."""

    grpc_code: ClassVar[str] = "UNKNOWN"
    """Name of the ``grpc.StatusCode`` an RPC failing with this error ends with."""
    http_status: ClassVar[int] = 500
    """HTTP status the gateway answers with."""


class ValidationError(GazetteError, ValueError):
    """A value breaks a protocol rule; ``field`` says where and ``rule`` says which."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(field, rule)
        self.field = field
        self.rule = rule

    def add_parent(self, parent: str) -> ValidationError:
        """Prefix ``parent`` (a field name or ``name[i]``) to the path; returns self.

        The exception is updated in place so that a bare ``raise`` keeps its traceback.
        """
        if not parent:
            return self
        if not self.field:
            self.field = parent
        elif self.field.startswith("["):
            self.field = parent + self.field
        else:
            self.field = parent + "." + self.field
        self.args = (self.field, self.rule)
        return self

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}" if self.field else self.rule


def incident(log: logging.Logger, what: str, err: BaseException) -> str:
    """Logs an unexpected ``err`` (a bug) with its traceback under a new incident id, and
    returns what a client is told instead: that id, nothing of the error itself."""
    ident = secrets.token_hex(4)
    log.error("unexpected error", exc_info=err, extra={"rpc": what, "incident": ident})
    return f"internal error (incident {ident}; the server's log has the details)"

"""The protocol's exception hierarchy and its mapping onto RPC outcomes.

::

    GazetteError                      base of every error this package raises on purpose
    ├── ValidationError (ValueError)  a message, spec or value breaks a protocol rule
    │   └── (labels.SelectorError)    a label selector's text does not parse
    └── StatusError                   an operation ended with a non-OK ``protocol.Status``

Invariants:

* A ``ValidationError`` names the *field* it concerns as a dotted attribute path on
  the message that was validated (``fragment.length``, ``labels.labels[2].name``,
  ``changes[0].upsert.name``); evaluating that path on the message reaches the
  offending value. The empty path means the message as a whole. ``str()`` is
  ``"<field>: <rule>"``, or just the rule when the path is empty.
* Validators build the path from the inside out: the innermost validator raises
  with the field it knows, and every enclosing validator prepends its own segment
  (``add_parent``) as the exception passes through, so no validator needs to know
  where its message sits.
* Gazette's ``Status`` enum has no "invalid" member: malformed requests are refused
  at the RPC layer with gRPC ``INVALID_ARGUMENT`` instead of a response status.
  ``grpc_code_of`` encodes that rule and ``status_of`` returns ``None`` for them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "GazetteError",
    "StatusError",
    "ValidationError",
    "grpc_code_of",
    "status_of",
]


class GazetteError(Exception):
    """Base class of errors raised deliberately by gazette."""


class ValidationError(GazetteError, ValueError):
    """A value breaks a protocol rule; ``field`` says where and ``rule`` says which."""

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


class StatusError(GazetteError):
    """An operation completed with a non-OK ``protocol.Status`` which callers act upon."""

    def __init__(self, status: pb.Status.ValueType, detail: str = "") -> None:
        name = pb.Status.Name(status)
        super().__init__(f"{name}: {detail}" if detail else name)
        self.status = status
        self.detail = detail


def status_of(exc: BaseException) -> pb.Status.ValueType | None:
    """The ``protocol.Status`` a response should carry for ``exc``, if any.

    Only ``StatusError`` has one. ``None`` means the failure is not expressible as
    a response status and must end the RPC with ``grpc_code_of(exc)`` instead; in
    particular this is so for ``ValidationError``, which Gazette reports as gRPC
    ``INVALID_ARGUMENT`` because its ``Status`` enum has no member for it.
    """
    if isinstance(exc, StatusError):
        return exc.status
    return None


def grpc_code_of(exc: BaseException) -> Any:
    """The ``grpc.StatusCode`` with which an RPC failing with ``exc`` should end.

    ``ValidationError`` → ``INVALID_ARGUMENT`` (as Gazette does), timeouts →
    ``DEADLINE_EXCEEDED``, cancellation → ``CANCELLED``, and anything else
    → ``UNKNOWN``.
    """
    if isinstance(exc, ValidationError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN

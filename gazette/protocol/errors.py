"""The protocol's exceptions and their mapping onto RPC outcomes.

::

    gazette.errors.GazetteError       (re-exported) root of every deliberate error
    ├── ValidationError (ValueError)  (re-exported) a message, spec or value breaks a rule
    │   └── (labels.SelectorError)    a label selector's text does not parse
    └── StatusError                   an operation ended with a non-OK ``protocol.Status``

``GazetteError`` and ``ValidationError`` are defined in the bottom layer (``gazette.errors``)
and re-exported here, as they are this package's public vocabulary.

Invariants:

* Gazette's ``Status`` enum has no "invalid" member: malformed requests are refused
  at the RPC layer with gRPC ``INVALID_ARGUMENT`` instead of a response status.
  ``grpc_code_of`` encodes that rule and ``status_of`` returns ``None`` for them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from gazette.errors import GazetteError, ValidationError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "GazetteError",
    "StatusError",
    "ValidationError",
    "grpc_code_of",
    "status_of",
]


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

    A ``GazetteError`` says so itself (``grpc_code``; ``ValidationError`` is
    ``INVALID_ARGUMENT``, as Gazette answers); timeouts are ``DEADLINE_EXCEEDED``,
    cancellation ``CANCELLED``, and anything else ``UNKNOWN``.
    """
    if isinstance(exc, GazetteError):
        return getattr(grpc.StatusCode, exc.grpc_code)
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN

"""The protocol's exceptions.

::

    gazette.errors.GazetteError       (re-exported) root of every deliberate error
    ├── ValidationError (ValueError)  (re-exported) a message, spec or value breaks a rule
    │   └── (labels.SelectorError)    a label selector's text does not parse
    └── StatusError                   an operation ended with a non-OK ``protocol.Status``

``GazetteError`` and ``ValidationError`` are defined in the bottom layer (``gazette.errors``)
and re-exported here, as they are this package's public vocabulary.

Gazette's ``Status`` enum has no "invalid" member: malformed requests are refused at the RPC
layer with gRPC ``INVALID_ARGUMENT`` instead of a response status. How an error ends an RPC or
an HTTP request is decided at one edge, ``gazette.server.edge``.
"""

from __future__ import annotations

from gazette.errors import GazetteError, ValidationError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "GazetteError",
    "StatusError",
    "ValidationError",
]


class StatusError(GazetteError):
    """An operation completed with a non-OK ``protocol.Status`` which callers act upon."""

    def __init__(self, status: pb.Status.ValueType, detail: str = "") -> None:
        name = pb.Status.Name(status)
        super().__init__(f"{name}: {detail}" if detail else name)
        self.status = status
        self.detail = detail

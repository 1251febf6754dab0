"""Errors raised by the journal client.

Invariants:
- Every error a broker reports through a response ``status`` is a ``BrokerStatusError``
  carrying that status (``.status``, ``.status_name``) and the journal it concerns.
- Transport failures (a gRPC status other than OK) are ``TransportError`` and carry the
  gRPC code; ``transient`` says whether a retry may succeed.
- The hierarchy hangs off gazette.protocol.errors: ``ClientError`` is a ``GazetteError``
  and ``BrokerStatusError`` is also a ``StatusError`` (its ``status`` the response's).
"""

from __future__ import annotations

import grpc

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.errors import GazetteError, StatusError


class ClientError(GazetteError):
    """Base of every error raised by gazette.client."""


class ResponseValidationError(ClientError, ValueError):
    """A broker's response violates the protocol contract (requests that break a rule raise
    ``gazette.errors.ValidationError`` instead)."""


def status_name(status: int) -> str:
    """Name of a broker ``Status`` value, or its number when unknown."""
    try:
        return pb.Status.Name(status)  # type: ignore[arg-type]
    except ValueError:
        return f"STATUS_{status}"


class BrokerStatusError(ClientError, StatusError):
    """A broker answered with a status other than OK."""

    def __init__(self, status: int, journal: str = "", detail: str = "") -> None:
        StatusError.__init__(self, status, detail)  # type: ignore[arg-type]
        self.journal = journal
        msg = status_name(status)
        if journal:
            msg += f" (journal {journal!r})"
        if detail:
            msg += f": {detail}"
        self.args = (msg,)

    @property
    def status_name(self) -> str:
        return status_name(self.status)


class ReadError(BrokerStatusError):
    """A Read RPC ended with a non-OK status."""


class OffsetNotYetAvailable(ReadError):
    """A non-blocking read reached the write head (status OFFSET_NOT_YET_AVAILABLE)."""

    def __init__(self, journal: str = "", offset: int = 0) -> None:
        self.offset = offset
        super().__init__(pb.OFFSET_NOT_YET_AVAILABLE, journal, f"write head at offset {offset}")


class AppendError(BrokerStatusError):
    """An Append RPC was refused: nothing of it committed."""

    def __init__(self, status: int, journal: str = "", detail: str = "",
                 response: pb.AppendResponse | None = None) -> None:
        self.response = response
        super().__init__(status, journal, detail)


class ListError(BrokerStatusError):
    """A List RPC ended with a non-OK status."""


class ApplyError(BrokerStatusError):
    """An Apply RPC was refused (ETCD_TRANSACTION_FAILED for a stale revision)."""


class FragmentsError(BrokerStatusError):
    """A ListFragments RPC ended with a non-OK status."""


class TransportError(ClientError):
    """The RPC failed below the broker protocol (connection, deadline, cancellation)."""

    TRANSIENT_CODES = frozenset({
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    })

    def __init__(self, code: grpc.StatusCode, details: str, endpoint: str = "",
                 journal: str = "") -> None:
        self.code = code
        self.details = details
        self.endpoint = endpoint
        self.journal = journal
        where = f" from {endpoint}" if endpoint else ""
        what = f" (journal {journal!r})" if journal else ""
        super().__init__(f"{code.name}{where}{what}: {details}")

    @property
    def transient(self) -> bool:
        return self.code in self.TRANSIENT_CODES


class FragmentFetchError(ClientError):
    """A fragment could not be fetched or decoded from its store URL."""


class CodecUnavailable(FragmentFetchError):
    """No decompressor is available for a fragment's compression codec."""


# Statuses which mean "ask again, perhaps elsewhere": the cluster is converging on a
# new assignment, so a later attempt routed by the returned header is expected to work.
ROUTING_STATUSES = frozenset({
    pb.NOT_JOURNAL_BROKER,
    pb.NOT_JOURNAL_PRIMARY_BROKER,
    pb.NO_JOURNAL_PRIMARY_BROKER,
    pb.INSUFFICIENT_JOURNAL_BROKERS,
})

"""Routed client of gazette brokers: list and apply journal specs, read, append.

The async API (grpc.aio) is the primary one; ``SyncJournalClient`` wraps it for scripts.

    async with JournalClient("http://localhost:8080") as client:
        await append(client, "example/journal", b'{"Msg": "hi"}\\n')
        async for chunk in RetryReader(client, pb.ReadRequest(journal="example/journal")):
            ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gazette.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gazette.client.append_service import (
        AppendService,
        AppendServiceClosed,
        AsyncAppend,
        DependencyFailed,
    )
    from gazette.client.appender import Appender, append
    from gazette.client.errors import (
        AppendError,
        ApplyError,
        BrokerStatusError,
        ClientError,
        CodecUnavailable,
        FragmentFetchError,
        FragmentsError,
        ListError,
        OffsetNotYetAvailable,
        ReadError,
        ResponseValidationError,
        TransportError,
    )
    from gazette.client.journal_client import DEFAULT_ADDRESS, JournalClient, grpc_target
    from gazette.client.listing import (
        PolledList,
        apply_journals,
        get_journal,
        list_journals,
        parse_selector,
    )
    from gazette.client.reader import Reader, RetryReader, open_fragment, write_head
    from gazette.client.route_cache import RouteCache
    from gazette.client.sync import SyncJournalClient
    from gazette.errors import ValidationError

# Every name is loaded on first use (and then kept here): importing one part (the errors, say)
# does not import the rest (the append service, the readers, grpc's sync client).
_LAZY = {
    "AppendError": "gazette.client.errors",
    "AppendService": "gazette.client.append_service",
    "AppendServiceClosed": "gazette.client.append_service",
    "Appender": "gazette.client.appender",
    "ApplyError": "gazette.client.errors",
    "AsyncAppend": "gazette.client.append_service",
    "BrokerStatusError": "gazette.client.errors",
    "ClientError": "gazette.client.errors",
    "CodecUnavailable": "gazette.client.errors",
    "DEFAULT_ADDRESS": "gazette.client.journal_client",
    "DependencyFailed": "gazette.client.append_service",
    "FragmentFetchError": "gazette.client.errors",
    "FragmentsError": "gazette.client.errors",
    "JournalClient": "gazette.client.journal_client",
    "ListError": "gazette.client.errors",
    "OffsetNotYetAvailable": "gazette.client.errors",
    "PolledList": "gazette.client.listing",
    "ReadError": "gazette.client.errors",
    "Reader": "gazette.client.reader",
    "ResponseValidationError": "gazette.client.errors",
    "RetryReader": "gazette.client.reader",
    "RouteCache": "gazette.client.route_cache",
    "SyncJournalClient": "gazette.client.sync",
    "TransportError": "gazette.client.errors",
    "ValidationError": "gazette.errors",
    "append": "gazette.client.appender",
    "apply_journals": "gazette.client.listing",
    "get_journal": "gazette.client.listing",
    "grpc_target": "gazette.client.journal_client",
    "list_journals": "gazette.client.listing",
    "open_fragment": "gazette.client.reader",
    "parse_selector": "gazette.client.listing",
    "write_head": "gazette.client.reader",
}

__all__ = [
    "DEFAULT_ADDRESS",
    "AppendError",
    "AppendService",
    "AppendServiceClosed",
    "Appender",
    "ApplyError",
    "AsyncAppend",
    "BrokerStatusError",
    "ClientError",
    "CodecUnavailable",
    "DependencyFailed",
    "FragmentFetchError",
    "FragmentsError",
    "JournalClient",
    "ListError",
    "OffsetNotYetAvailable",
    "PolledList",
    "ReadError",
    "Reader",
    "RetryReader",
    "RouteCache",
    "SyncJournalClient",
    "TransportError",
    "ResponseValidationError",
    "ValidationError",
    "append",
    "apply_journals",
    "get_journal",
    "grpc_target",
    "list_journals",
    "write_head",
    "open_fragment",
    "parse_selector",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

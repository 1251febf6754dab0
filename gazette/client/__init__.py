"""Routed client of gazette brokers: list and apply journal specs, read, append.

The async API (grpc.aio) is the primary one; ``SyncJournalClient`` wraps it for scripts.

    async with JournalClient("http://localhost:8080") as client:
        await append(client, "example/journal", b'{"Msg": "hi"}\\n')
        async for chunk in RetryReader(client, pb.ReadRequest(journal="example/journal")):
            ...
"""

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

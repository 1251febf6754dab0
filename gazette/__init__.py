"""gazette: journals served by brokers, and exactly-once consumers, for Python.

Wire-compatible with Gazette (gazette/core). The names most programs need are here::

    import gazette

    async with gazette.JournalClient("http://localhost:8080") as client:
        service = gazette.AppendService(client)
        publisher = gazette.Publisher(service)
        await publisher.publish_committed(gazette.modulo_mapping(key, partitions), msg)
        await service.flush()
        async for env in gazette.read_committed(client, "examples/greetings", block=False):
            print(env.message)

Everything else lives in the subpackages (``gazette.client``, ``gazette.message``,
``gazette.protocol``, ...); see docs/architecture.md for the layers.

Names are loaded on first use: every module of gazette is imported through this package, so
it must stay cheap (``import gazette.errors`` does not load the client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gazette.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gazette.client import (
        AppendService,
        AsyncAppend,
        BrokerStatusError,
        ClientError,
        JournalClient,
        list_journals,
    )
    from gazette.errors import GazetteError, ValidationError
    from gazette.message import (
        Envelope,
        JSONMessage,
        Message,
        MessageError,
        Publisher,
        modulo_mapping,
        read_committed,
        read_committed_batches,
        read_uncommitted,
        rendezvous_mapping,
    )

__version__ = "0.1.0"

__all__ = [
    "AppendService",
    "AsyncAppend",
    "BrokerStatusError",
    "ClientError",
    "Envelope",
    "GazetteError",
    "JSONMessage",
    "JournalClient",
    "Message",
    "MessageError",
    "Publisher",
    "ValidationError",
    "__version__",
    "list_journals",
    "modulo_mapping",
    "read_committed",
    "read_committed_batches",
    "read_uncommitted",
    "rendezvous_mapping",
]

_HOMES = {
    "AppendService": "gazette.client", "AsyncAppend": "gazette.client",
    "BrokerStatusError": "gazette.client", "ClientError": "gazette.client",
    "JournalClient": "gazette.client", "list_journals": "gazette.client",
    "GazetteError": "gazette.errors", "ValidationError": "gazette.errors",
    "Envelope": "gazette.message", "JSONMessage": "gazette.message", "Message": "gazette.message",
    "MessageError": "gazette.message", "Publisher": "gazette.message",
    "modulo_mapping": "gazette.message", "read_committed": "gazette.message",
    "read_committed_batches": "gazette.message",
    "read_uncommitted": "gazette.message", "rendezvous_mapping": "gazette.message",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, __all__)

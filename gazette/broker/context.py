"""What the broker's RPC handlers use of their broker (Gazette's ``broker.Service``).

The Journal service, the HTTP gateway, the append state machine, reads, replication and the
replicas' pulses take a ``BrokerContext`` rather than the broker process, so none of them
imports the process (``broker/server.py``), which is built on them.

Invariants: the context answers for one broker process for its whole life; every method is
safe to call from any handler task on the process's event loop.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gazette.auth import Claims, Verifier
from gazette.broker.config import BrokerConfig
from gazette.broker.pipeline import PeerStream
from gazette.broker.replica import Replica
from gazette.broker.resolver import Resolution, Resolver
from gazette.broker.store_health import StoreHealth
from gazette.etcd.keyspace import KeySpace
from gazette.fragment.stores import Stores
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc

__all__ = ["BrokerContext"]


class BrokerContext(Protocol):
    """The broker as its handlers see it (implemented by ``gazette.broker.server.Broker``)."""

    config: BrokerConfig
    keyspace: KeySpace
    resolver: Resolver
    stores: Stores
    store_health: StoreHealth
    ready: asyncio.Event
    verifier: Verifier
    """Checks each request's token (``gazette.auth.NO_AUTH`` when authorization is off)."""

    def peer_stub(self, endpoint: str) -> pb_grpc.JournalStub:
        """A Journal stub of the broker at ``endpoint`` (proxying)."""
        ...

    def dial_replicate(self, route: pb.Route, i: int) -> PeerStream:
        """A Replicate stream to member ``i`` of ``route``."""
        ...

    async def update_assignments(self, replica: Replica, res: Resolution) -> int:
        """Advertises a synchronised route in the journal's assignments; the revision to read
        through."""
        ...

    async def update_suspend(self, res: Resolution, level: int, offset: int) -> int:
        """Revision-checked update of a journal's suspension; the revision to read through."""
        ...

    def list_journals(self, selector: labels.LabelSelector, claims: Claims | None = None,
                      page_size: int = 1 << 62) -> tuple[list[bytes], tuple[int, int]]:
        """The journals matching ``selector`` (and in ``claims``' scope), in serialized
        ListResponses of ``page_size`` at most (the first with status and header), with a key
        that changes when they do."""
        ...

    async def apply_journals(self, req: pb.ApplyRequest,
                             unchanged: list[tuple[str, int]] | None = None) -> pb.ApplyResponse:
        """Applies journal spec changes in one revision-checked transaction."""
        ...

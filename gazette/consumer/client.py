"""An async client of the ``consumer.Shard`` service (Gazette's ``consumer/shard_api.go`` client
half): ``list``, ``apply``, ``stat``, ``get_hints``, ``unassign``.

Invariants:

* A response status other than OK raises ``ShardStatusError`` carrying it (``.status``,
  ``.status_name``); a transport failure raises the journal client's ``TransportError``.
* Any consumer process of the group answers every call: ``Stat`` and ``GetHints`` are
  forwarded by the process that receives them to the shard's primary.
* One channel per endpoint (a ``ChannelPool``), opened on first use and closed by ``close``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from gazette.auth import Authorizer
from gazette.client.channels import (
    CHANNEL_OPTIONS,
    ChannelPool,
    PooledClient,
    apply_in_batches,
    grpc_target,
)
from gazette.client.journal_client import DEFAULT_ADDRESS, rpc_error
from gazette.consumer.errors import ConsumerError
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import consumer_pb2_grpc as pc_grpc
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.channel import insecure_channel
from gazette.rpc.seam import ChannelFactory, RpcChannel
from gazette.rpc.tls import ClientTLS

STAT_RETRY_SECONDS = 30.0  # how long Stat asks again after SHARD_STOPPED (a handoff)

__all__ = ["ShardClient", "ShardStatusError", "shard_status_name"]


def shard_status_name(status: int) -> str:
    try:
        return pc.Status.Name(status)  # type: ignore[arg-type]
    except ValueError:
        return f"STATUS_{status}"


class ShardStatusError(ConsumerError):
    """A consumer answered with a status other than OK."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, status: int, detail: str = "") -> None:
        self.status = status
        super().__init__(shard_status_name(status) + (f": {detail}" if detail else ""))

    @property
    def status_name(self) -> str:
        return shard_status_name(self.status)


class ShardClient(PooledClient):
    def __init__(self, address: str = DEFAULT_ADDRESS, *,
                 channel_factory: ChannelFactory = insecure_channel,
                 tls: ClientTLS | None = None, auth: Authorizer | None = None) -> None:
        self.address = address
        self.tls, self.auth = tls, auth
        self.channels = ChannelPool(CHANNEL_OPTIONS, channel_factory, tls, auth)
        grpc_target(address)  # Validate eagerly: a bad address is a configuration error.

    def channel(self, endpoint: str | None = None) -> RpcChannel:
        """The channel to ``endpoint`` (the default address when None), opened on first use."""
        return self.channels.channel(endpoint or self.address)

    def stub(self, endpoint: str | None = None) -> Any:
        return self.channels.stub(endpoint or self.address, pc_grpc.ShardStub)

    async def _call(self, method: str, req: Any, endpoint: str | None = None) -> Any:
        try:
            resp = await getattr(self.stub(endpoint), method)(req)
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, endpoint or self.address) from None
        if resp.status != pc.Status.OK:
            raise ShardStatusError(resp.status, f"{method} at {endpoint or self.address}")
        return resp

    async def list(self, selector: pb.LabelSelector | None = None) -> pc.ListResponse:
        resp: pc.ListResponse = await self._call(
            "List", pc.ListRequest(selector=selector or pb.LabelSelector()))
        return resp

    async def apply(self, changes: pc.ApplyRequest | Iterable[pc.ApplyRequest.Change],
                    batch_size: int = 0) -> pc.ApplyResponse:
        """Applies shard changes; with ``batch_size`` > 0, in several transactions of at most
        that many changes (so they may partly apply)."""
        all_changes = list(changes.changes if isinstance(changes, pc.ApplyRequest) else changes)
        return await apply_in_batches(all_changes, batch_size, self._apply)

    async def _apply(self, changes: Sequence[pc.ApplyRequest.Change]) -> pc.ApplyResponse:
        resp: pc.ApplyResponse = await self._call("Apply", pc.ApplyRequest(changes=changes))
        return resp

    async def stat(self, shard: str, read_through: Mapping[str, int] | None = None) -> pc.StatResponse:
        """The shard's read-through offsets, once it has read through ``read_through``.

        A Stat waiting on a shard that stops meanwhile (its assignment moved: a rebalance, a
        drain) answers SHARD_STOPPED; Stat is read-only, so it is asked again, where the shard
        now runs, for up to ``STAT_RETRY_SECONDS``."""
        req = pc.StatRequest(shard=shard)
        for journal, offset in (read_through or {}).items():
            req.read_through[journal] = offset
        deadline, pause = time.monotonic() + STAT_RETRY_SECONDS, 0.05
        while True:
            try:
                resp: pc.StatResponse = await self._call("Stat", req)
                return resp
            except ShardStatusError as err:
                if err.status != pc.Status.SHARD_STOPPED or time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)  # backoff before asking again, not synchronisation
            pause = min(pause * 2, 1.0)

    async def get_hints(self, shard: str) -> pc.GetHintsResponse:
        resp: pc.GetHintsResponse = await self._call("GetHints", pc.GetHintsRequest(shard=shard))
        return resp

    async def unassign(self, shards: Sequence[str], *, only_failed: bool = False,
                       dry_run: bool = False) -> pc.UnassignResponse:
        resp: pc.UnassignResponse = await self._call("Unassign", pc.UnassignRequest(
            shards=list(shards), only_failed=only_failed, dry_run=dry_run))
        return resp

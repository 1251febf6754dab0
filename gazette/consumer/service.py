"""The ``consumer.Shard`` gRPC service of a consumer process, wire-compatible with Gazette's.

``List`` (specs, routes and replica statuses of the shards a selector matches), ``Apply``
(revision-checked ShardSpec changes, refusing sources whose journals are missing or unframed),
``Stat`` (read-your-writes: answers once a completed transaction read through the requested
offsets), ``GetHints`` and ``Unassign`` (``only_failed``, ``dry_run``). Errors end RPCs at the
shared edge (``gazette.server.edge``); refusals the protocol names are response statuses.

Invariants:

* Every response header carries this process's ID and the keyspace's etcd header.
* An Apply either applies every change or none (one etcd transaction); a source journal that
  does not exist or has no framed content-type refuses the request with INVALID_ARGUMENT
  naming the field (``changes[i].upsert.sources[j].journal``).
* Stat is resolved by the ``Resolver``: served by the local primary once a completed
  transaction read through the requested offsets, or forwarded once to the remote primary
  with the resolution's header (which that process checks); never a second hop.
* Every RPC first verifies its token for the capability Gazette's Shard API needs (List LIST;
  Apply and Unassign APPLY; Stat and GetHints READ); a shard outside the token's selector is
  not listed and is SHARD_NOT_FOUND, and changing or unassigning one is PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import aetcd

from gazette import auth
from gazette.allocator.keys import item_assignments_prefix, items_key
from gazette.auth import Claims, Verifier, token_of
from gazette.client import JournalClient, list_journals
from gazette.client.journal_client import label_selector
from gazette.consumer.client import ShardClient
from gazette.consumer.recovery import HintsStore
from gazette.consumer.resolver import Resolver, replica_statuses
from gazette.consumer.shard import ShardRuntime
from gazette.errors import ValidationError
from gazette.etcd import txn
from gazette.etcd.keyspace import KeySpace
from gazette.message.errors import MessageError
from gazette.message.reading import framing_of_spec
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import consumer_pb2_grpc as pc_grpc
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSelector, LabelSet, with_shard_meta_labels
from gazette.protocol.validate_consumer import (
    validate_shard_apply_request,
    validate_shard_list_request,
    validate_stat_request,
)
from gazette.server import cluster
from gazette.server.edge import grpc_edge


class ConsumerContext(Protocol):
    """What the Shard service uses of its consumer process."""

    local_id: pb.ProcessSpec.ID
    keyspace: KeySpace
    client: JournalClient
    shards: dict[str, tuple[ShardRuntime[Any], asyncio.Task[None]]]
    resolver: Resolver
    peers: ShardClient  # channels to the other consumer processes, for proxied requests
    verifier: Verifier  # checks each request's token (NO_AUTH when authorization is off)

    @property
    def etcd(self) -> aetcd.Client: ...

__all__ = ["ConsumerContext", "ShardService"]


class ShardService(pc_grpc.ShardServicer):
    def __init__(self, proc: ConsumerContext) -> None:
        self.proc = proc

    def _verify(self, context: Any, require: int) -> Claims:
        return self.proc.verifier.verify(token_of(context.invocation_metadata()), require)

    def _in_scope(self, claims: Claims, shard_id: str, by_labels: bool = True) -> bool:
        """Whether ``claims`` reach the shard: by its labels and meta-labels, or (deletes and
        unassignments, as Gazette) by its id alone."""
        if claims.unrestricted:
            return True
        spec = None
        if by_labels:
            kv = self.proc.keyspace.search(items_key(self.proc.keyspace.root, shard_id))
            spec = kv.value if kv is not None and isinstance(kv.value, pc.ShardSpec) else None
        ls = LabelSet.from_proto(spec.labels) if spec is not None else LabelSet()
        return claims.permits(with_shard_meta_labels(ls, shard_id))

    def _header(self) -> pb.Header:
        return cluster.response_header(self.proc.keyspace, self.proc.local_id)

    @grpc_edge
    async def List(self, request: pc.ListRequest, context: Any) -> pc.ListResponse:
        claims = self._verify(context, auth.LIST)
        validate_shard_list_request(request)
        selector = LabelSelector.from_proto(request.selector)
        resp = pc.ListResponse(status=pc.Status.OK)
        resp.header.CopyFrom(self._header())
        for item in cluster.list_items(self.proc.keyspace, pc.ShardSpec, selector, claims, with_shard_meta_labels):
            kv = item.kv
            shard = resp.shards.add(spec=kv.value, mod_revision=kv.mod_revision, create_revision=kv.create_revision)
            shard.route.CopyFrom(item.route)
            shard.status.extend(replica_statuses(item.assignments))
        return resp

    @grpc_edge
    async def Apply(self, request: pc.ApplyRequest, context: Any) -> pc.ApplyResponse:
        claims = self._verify(context, auth.APPLY)
        validate_shard_apply_request(request)
        changes = [cluster.SpecChange.of(ch, "id") for ch in request.changes]
        cluster.check_changes_permitted(claims, changes, with_shard_meta_labels)
        wanted = sorted({s.journal for ch in request.changes if ch.HasField("upsert") for s in ch.upsert.sources})
        journals: dict[str, pb.JournalSpec] = {}
        if wanted:
            sel = label_selector(include=[("name", name) for name in wanted])
            journals = {j.spec.name: j.spec for j in (await list_journals(self.proc.client, sel)).journals}
        for i, ch in enumerate(request.changes):
            for j, src in enumerate(ch.upsert.sources if ch.HasField("upsert") else ()):
                field = f"changes[{i}].upsert.sources[{j}].journal"
                if src.journal not in journals:
                    raise ValidationError(field, f"journal {src.journal!r} does not exist")
                try:
                    framing_of_spec(journals[src.journal])
                except MessageError as err:
                    raise ValidationError(field, str(err)) from None
        applied = await cluster.apply_spec_changes(self.proc.etcd, self.proc.keyspace, changes)
        resp = pc.ApplyResponse(status=pc.Status.OK if applied else pc.Status.ETCD_TRANSACTION_FAILED)
        resp.header.CopyFrom(self._header())
        return resp

    @grpc_edge
    async def Stat(self, request: pc.StatRequest, context: Any) -> pc.StatResponse:
        claims = self._verify(context, auth.READ)
        validate_stat_request(request)
        if not self._in_scope(claims, request.shard):
            hidden = pc.StatResponse(status=pc.Status.SHARD_NOT_FOUND)
            hidden.header.CopyFrom(self._header())
            return hidden
        res = await self.proc.resolver.resolve(
            request.shard, may_proxy=not request.HasField("header"),
            proxy_header=request.header if request.HasField("header") else None,
            read_through=dict(request.read_through))
        if res.proxied:  # the primary is another process
            fwd = pc.StatRequest()
            fwd.CopyFrom(request)
            fwd.header.CopyFrom(res.header)
            proxied: pc.StatResponse = await self.proc.peers.stub(res.endpoint).Stat(fwd)
            return proxied
        resp = pc.StatResponse(status=res.status)  # type: ignore[arg-type]
        resp.header.CopyFrom(res.header)
        if res.shard is not None:
            read_through, publish_at = res.shard.progress()
            for j, o in read_through.items():
                resp.read_through[j] = o
            for j, o in publish_at.items():
                resp.publish_at[j] = o
        return resp

    @grpc_edge
    async def GetHints(self, request: pc.GetHintsRequest, context: Any) -> pc.GetHintsResponse:
        claims = self._verify(context, auth.READ)
        item = self.proc.keyspace.search(items_key(self.proc.keyspace.root, request.shard))
        if item is None or not isinstance(item.value, pc.ShardSpec) or not self._in_scope(claims, request.shard):
            resp = pc.GetHintsResponse(status=pc.Status.SHARD_NOT_FOUND)
        elif not item.value.recovery_log_prefix:
            resp = pc.GetHintsResponse(status=pc.Status.OK)  # no log, no hints
        else:
            resp = await HintsStore(self.proc.etcd, item.value).response()
        resp.header.CopyFrom(self._header())
        return resp

    @grpc_edge
    async def Unassign(self, request: pc.UnassignRequest, context: Any) -> pc.UnassignResponse:
        claims = self._verify(context, auth.APPLY)
        for shard_id in request.shards:
            if not self._in_scope(claims, shard_id, by_labels=False):
                raise auth.PermissionDenied(f"not authorized to {shard_id}")
        ks = self.proc.keyspace
        cmps: list[txn.Cmp] = []
        ops: list[txn.Op] = []
        out = pc.UnassignResponse(status=pc.Status.OK)
        for shard_id in request.shards:
            kvs = ks.prefixed(item_assignments_prefix(ks.root, shard_id))
            if request.only_failed:
                kvs = [kv for kv in kvs if isinstance(kv.value, pc.ReplicaStatus)
                       and kv.value.code == pc.ReplicaStatus.FAILED]
            if kvs:
                out.shards.append(shard_id)
            for kv in kvs:
                cmps.append(txn.Cmp(kv.key, "mod", kv.mod_revision))
                ops.append(txn.Delete(kv.key))
        if ops and not request.dry_run:
            result = await txn.commit(self.proc.etcd, cmps, ops)
            if not result.succeeded:
                out.status = pc.Status.ETCD_TRANSACTION_FAILED
                del out.shards[:]
            else:
                await ks.wait_for_revision(result.header.revision)
        return out


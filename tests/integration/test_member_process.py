"""gazette.server.process.MemberProcess as a consumer-like member: a ConsumerSpec announced under
a lease, a generated servicer (consumer.Shard) registered with add_service on the one port, the
debug routes, and a drain that hands items to another member and revokes the lease."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gazette.allocator.keys import items_key, members_key
from gazette.consumer.keys import consumer_decoder
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as cpb
from gazette.protocol import consumer_pb2_grpc as cpb_grpc
from gazette.rpc.channel import insecure_channel
from gazette.server.grpc import GrpcServer, add_service
from gazette.server.process import MemberProcess
from gazette.testing.etcd import EtcdFixture


class _Shards(cpb_grpc.ShardServicer):
    def __init__(self, member: _Member) -> None:
        self.member = member

    async def List(self, request: cpb.ListRequest, context: Any) -> cpb.ListResponse:
        resp = cpb.ListResponse(status=cpb.Status.OK)
        for kv in self.member.keyspace.prefixed(items_key(self.member.keyspace.root, "")):
            resp.shards.add(spec=kv.value)
        return resp


def _always_consistent(*_: Any) -> bool:
    # These items have no replicas to catch up (no shard runtime here): any assignment may move.
    return True


class _Member(MemberProcess):
    kind = "consumer"

    def __init__(self, etcd: EtcdFixture, suffix: str, limit: int) -> None:
        super().__init__(zone="z", suffix=suffix, host="127.0.0.1", port=0,
                         etcd_address=etcd.endpoint, etcd_lease=5,
                         keyspace=KeySpace(etcd.prefix, consumer_decoder(etcd.prefix)),
                         is_consistent=_always_consistent)
        self.limit = limit

    def register_services(self, server: GrpcServer) -> None:
        add_service(server, cpb.DESCRIPTOR.services_by_name["Shard"], _Shards(self))

    def member_spec(self, exiting: bool = False) -> bytes:
        spec = cpb.ConsumerSpec(shard_limit=0 if exiting else self.limit)
        spec.process_spec.id.CopyFrom(self.local_id)
        spec.process_spec.endpoint = self.endpoint
        return spec.SerializeToString()

    def has_capacity(self, spec: Any) -> bool:
        return isinstance(spec, cpb.ConsumerSpec) and spec.shard_limit > 0

    def holds_items(self) -> bool:
        me = f"#{self.local_id.zone}#{self.local_id.suffix}#"
        return any(me in kv.key for kv in self.keyspace.prefixed(f"{self.keyspace.root}/assign/"))


@contextlib.asynccontextmanager
async def _running(m: _Member) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(m.run())
    try:
        async with asyncio.timeout(30):
            while not m.ready.is_set():
                await asyncio.wait({task, asyncio.create_task(m.ready.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    task.result()
        yield task
    finally:
        m.stop()
        async with asyncio.timeout(30):
            await task


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


async def _wait(pred: Any, ks: KeySpace) -> None:
    async with asyncio.timeout(30):
        while not pred():
            await ks.wait_for_update()


@pytest.mark.timeout(120)
async def test_member_serves_announces_and_drains(etcd: EtcdFixture) -> None:
    spec = cpb.ShardSpec(id="shard-000")
    await etcd.client.put(items_key(etcd.prefix, spec.id).encode(), spec.SerializeToString())
    a, b = _Member(etcd, "a", limit=10), _Member(etcd, "b", limit=10)
    async with _running(a):
        # The one port serves the registered generated service and the debug routes.
        channel = insecure_channel(f"127.0.0.1:{a.bound_port}")
        try:
            resp = await cpb_grpc.ShardStub(channel).List(cpb.ListRequest())  # type: ignore[no-untyped-call]
        finally:
            await channel.close()
        assert [s.spec.id for s in resp.shards] == ["shard-000"]
        assert await asyncio.to_thread(_get, f"{a.endpoint}/debug/ready") == (200, b"ready\n")
        status, body = await asyncio.to_thread(_get, f"{a.endpoint}/debug/metrics")
        assert status == 200 and b"python_info" in body
        # The revision its keyspace has applied (how far it trails etcd), read at scrape time.
        revision = float(next(line for line in body.decode().splitlines()
                              if line.startswith('gazette_keyspace_revision{member="z#a"}')).split()[-1])
        assert 0 < revision <= a.keyspace.revision
        # Announced under its lease, with the endpoint that answered.
        got = await etcd.client.get(members_key(etcd.prefix, "z", "a").encode())
        assert got is not None
        assert cpb.ConsumerSpec.FromString(got.value).process_spec.endpoint == a.endpoint
        await _wait(a.holds_items, a.keyspace)

        async with _running(b):
            a.stop()  # a drains: zero capacity, so the allocator moves the shard to b
            await _wait(lambda: b.holds_items() and not a.holds_items(), b.keyspace)
    assert await etcd.client.get(members_key(etcd.prefix, "z", "a").encode()) is None
    assert await etcd.client.get(members_key(etcd.prefix, "z", "b").encode()) is None

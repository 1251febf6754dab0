"""Hostile clients against real member processes (issue 27): a broker (``gazette serve``, its
own process) and a consumer-shaped member (the consumer's scaffolding: MemberProcess, the one
port, the Shard service registered with add_service), each with raw frames beside a
well-behaved connection. The transport's limits live in gazette.rpc, which both serve with."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from raw_h2 import (
    GRPC_CODE,
    STALL_BOUND,
    Raw,
    answer,
    ping_rtt,
    request,
    tiny_literals,
)

from gazette.consumer.keys import consumer_decoder
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as cpb
from gazette.protocol import consumer_pb2_grpc as cpb_grpc
from gazette.rpc import frames as f
from gazette.server.edge import grpc_edge
from gazette.server.grpc import GrpcServer, add_service
from gazette.server.process import MemberProcess
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import EtcdFixture

pytestmark = pytest.mark.both_loops  # the transport on asyncio's loop and on uvloop (conftest)

#: A PING round trip on another connection while hostile header blocks arrive: 5.2 s before
#: blocks were bounded; the issue asks for under 100 ms, kept here with a margin for a busy
#: machine running the broker in another process.
PING_BOUND = 0.5


async def _hostile_blocks_beside_a_ping(port: int) -> float:
    """Four connections each sending a 1,023 KiB header block, twice; the worst PING round
    trip of a fifth meanwhile. Each hostile connection ends COMPRESSION_ERROR."""
    healthy = await Raw.connect(port)
    await ping_rtt(healthy, 1)
    worst, n = 0.0, 1
    for _ in range(2):
        hostile = [await Raw.connect(port) for _ in range(4)]
        for raw in hostile:
            raw.send(f.frame(f.HEADERS, f.END_HEADERS, 1, tiny_literals(1023 << 10)))
        for _ in range(3):
            n += 1
            worst = max(worst, await ping_rtt(healthy, n))
        for raw in hostile:
            assert await raw.goaway_code() == f.COMPRESSION_ERROR
    healthy.close()
    return worst


@pytest.mark.timeout(120)
async def test_broker_bounds_header_blocks_and_answers_garbage_appends(cluster: Cluster) -> None:
    broker = await asyncio.to_thread(cluster.add_broker)
    assert await _hostile_blocks_beside_a_ping(broker.port) < PING_BOUND
    # Garbage Append requests (42, as the probe): each ends with a status, never
    # UNKNOWN (an incident: our own exception); a decodable one is refused by validation.
    raw = await Raw.connect(broker.port)
    rng = random.Random(27)
    for i in range(42):
        garbage = rng.randbytes(rng.randint(1, 40))
        request(raw, 1 + 2 * i, "/protocol.Journal/Append", f.message_prefix(len(garbage)) + garbage)
        got = await answer(raw, 1 + 2 * i)
        assert got["grpc-status"] in ("0", GRPC_CODE["INVALID_ARGUMENT"]), (garbage, got)
    await echo_on_broker(raw, 85)
    raw.close()


async def echo_on_broker(raw: Raw, sid: int) -> None:
    """A well-formed List on the same connection is served (OK)."""
    from gazette.protocol import protocol_pb2 as pb

    body = pb.ListRequest().SerializeToString()
    request(raw, sid, "/protocol.Journal/List", f.message_prefix(len(body)) + body)
    assert (await answer(raw, sid))["grpc-status"] == "0"


# -- a consumer-shaped member ------------------------------------------------------------------


class _Shards(cpb_grpc.ShardServicer):
    @grpc_edge
    async def List(self, request: cpb.ListRequest, context: Any) -> cpb.ListResponse:
        return cpb.ListResponse(status=cpb.Status.OK)


class _Member(MemberProcess):
    kind = "consumer"

    def __init__(self, etcd: EtcdFixture) -> None:
        super().__init__(zone="z", suffix="hostile", host="127.0.0.1", port=0,
                         etcd_address=etcd.endpoint, etcd_lease=5,
                         keyspace=KeySpace(etcd.prefix, consumer_decoder(etcd.prefix)),
                         is_consistent=lambda *_: True)

    def register_services(self, server: GrpcServer) -> None:
        add_service(server, cpb.DESCRIPTOR.services_by_name["Shard"], _Shards())

    def member_spec(self, exiting: bool = False) -> bytes:
        spec = cpb.ConsumerSpec(shard_limit=0)
        spec.process_spec.id.CopyFrom(self.local_id)
        spec.process_spec.endpoint = self.endpoint
        return spec.SerializeToString()

    def has_capacity(self, spec: Any) -> bool:
        return False

    def holds_items(self) -> bool:
        return False


@contextlib.asynccontextmanager
async def _running(m: _Member) -> AsyncIterator[None]:
    task = asyncio.create_task(m.run())
    try:
        async with asyncio.timeout(30):
            ready = asyncio.create_task(m.ready.wait())
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            if task.done():
                task.result()
        yield
    finally:
        m.stop()
        async with asyncio.timeout(30):
            await task


@pytest.mark.timeout(120)
async def test_consumer_member_bounds_header_blocks_and_answers_garbage(
        etcd: EtcdFixture, stalls: list[float]) -> None:
    member = _Member(etcd)
    async with _running(member):
        port = member.bound_port
        t0 = time.perf_counter()
        assert await _hostile_blocks_beside_a_ping(port) < PING_BOUND
        assert time.perf_counter() - t0 < 60
        assert max(stalls, default=0.0) < STALL_BOUND  # in this process: measured, not inferred
        raw = await Raw.connect(port)
        garbage = b"\xff\xff\xff"
        request(raw, 1, "/consumer.Shard/List", f.message_prefix(len(garbage)) + garbage)
        assert (await answer(raw, 1))["grpc-status"] == GRPC_CODE["INVALID_ARGUMENT"]
        body = cpb.ListRequest().SerializeToString()
        request(raw, 3, "/consumer.Shard/List", f.message_prefix(len(body)) + body)
        assert (await answer(raw, 3))["grpc-status"] == "0"
        raw.close()

"""Hostile and careless clients of a real broker's Journal handlers (issue 27, the broker's part).

One broker process serves the module. Each case asserts what the broker answers and what it
writes to its log: a client going away or stalling is expected, and must log nothing above
DEBUG and no traceback (an attacker could otherwise fill the disk and drown real errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.rpc.channel import Channel
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.eventually import eventually_sync

DEADLINE = 30.0


@pytest.fixture(scope="module")
def hostile(etcd_server: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(etcd_server.url, unique_prefix(), tmp_path_factory.mktemp("hostile")) as c:
        c.add_broker("local", "hostile-yak")
        yield c


def new_journal(cluster: Cluster, store: str = "file:///") -> str:
    name = f"hostile/{uuid.uuid4().hex[:12]}"
    channel = grpc.insecure_channel(f"127.0.0.1:{cluster.broker.port}")
    try:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        spec = pb.JournalSpec(name=name, replication=1)
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.stores.append(store)
        spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
        req = pb.ApplyRequest()
        req.changes.add(upsert=spec, expect_mod_revision=0)
        assert stub.Apply(req, timeout=DEADLINE).status == pb.OK

        def assigned() -> bool:
            lr = pb.ListRequest()
            lr.selector.include.labels.add(name="name", value=name)
            return any(j.route.primary != -1 for r in stub.List(lr, timeout=DEADLINE) for j in r.journals)

        eventually_sync(assigned, f"{name} has a primary", DEADLINE)
    finally:
        channel.close()
    return name


def append(cluster: Cluster, journal: str, body: bytes) -> None:
    req = urllib.request.Request(cluster.broker.url(journal), data=body, method="PUT")
    with urllib.request.urlopen(req, timeout=DEADLINE) as resp:  # noqa: S310 - loopback
        assert resp.status == 204


def log_since(cluster: Cluster, offset: int) -> str:
    return cluster.broker.log_text()[offset:]


def test_blocking_readers_that_disconnect_log_no_traceback(hostile: Cluster) -> None:
    journal = new_journal(hostile)
    append(hostile, journal, b"hello\n")
    mark = len(hostile.broker.log_text())
    readers = 30

    async def run() -> None:
        channels = [Channel(f"127.0.0.1:{hostile.broker.port}") for _ in range(3)]
        try:
            calls = []
            for i in range(readers):
                stub = pb_grpc.JournalStub(channels[i % 3])  # type: ignore[no-untyped-call]
                call = stub.Read(pb.ReadRequest(journal=journal, offset=0, block=True))
                calls.append(call)
            # Each reader is served what there is, then blocks for more ...
            for call in calls:
                got = b""
                async with asyncio.timeout(DEADLINE):
                    while got != b"hello\n":
                        resp = await call.read()
                        assert resp.status == pb.OK
                        got += resp.content
            # ... then a third go away by cancelling, the rest by dropping their connections.
            for call in calls[: readers // 3]:
                call.cancel()
        finally:
            for ch in channels:
                await ch.close()

    asyncio.run(run())
    append(hostile, journal, b"more\n")  # wakes any reader still held
    # The broker notices every one (the next reader is served) and logs no traceback for it.
    channel = grpc.insecure_channel(f"127.0.0.1:{hostile.broker.port}")
    try:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        resp = next(iter(stub.Read(pb.ReadRequest(journal=journal, offset=0, block=False), timeout=DEADLINE)))
        assert resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE)
    finally:
        channel.close()
    text = log_since(hostile, mark)
    assert "Traceback" not in text and "ERRO" not in text and "WARN" not in text, text[-4000:]


def test_blocking_http_readers_that_disconnect_log_no_traceback(hostile: Cluster) -> None:
    journal = new_journal(hostile)
    append(hostile, journal, b"hello\n")
    mark = len(hostile.broker.log_text())
    socks = []
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", hostile.broker.port), timeout=DEADLINE)
        s.sendall(f"GET /{journal}?block=true&offset=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        got = b""
        while b"hello\n" not in got:
            got += s.recv(4096)
        socks.append(s)
    for s in socks:
        s.close()
    # Content arriving after they left wakes each reader's handler, which must end quietly.
    append(hostile, journal, b"more\n")
    channel = grpc.insecure_channel(f"127.0.0.1:{hostile.broker.port}")
    try:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        read = stub.Read(pb.ReadRequest(journal=journal, offset=6, block=False), timeout=DEADLINE)
        assert b"".join(r.content for r in read) == b"more\n"
    finally:
        channel.close()
    # The handlers wake on the commit and end as they will; give them a moment to log.
    with contextlib.suppress(TimeoutError):
        eventually_sync(lambda: "Traceback" in log_since(hostile, mark), "a traceback", 5.0)
    text = log_since(hostile, mark)
    assert "Traceback" not in text and "ERRO" not in text, text[-4000:]


def test_stalled_appends_do_not_hold_a_healthy_one(hostile: Cluster) -> None:
    """50 Appends on one journal open their streams and stall (half after naming the journal,
    half after a few bytes); a healthy append to the same journal is answered well within the
    issue's bound, and the stalled ones are aborted RESOURCE_EXHAUSTED (the minimum rate)
    with nothing of theirs committed. Before the read-ahead, the stalled appends held the
    pipeline one second each, in turn: the healthy append waited some 50 s."""
    journal = new_journal(hostile)
    stalled_count = 50

    async def run() -> float:
        channels = [Channel(f"127.0.0.1:{hostile.broker.port}") for _ in range(3)]
        try:
            calls = []
            for i in range(stalled_count):
                stub = pb_grpc.JournalStub(channels[i % 3])  # type: ignore[no-untyped-call]
                call = stub.Append()
                await call.write(pb.AppendRequest(journal=journal))
                if i % 2:
                    await call.write(pb.AppendRequest(content=b"partial "))
                calls.append(call)
            stub = pb_grpc.JournalStub(channels[0])  # type: ignore[no-untyped-call]
            began = asyncio.get_running_loop().time()

            async def healthy() -> AsyncIterator[pb.AppendRequest]:
                yield pb.AppendRequest(journal=journal)
                yield pb.AppendRequest(content=b"healthy\n")
                yield pb.AppendRequest()

            async with asyncio.timeout(DEADLINE):
                resp = await stub.Append(healthy())
            took = asyncio.get_running_loop().time() - began
            assert resp.status == pb.OK and resp.commit.end - resp.commit.begin == 8
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async with asyncio.timeout(DEADLINE):
                        await call
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return took
        finally:
            for ch in channels:
                await ch.close()

    took = asyncio.run(run())
    assert took < 10.0, f"the healthy append waited {took:.1f}s behind stalled ones"
    channel = grpc.insecure_channel(f"127.0.0.1:{hostile.broker.port}")
    try:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        read = stub.Read(pb.ReadRequest(journal=journal, offset=0, block=False), timeout=DEADLINE)
        assert b"".join(r.content for r in read) == b"healthy\n"
    finally:
        channel.close()

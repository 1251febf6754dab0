"""A real broker persisting fragments to S3 (moto's server on loopback).

The broker persists completed spools to an ``s3://`` store while it runs and the rest when it
drains; a new broker (no spools) serves the journals from S3; the client library reads them
by signed URL (``do_not_proxy``), straight from S3. AWS credentials reach the broker through
the environment (the ``s3_server`` fixture sets them; brokers inherit it).
"""

from __future__ import annotations

import asyncio
import functools
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.store_health import RETRY_INTERVALS_ENV
from gazette.client import JournalClient, RetryReader
from gazette.fragment import codecs, parse_content_name
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.cluster import BrokerProcess, Cluster
from gazette.testing.eventually import eventually_sync
from gazette.testing.s3 import create_bucket, s3_client

DEADLINE = 30.0
CODECS = {
    "gzod": pb.GZIP_OFFLOAD_DECOMPRESSION,
    "snappy": pb.SNAPPY,
    "raw": pb.NONE,
}


def store_url(endpoint: str, bucket: str) -> str:
    return f"s3://{bucket}/frags/?endpoint={quote(endpoint, safe='')}&region=us-east-1"


def journal_spec(name: str, codec: int, store: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=1)
    spec.labels.labels.add(name="content-type", value="application/x-ndjson")
    spec.fragment.length = 1024  # Gazette's minimum: spools roll every few appends.
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.stores.append(store)
    spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
    return spec


@pytest.fixture
def stub_for() -> Iterator[Any]:
    channels: list[grpc.Channel] = []

    def make(broker: BrokerProcess) -> pb_grpc.JournalStub:
        ch = grpc.insecure_channel(f"127.0.0.1:{broker.port}")
        channels.append(ch)
        return pb_grpc.JournalStub(ch)  # type: ignore[no-untyped-call]

    yield make
    for ch in channels:
        ch.close()


def apply(stub: pb_grpc.JournalStub, *specs: pb.JournalSpec) -> None:
    req = pb.ApplyRequest()
    for spec in specs:
        req.changes.add(upsert=spec, expect_mod_revision=0)
    assert stub.Apply(req, timeout=DEADLINE).status == pb.OK


def primaries(stub: pb_grpc.JournalStub, prefix: str) -> dict[str, str]:
    req = pb.ListRequest()
    req.selector.include.labels.add(name="prefix", value=prefix)
    out = {}
    for resp in stub.List(req, timeout=DEADLINE):
        for j in resp.journals:
            r = j.route
            out[j.spec.name] = r.members[r.primary].suffix if r.primary >= 0 else ""
    return out


def wait_assigned(stub: pb_grpc.JournalStub, prefix: str, names: list[str], broker: str) -> None:
    eventually_sync(lambda: all(primaries(stub, prefix).get(n) == broker for n in names), f"{names} have primary {broker}", DEADLINE)


def grpc_append(stub: pb_grpc.JournalStub, journal: str, body: bytes,
                timeout: float = DEADLINE) -> pb.AppendResponse:
    reqs = [pb.AppendRequest(journal=journal), pb.AppendRequest(content=body), pb.AppendRequest()]
    resp: pb.AppendResponse = stub.Append(iter(reqs), timeout=timeout)
    return resp


def http_read(broker: BrokerProcess, journal: str) -> bytes:
    with urllib.request.urlopen(broker.url(journal), timeout=DEADLINE) as resp:  # noqa: S310
        body: bytes = resp.read()
        return body


def http_read_or_none(broker: BrokerProcess, journal: str) -> bytes | None:
    try:
        return http_read(broker, journal)
    except urllib.error.HTTPError as err:
        if err.code == 416:
            return None
        raise


def stored_content(client: Any, bucket: str, journal: str) -> tuple[bytes, int]:
    """The journal's content as S3 holds it, and the number of fragments; the fragments must
    tile [0, end) without gaps."""
    fragments = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"frags/{journal}/"
    ):
        for obj in page.get("Contents", ()):
            rel = obj["Key"].removeprefix(f"frags/{journal}/")
            fragments.append((parse_content_name(journal, rel), obj["Key"]))
    fragments.sort(key=lambda x: x[0].begin)
    out = b""
    for f, key in fragments:
        assert f.begin == len(out), f"gap or overlap before {f}"
        raw = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        out += codecs.decompress(f.codec, raw)
        assert len(out) == f.end
    return out, len(fragments)


async def delegated_read(address: str, journal: str) -> tuple[bytes, list[str]]:
    """The journal read with the client library with ``do_not_proxy``: content, and the
    fragment URLs it was fetched from."""
    urls: list[str] = []
    out = bytearray()
    async with JournalClient(address) as client:
        rr = RetryReader(client, pb.ReadRequest(journal=journal, do_not_proxy=True, block=False))
        async for chunk in rr:
            url = rr.reader.fragment_url
            if url and (not urls or urls[-1] != url):
                urls.append(url)
            out += chunk
    return bytes(out), urls


def test_fragments_persist_to_s3_and_read_back(
    cluster: Cluster, s3_server: str, s3_bucket: str, stub_for: Any
) -> None:
    s3 = s3_client(s3_server)
    store = store_url(s3_server, s3_bucket)
    prefix = f"s3test-{uuid.uuid4().hex[:8]}/"
    names = {tag: prefix + tag for tag in CODECS}

    first = cluster.add_broker("local", "first")
    stub = stub_for(first)
    apply(stub, *(journal_spec(names[t], c, store) for t, c in CODECS.items()))
    wait_assigned(stub, prefix, list(names.values()), "first")

    health = stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=store),
                                      timeout=DEADLINE)
    assert (health.status, health.store_health_error) == (pb.OK, "")
    # A store no journal names is not dialled (authorization is off: anyone may ask) ...
    missing_store = store_url(s3_server, "no-such-bucket-gazette")
    with pytest.raises(grpc.RpcError) as refused:
        stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=missing_store),
                                 timeout=DEADLINE)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # ... and once a journal names it, it is checked.
    apply(stub, journal_spec(f"s3missing-{uuid.uuid4().hex[:8]}/j", pb.NONE, missing_store))

    def checked() -> pb.FragmentStoreHealthResponse | None:
        try:
            resp: pb.FragmentStoreHealthResponse = stub.FragmentStoreHealth(
                pb.FragmentStoreHealthRequest(fragment_store=missing_store), timeout=DEADLINE)
            return resp
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:  # the broker's keyspace lags
                raise
            return None

    missing = eventually_sync(checked, "the named store is checked", DEADLINE)
    assert missing.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert "NoSuchBucket" in missing.store_health_error

    written: dict[str, bytes] = {}
    for tag, name in names.items():
        lines = [b'{"n": %d, "codec": "%s", "pad": "%s"}\n' % (i, tag.encode(), b"x" * 200)
                 for i in range(20)]
        for line in lines:
            assert grpc_append(stub, name, line).status == pb.OK
        written[name] = b"".join(lines)

    # Spools rolled while appending are persisted by the running broker.
    eventually_sync(lambda: all(stored_content(s3, s3_bucket, n)[1] >= 2 for n in names.values()), "fragments persisted to S3 while the broker runs", DEADLINE)

    # Draining persists the rest: S3 then holds every byte.
    assert first.stop() == 0
    for name, data in written.items():
        content, count = stored_content(s3, s3_bucket, name)
        assert content == data and count >= 3, (name, count)
    gzod = s3.list_objects_v2(Bucket=s3_bucket, Prefix=f"frags/{names['gzod']}/")["Contents"][0]
    head = s3.head_object(Bucket=s3_bucket, Key=gzod["Key"])
    assert head.get("ContentEncoding") == "gzip"  # GZIP_OFFLOAD_DECOMPRESSION, as Gazette.
    assert not gzod["Key"].endswith((".gz", ".gzod"))

    # A new broker has no spools: it serves the journals from S3.
    second = cluster.add_broker("local", "second")
    stub = stub_for(second)
    wait_assigned(stub, prefix, list(names.values()), "second")
    for name, data in written.items():
        # Until its first listing of the store, the broker has nothing to serve (416), as Gazette.
        got = eventually_sync(functools.partial(http_read_or_none, second, name), f"{name} readable from the new broker", DEADLINE)
        assert got == data

        # The client library reads each fragment from its signed S3 URL.
        content, urls = asyncio.run(delegated_read(second.address, name))
        assert content == data
        assert urls and all(u.startswith(f"{s3_server}/{s3_bucket}/frags/") for u in urls)
        assert all("X-Amz-Signature=" in u for u in urls)

    for b in cluster.brokers:
        assert "Traceback" not in b.log_text(), b.log_text()[-4000:]


def test_append_refused_while_primary_store_unhealthy(
    cluster: Cluster, s3_server: str, stub_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fail fast: the broker retries a failing store's check every 50 ms.
    monkeypatch.setenv(RETRY_INTERVALS_ENV, "0,0.05")
    bucket = f"gazette-later-{uuid.uuid4().hex[:12]}"
    prefix = f"s3unhealthy-{uuid.uuid4().hex[:8]}/"
    name = prefix + "journal"
    broker = cluster.add_broker("local", "gate")
    stub = stub_for(broker)
    apply(stub, journal_spec(name, pb.SNAPPY, store_url(s3_server, bucket)))
    wait_assigned(stub, prefix, [name], "gate")

    # Refused after a handful of failed checks: well within the timeout.
    resp = grpc_append(stub, name, b'{"refused": true}\n', timeout=5)
    assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert "NoSuchBucket" in resp.store_health_error
    try:
        http_read(broker, name)
        raise AssertionError("the refused append was readable")
    except urllib.error.HTTPError as err:
        assert err.code == 416  # Nothing was written.

    # Once the bucket exists the store recovers and appends go through.
    create_bucket(s3_server, bucket)
    eventually_sync(lambda: grpc_append(stub, name, b'{"ok": true}\n').status == pb.OK, "append accepted once the store is healthy", DEADLINE)

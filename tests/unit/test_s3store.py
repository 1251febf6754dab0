"""S3Store against moto's S3 server on loopback: URL arguments, persist / list / open per codec,
object naming, signed URLs fetched by plain HTTP and by the client library, health checks."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from boto3.s3.transfer import TransferConfig
from hypothesis import given
from hypothesis import strategies as st
from test_filestore import ALL, make_snapshot

from gazette.client.reader import open_fragment
from gazette.fragment import Fragment, StoreAuthError, StoreError, UnsupportedStoreError, codecs
from gazette.fragment.codecs import Codec
from gazette.fragment.stores import Stores, store_for_url
from gazette.fragment.stores import s3 as s3store_mod
from gazette.fragment.stores.s3 import S3Store, parse_s3_url
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.etcd_process import free_port
from gazette.testing.s3 import s3_client

CC = pb.CompressionCodec


def store_url(endpoint: str, bucket: str, prefix: str = "prefix/", **args: str) -> str:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in
                     {"endpoint": endpoint, "region": "us-east-1", **args}.items())
    return f"s3://{bucket}/{prefix}?{query}"


@pytest.fixture
def client(s3_server: str) -> Any:
    return s3_client(s3_server)


async def read(store: S3Store, f: Fragment, offset: int | None = None) -> bytes:
    gen = store.open(f, offset)
    async with contextlib.aclosing(gen):
        return b"".join([chunk async for chunk in gen])


async def fetch(f: Fragment, offset: int, url: str) -> bytes:
    gen = open_fragment(f.to_proto(), offset, url)
    async with contextlib.aclosing(gen):  # type: ignore[type-var]
        return b"".join([chunk async for chunk in gen])


# -- URLs -------------------------------------------------------------------------------


def test_url_arguments() -> None:
    bucket, prefix, args = parse_s3_url(
        "s3://my-bucket/a/b/?Endpoint=http%3A%2F%2Fminio%3A9000&PROFILE=minio&acl=private"
        "&storageClass=STANDARD_IA&SSE=aws:kms&SSEKMSKeyId=k1&region=eu-west-1&find=x&replace=y"
    )
    assert (bucket, prefix) == ("my-bucket", "a/b/")
    assert (args.endpoint, args.profile, args.acl, args.storageclass) == (
        "http://minio:9000", "minio", "private", "STANDARD_IA",
    )  # fmt: skip
    assert (args.sse, args.ssekmskeyid, args.region, args.find, args.replace) == (
        "aws:kms", "k1", "eu-west-1", "x", "y",
    )  # fmt: skip
    assert parse_s3_url("s3://b/")[:2] == ("b", "")

    for url, match in [
        ("s3://b/p/?endpoint=x&bogus=1", "unknown argument 'bogus'"),
        ("s3://b/p/?region=a&Region=b", "'Region' .* more than once"),
        ("s3://b/p/?region=a&region=b", "more than once"),
        ("s3:///p/", "must name a bucket"),
        ("s3://b/p", "must end in '/'"),
        ("s3://b/p/#frag", "fragment"),
        ("file:///p/", "not an s3://"),
    ]:
        with pytest.raises(StoreError, match=match):
            parse_s3_url(url)
    with pytest.raises(StoreError, match="unknown argument 'storage_class'"):
        store_for_url("s3://b/p/?storage_class=GLACIER&region=us-east-1")


_KEYS = ["find", "replace", "profile", "endpoint", "ACL", "storageClass", "SSE", "SSEKMSKeyId",
         "region"]
_VALUE = st.text(st.characters(codec="utf-8"), max_size=12)


@given(
    st.dictionaries(st.sampled_from(_KEYS), _VALUE),
    st.lists(st.booleans(), min_size=20, max_size=20),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12),
)
def test_url_arguments_round_trip(args: dict[str, str], upper: list[bool], extra: str) -> None:
    """Any set of Gazette's arguments, in any letter case and encoded, parses back; an
    extra name is refused and named."""
    cased = {"".join(c.upper() if u else c for c, u in zip(k, upper, strict=False)): v
             for k, v in args.items()}
    query = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in cased.items())
    _, _, parsed = parse_s3_url(f"s3://bucket/pre/?{query}")
    for k in _KEYS:
        assert getattr(parsed, k.lower()) == args.get(k, "")
    if extra.lower() not in {k.lower() for k in _KEYS}:
        with pytest.raises(StoreError, match=f"unknown argument '{extra}'"):
            parse_s3_url(f"s3://bucket/pre/?{query}&{extra}=1")


def test_missing_region_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StoreError, match="missing AWS region"):
        S3Store("s3://bucket/prefix/?endpoint=http://127.0.0.1:1")
    assert S3Store("s3://bucket/prefix/?region=eu-west-2").region == "eu-west-2"


def test_without_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "gazette.fragment.stores.s3")
    monkeypatch.setitem(sys.modules, "boto3", None)  # An import of boto3 now fails.
    with pytest.raises(UnsupportedStoreError, match=r"gazette\[s3\]"):
        store_for_url("s3://bucket/prefix/?region=us-east-1")


# -- Persist, list, open ----------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL)
async def test_persist_list_open_round_trip(
    s3_server: str, s3_bucket: str, client: Any, codec: Codec
) -> None:
    url = store_url(s3_server, s3_bucket)
    store = Stores().get(url)
    assert isinstance(store, S3Store)
    data = os.urandom(1000) * 2500  # 2.5 MB: several read chunks.
    snap = make_snapshot("a/journal", 1000, data, codec)

    stored = await store.persist(snap, "date=2024-01-01")
    assert stored == Fragment(
        "a/journal", 1000, 1000 + len(data), hashlib.sha1(data).digest(), codec,
        url, stored.mod_time, "date=2024-01-01",
    )  # fmt: skip
    assert stored.mod_time > 0

    # Named as Gazette names it: {prefix}{journal}/{postfix}/{begin}-{end}-{sum}{ext}.
    key = f"prefix/a/journal/date=2024-01-01/{stored.content_name()}"
    assert stored.content_name() == (
        f"{1000:016x}-{1000 + len(data):016x}-{hashlib.sha1(data).hexdigest()}"
        f"{codecs.extension(codec)}"
    )
    obj = client.get_object(Bucket=s3_bucket, Key=key)
    raw = obj["Body"].read()
    assert codecs.decompress(codec, raw) == data
    expect_encoding = "gzip" if codec == CC.GZIP_OFFLOAD_DECOMPRESSION else None
    assert obj.get("ContentEncoding") == expect_encoding

    assert await store.list("a/journal") == [stored]
    assert await store.exists(stored)
    assert await read(store, stored) == data
    assert await read(store, stored, 1000 + 1_234_567) == data[1_234_567:]
    assert await read(store, stored, 1000 + len(data)) == b""
    with pytest.raises(StoreError, match="outside"):
        await read(store, stored, 999)

    # Persisting again is a no-op: the object is not rewritten.
    etag = obj["ETag"]
    assert await store.persist(snap, "date=2024-01-01") == stored
    assert client.head_object(Bucket=s3_bucket, Key=key)["ETag"] == etag

    await store.remove(stored)
    assert await store.list("a/journal") == []
    assert not await store.exists(stored)
    await store.remove(stored)  # As S3's DELETE: removing a missing object is no error.
    with pytest.raises(StoreError, match="is not in"):
        await read(store, stored)


async def test_listing_order_postfix_strays_and_rewrites(
    s3_server: str, s3_bucket: str, client: Any
) -> None:
    store = S3Store(store_url(s3_server, s3_bucket, "base/"))
    for begin, data in [(300, b"ccc"), (0, b"a" * 100), (100, b"b" * 200)]:
        await store.persist(make_snapshot("j/one", begin, data), "p=1")
    await store.persist(make_snapshot("j/other", 0, b"zz"))
    client.put_object(Bucket=s3_bucket, Key="base/j/one/README", Body=b"not a fragment")
    client.put_object(Bucket=s3_bucket, Key="base/j/one/dir/", Body=b"")
    client.put_object(Bucket=s3_bucket, Key="elsewhere/j/one/" + "0" * 16 + "-" + "0" * 15
                      + "1-" + "0" * 40 + ".raw", Body=b"x")

    listed = await store.list("j/one")
    assert [(f.begin, f.end, f.path_postfix) for f in listed] == [
        (0, 100, "p=1"), (100, 300, "p=1"), (300, 303, "p=1"),
    ]  # fmt: skip
    assert await read(store, listed[1]) == b"b" * 200
    assert await store.list("j/missing") == []

    # find/replace rewrite the journal part of the key, as Gazette's rewriter.
    rewritten = S3Store(store_url(s3_server, s3_bucket, "base/", find="j/", replace="old/"))
    f = await rewritten.persist(make_snapshot("j/one", 0, b"abc"))
    assert client.head_object(Bucket=s3_bucket, Key=f"base/old/one/{f.content_name()}")
    assert [x.begin for x in await rewritten.list("j/one")] == [0]
    assert "/base/old/one/" in (rewritten.sign_url(f, 60) or "")


async def test_put_arguments_are_applied(s3_server: str, s3_bucket: str, client: Any) -> None:
    store = S3Store(store_url(s3_server, s3_bucket, ACL="public-read",
                              storageClass="STANDARD_IA", SSE="AES256"))
    f = await store.persist(make_snapshot("a/j", 0, b"content"))
    key = f"prefix/a/j/{f.content_name()}"
    head = client.head_object(Bucket=s3_bucket, Key=key)
    assert head["StorageClass"] == "STANDARD_IA"
    assert head["ServerSideEncryption"] == "AES256"
    grants = client.get_object_acl(Bucket=s3_bucket, Key=key)["Grants"]
    assert any(g["Grantee"].get("URI", "").endswith("/AllUsers") and g["Permission"] == "READ"
               for g in grants)


async def test_multipart_upload(
    s3_server: str, s3_bucket: str, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fragment above the multi-part threshold is uploaded in parts, and is whole."""
    monkeypatch.setattr(s3store_mod, "_TRANSFER", TransferConfig(
        multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=2))
    store = S3Store(store_url(s3_server, s3_bucket))
    data = os.urandom(1 << 20) * 11
    f = await store.persist(make_snapshot("a/j", 0, data, CC.NONE))
    head = client.head_object(Bucket=s3_bucket, Key=f"prefix/a/j/{f.content_name()}")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].endswith('-3"')  # A multi-part ETag: "{md5 of md5s}-{parts}".
    assert await read(store, f, 7 << 20) == data[7 << 20 :]


async def test_errors(s3_server: str, s3_bucket: str, client: Any) -> None:
    missing = S3Store(store_url(s3_server, "no-such-bucket-gazette"))
    with pytest.raises(StoreAuthError, match="NoSuchBucket"):
        await missing.persist(make_snapshot("a/j", 0, b"data"))
    with pytest.raises(StoreAuthError):
        await missing.list("a/j")

    # A stored object shorter or longer than its fragment's span is an error.
    store = S3Store(store_url(s3_server, s3_bucket))
    f = await store.persist(make_snapshot("a/j", 0, b"0123456789"))
    key = f"prefix/a/j/{f.content_name()}"
    client.put_object(Bucket=s3_bucket, Key=key, Body=b"01234")
    with pytest.raises(StoreError, match="holds 5 bytes, expected 10"):
        await read(store, f)
    client.put_object(Bucket=s3_bucket, Key=key, Body=b"0123456789ab")
    with pytest.raises(StoreError, match="holds more than"):
        await read(store, f)


# -- Signed URLs ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL)
async def test_signed_url_fetch(s3_server: str, s3_bucket: str, codec: Codec) -> None:
    store = S3Store(store_url(s3_server, s3_bucket))
    data = b"".join(b"message %d\n" % i for i in range(50_000))
    f = await store.persist(make_snapshot("a/journal", 500, data, codec), "date=2024-01-01")

    signed = store.sign_url(f, 90)
    assert signed is not None
    parts = urlsplit(signed)
    assert f"{parts.scheme}://{parts.netloc}" == s3_server
    # Path-style, with the key quoted exactly once.
    assert parts.path == f"/{s3_bucket}/prefix/a/journal/date%3D2024-01-01/{f.content_name()}"
    query = parse_qs(parts.query)
    assert query["X-Amz-Expires"] == ["90"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert "/us-east-1/s3/aws4_request" in query["X-Amz-Credential"][0]

    # A plain HTTP client gets the stored (compressed) object.
    def get() -> bytes:
        with urllib.request.urlopen(signed, timeout=30) as resp:  # noqa: S310 - loopback
            body: bytes = resp.read()
            return body

    assert codecs.decompress(codec, await asyncio.to_thread(get)) == data

    # The client library fetches and decompresses it, from any offset.
    assert await fetch(f, 500, signed) == data
    assert await fetch(f, 500 + 123_456, signed) == data[123_456:]


# -- Health -----------------------------------------------------------------------------


async def test_health_check(s3_server: str, s3_bucket: str, client: Any) -> None:
    await S3Store(store_url(s3_server, s3_bucket, "some/prefix/")).health_check()
    obj = client.get_object(Bucket=s3_bucket, Key="some/prefix/.test/health-check")
    assert obj["Body"].read() == b"health-check\n"

    await S3Store(store_url(s3_server, s3_bucket)).check_delete("probe/")
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="prefix/probe/")
    assert listed.get("KeyCount", 0) == 0

    with pytest.raises(StoreAuthError, match="NoSuchBucket"):
        await S3Store(store_url(s3_server, "no-such-bucket-gazette")).health_check()


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    """An endpoint nothing listens on (a stopped server)."""
    yield f"http://127.0.0.1:{free_port()}"


async def test_health_check_of_unreachable_server(s3_bucket: str, dead_endpoint: str) -> None:
    store = S3Store(store_url(dead_endpoint, s3_bucket), max_attempts=1, connect_timeout=2)
    with pytest.raises(StoreError, match="Could not connect") as info:
        await store.health_check()
    assert not isinstance(info.value, StoreAuthError)

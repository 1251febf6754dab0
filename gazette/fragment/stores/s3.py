"""The ``s3://bucket/prefix/`` fragment store (Amazon S3 and S3-compatible servers), via boto3.

A fragment of journal ``j`` is the object ``{prefix}{j}/[{postfix}/]{content name}`` of the
bucket, where ``prefix`` is the URL path without its leading slash, rewritten by ``find`` and
``replace`` as for every store, exactly as Gazette names it.

URL query arguments are Gazette's (matched case-insensitively, as Gazette's decoder does):
``find``, ``replace``, ``profile`` (shared-config profile for credentials and region),
``endpoint`` (an S3-compatible server; path-style addressing is then used), ``region``,
``ACL`` (canned ACL of new objects), ``storageClass``, ``SSE`` (server-side encryption, e.g.
``AES256`` or ``aws:kms``) and ``SSEKMSKeyId``. Any other argument, or one given twice, is
refused with a :class:`StoreError` naming it.

Invariants:

* A PUT of S3 is atomic: an object is either absent or complete, so no temporary names are
  needed and listings never show partial fragments. Persisting is idempotent (HEAD first;
  names are content addressed).
* ``GZIP_OFFLOAD_DECOMPRESSION`` fragments are stored with ``Content-Encoding: gzip`` (so HTTP
  clients of a signed URL may have the content decoded for them); everything read back through
  this store is decompressed here, whatever the headers say.
* boto3 is blocking: every network call runs in a worker thread (``asyncio.to_thread``), a
  stream at most a chunk per call. The client is built on first use, normally in a worker
  thread (credential discovery may do network I/O); construction itself only parses the URL
  and settles the region, failing fast on a bad URL or a missing region.
* Signing is a local computation (no request); the signed URL is a presigned GET.
* Errors are :class:`StoreError`; a missing bucket or a refusal (403, ``AccessDenied``) is a
  :class:`StoreAuthError`, as Gazette's ``IsAuthError`` classifies them.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncGenerator, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.exceptions
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from gazette.fragment.codecs import GZIP_OFFLOAD_DECOMPRESSION, NONE
from gazette.fragment.errors import ContentNameError, StoreAuthError, StoreError
from gazette.fragment.fragment import Fragment, parse_content_name
from gazette.fragment.stores.base import (
    HEALTH_CHECK_CONTENT,
    HEALTH_CHECK_PATH,
    OPEN_CHUNK,
    Content,
    open_offset,
    persisted,
    read_stored,
)

__all__ = ["S3Store", "S3StoreArgs", "parse_s3_url"]

log = logging.getLogger(__name__)

_DELETE_PROBE_CONTENT = b"gazette-delete-probe\n"

# Gazette's argument names; the key is the lower-cased form we match on.
_ARG_NAMES = {
    "find": "find",
    "replace": "replace",
    "profile": "profile",
    "endpoint": "endpoint",
    "acl": "ACL",
    "storageclass": "storageClass",
    "sse": "SSE",
    "ssekmskeyid": "SSEKMSKeyId",
    "region": "region",
}

# Large uploads go multi-part (still atomic: the object appears when the upload completes).
# Parts of a compressed fragment are buffered in memory, so bound their size and number.
_TRANSFER = TransferConfig(
    multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4
)


class S3StoreArgs:
    """The parsed query arguments of an ``s3://`` store URL (empty string: not given)."""

    __slots__ = tuple(_ARG_NAMES)

    def __init__(self, **kwargs: str) -> None:
        for name in _ARG_NAMES:
            setattr(self, name, kwargs.get(name, ""))

    find: str
    replace: str
    profile: str
    endpoint: str
    acl: str
    storageclass: str
    sse: str
    ssekmskeyid: str
    region: str


def parse_s3_url(url: str) -> tuple[str, str, S3StoreArgs]:
    """``(bucket, prefix, args)`` of an ``s3://`` store URL; StoreError if it is not valid."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise StoreError(f"not an s3:// fragment store URL: {url!r}")
    if not parts.netloc:
        raise StoreError(f"s3:// store URL {url!r} must name a bucket")
    if not parts.path.endswith("/"):
        raise StoreError(f"s3:// store URL {url!r} path must end in '/'")
    if parts.fragment:
        raise StoreError(f"s3:// store URL {url!r} must not have a fragment")
    raw = parse_qs(parts.query, keep_blank_values=True)
    values: dict[str, str] = {}
    for key, vals in raw.items():
        name = key.lower()
        if name not in _ARG_NAMES:
            raise StoreError(
                f"unknown argument {key!r} of fragment store {url!r} (expected one of "
                f"{', '.join(_ARG_NAMES.values())})"
            )
        if name in values or len(vals) != 1:
            raise StoreError(f"argument {key!r} of fragment store {url!r} is given more than once")
        values[name] = vals[0]
    return parts.netloc, parts.path[1:], S3StoreArgs(**values)


class _ChunkStream:
    """A non-seekable file-like view of an iterator of byte chunks, for managed uploads.

    ``read(n)`` returns exactly ``n`` bytes unless the chunks run out: s3transfer takes a short
    read for the end of the stream.
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._eof = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) < n):
            nxt = next(self._chunks, None)
            if nxt is None:
                self._eof = True
            else:
                self._buf += nxt
        if n < 0 or n >= len(self._buf):
            out = bytes(self._buf)
            self._buf.clear()
        else:
            out = bytes(self._buf[:n])
            del self._buf[:n]
        return out


class S3Store:
    """An ``s3://bucket/prefix/`` fragment store (see the module docstring)."""

    def __init__(
        self,
        url: str,
        file_root: str | None = None,
        *,
        max_attempts: int = 3,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        self._url = url
        self.bucket, self.prefix, self.args = parse_s3_url(url)
        try:
            self._session = boto3.session.Session(profile_name=self.args.profile or None)
        except botocore.exceptions.BotoCoreError as err:
            raise StoreError(f"fragment store {url!r}: constructing S3 session: {err}") from err
        self.region = self.args.region or self._session.region_name or ""
        if not self.region:
            # As Gazette: an explicit endpoint does not excuse a missing region.
            raise StoreError(
                f"fragment store {url!r}: missing AWS region configuration for profile "
                f"{self.args.profile!r} (set region= or AWS_DEFAULT_REGION)"
            )
        self._config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"} if self.args.endpoint else {},
            retries={"mode": "standard", "max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        self._client_lock = threading.Lock()
        self._client_obj: Any = None

    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"S3Store({self._url!r})"

    # -- Plumbing.

    @property
    def _client(self) -> Any:
        client = self._client_obj
        if client is not None:
            return client
        with self._client_lock:
            if self._client_obj is None:
                try:
                    creds = self._session.get_credentials()
                    if creds is None:
                        raise StoreError(
                            f"fragment store {self._url!r}: no AWS credentials found for "
                            f"profile {self.args.profile!r}"
                        )
                    self._client_obj = self._session.client(
                        "s3",
                        region_name=self.region,
                        endpoint_url=self.args.endpoint or None,
                        config=self._config,
                    )
                except botocore.exceptions.BotoCoreError as err:
                    raise StoreError(f"fragment store {self._url!r}: {err}") from err
                log.info(
                    "constructed S3 client",
                    extra={
                        "store": self._url,
                        "endpoint": self.args.endpoint,
                        "profile": self.args.profile,
                        "region": self.region,
                        "keyID": creds.access_key,
                        "provider": creds.method,
                    },
                )
            return self._client_obj

    def _key(self, path: str) -> str:
        if self.args.find:
            path = path.replace(self.args.find, self.args.replace, 1)
        return self.prefix + path

    def _fragment_key(self, fragment: Fragment) -> str:
        return self._key(fragment.content_path())

    def _error(self, what: str, err: Exception) -> StoreError:
        """The StoreError (or StoreAuthError) of a failed boto3 call."""
        msg = f"{what} (s3://{self.bucket}/{self.prefix}): {err}"
        if isinstance(err, botocore.exceptions.ClientError):
            code = str(err.response.get("Error", {}).get("Code", ""))
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchBucket", "AccessDenied") or status == 403:
                return StoreAuthError(msg)
        return StoreError(msg)

    def _call(self, what: str, op: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(Bucket=self.bucket, **kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error(what, err) from err

    def _head(self, key: str) -> Any | None:
        """The HEAD response of ``key``, or None if there is no such object."""
        try:
            return self._client.head_object(Bucket=self.bucket, Key=key)
        except botocore.exceptions.ClientError as err:
            if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise self._error(f"HEAD {key}", err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise self._error(f"HEAD {key}", err) from err

    def _list_keys(self, prefix: str) -> Iterator[tuple[str, float]]:
        """``(key relative to prefix, mod time)`` of every object under ``prefix``."""
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    key: str = obj["Key"]
                    if key.endswith("/"):
                        continue  # A "directory" placeholder object.
                    yield key[len(prefix) :], obj["LastModified"].timestamp()
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error(f"LIST {prefix}", err) from err

    def _put(self, key: str, body: _ChunkStream, content_encoding: str = "") -> None:
        extra: dict[str, str] = {}
        if self.args.acl:
            extra["ACL"] = self.args.acl
        if self.args.storageclass:
            extra["StorageClass"] = self.args.storageclass
        if self.args.sse:
            extra["ServerSideEncryption"] = self.args.sse
        if self.args.ssekmskeyid:
            extra["SSEKMSKeyId"] = self.args.ssekmskeyid
        if content_encoding:
            extra["ContentEncoding"] = content_encoding
        try:
            self._client.upload_fileobj(body, self.bucket, key, ExtraArgs=extra, Config=_TRANSFER)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error(f"PUT {key}", err) from err

    # -- Listing.

    async def list(self, journal: str) -> builtins.list[Fragment]:
        return await asyncio.to_thread(self._list_sync, journal)

    def _list_sync(self, journal: str) -> builtins.list[Fragment]:
        out: builtins.list[Fragment] = []
        for rel, mtime in self._list_keys(self._key(journal + "/")):
            try:
                f = parse_content_name(journal, rel)
            except ContentNameError as err:
                log.warning("skipping stray object %r of journal %s: %s", rel, journal, err)
                continue
            out.append(persisted(f, self._url, mtime))
        out.sort(key=lambda f: (f.begin, f.end))
        return out

    async def exists(self, fragment: Fragment) -> bool:
        key = self._fragment_key(fragment)
        return await asyncio.to_thread(lambda: self._head(key) is not None)

    # -- Reading.

    async def open(
        self, fragment: Fragment, offset: int | None = None, chunk: int = OPEN_CHUNK
    ) -> AsyncGenerator[bytes, None]:
        begin = open_offset(fragment, offset)
        key = self._fragment_key(fragment)
        kwargs: dict[str, Any] = {"Key": key}
        pos = fragment.begin  # Journal offset of the next decompressed byte.
        if fragment.codec == NONE and begin > fragment.begin:
            if begin == fragment.end:
                return  # Nothing to read (a Range past the end would be refused).
            # Uncompressed content is addressable: fetch only what is asked for.
            kwargs["Range"] = f"bytes={begin - fragment.begin}-"
            pos = begin
        try:
            resp = await asyncio.to_thread(self._call, f"GET {key}", "get_object", **kwargs)
        except StoreError as err:
            cause = err.__cause__
            if isinstance(cause, botocore.exceptions.ClientError) and str(
                cause.response.get("Error", {}).get("Code")
            ) in ("NoSuchKey", "404"):
                raise StoreError(f"fragment {fragment.content_path()} is not in {self._url}") from err
            raise
        body = resp["Body"]

        def read_raw() -> bytes:
            try:
                raw: bytes = body.read(chunk)
            except (botocore.exceptions.BotoCoreError, OSError) as err:
                raise self._error(f"reading {key}", err) from err
            return raw

        try:
            async for data in read_stored(fragment, begin, pos, read_raw, chunk):
                yield data
        finally:
            body.close()

    def sign_url(self, fragment: Fragment, ttl: float) -> str | None:
        return self._sign_key(self._fragment_key(fragment), ttl)

    def _sign_key(self, key: str, ttl: float) -> str:
        try:
            url: str = self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": key},
                ExpiresIn=max(1, int(ttl)),
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error(f"signing {key}", err) from err
        return url

    # -- Writing.

    async def persist(self, content: Content, path_postfix: str = "") -> Fragment:
        return await asyncio.to_thread(self._persist_sync, content, path_postfix)

    def _persist_sync(self, content: Content, path_postfix: str) -> Fragment:
        f = content.fragment
        target = Fragment(f.journal, f.begin, f.end, f.sum, f.codec, self._url, 0, path_postfix)
        key = self._fragment_key(target)
        head = self._head(key)
        if head is None:
            encoding = "gzip" if f.codec == GZIP_OFFLOAD_DECOMPRESSION else ""
            self._put(key, _ChunkStream(content.iter_compressed()), encoding)
            head = self._head(key)
            if head is None:
                raise StoreError(f"PUT {key} to {self._url}: object is absent after upload")
        return persisted(target, self._url, head["LastModified"].timestamp())

    async def remove(self, fragment: Fragment) -> None:
        """Delete ``fragment``; as S3 (and Gazette's S3 store), a missing object is no error."""
        key = self._fragment_key(fragment)
        await asyncio.to_thread(self._call, f"DELETE {key}", "delete_object", Key=key)

    # -- Health.

    async def health_check(self) -> None:
        await asyncio.to_thread(self._health_check_sync)

    def _health_check_sync(self) -> None:
        """Gazette's check: PUT, GET and compare, LIST, sign and fetch the signed URL."""
        key = self._key(HEALTH_CHECK_PATH)
        self._put(key, _ChunkStream(iter([HEALTH_CHECK_CONTENT])))
        resp = self._call(f"GET {key}", "get_object", Key=key)
        with resp["Body"] as body:
            got = body.read()
        if got != HEALTH_CHECK_CONTENT:
            raise StoreError(f"health check of {self._url!r}: GET returned {got!r}")
        listed = {rel for rel, _ in self._list_keys(self._key(".test/"))}
        if "health-check" not in listed:
            raise StoreError(f"health check of {self._url!r}: LIST did not find the test object")
        signed = self._sign_key(key, 300)
        if signed.startswith(("http://", "https://")):
            try:
                with urllib.request.urlopen(signed, timeout=60) as r:  # noqa: S310 - signed S3 URL
                    fetched = r.read()
            except (urllib.error.URLError, OSError) as err:
                raise StoreError(f"health check of {self._url!r}: fetching signed URL: {err}") from err
            if fetched != HEALTH_CHECK_CONTENT:
                raise StoreError(
                    f"health check of {self._url!r}: signed URL returned {fetched!r}"
                )

    async def check_delete(self, prefix: str = "") -> None:
        """Gazette's delete probe: PUT an object under ``prefix`` and DELETE it."""

        def probe() -> None:
            key = self._key(prefix + ".gazette-delete-probe")
            self._put(key, _ChunkStream(iter([_DELETE_PROBE_CONTENT])))
            self._call(f"DELETE {key}", "delete_object", Key=key)

        await asyncio.to_thread(probe)

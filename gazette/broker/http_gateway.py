"""HTTP/1.1 gateway to journals, on the broker's public port (see ``mux``).

``GET /{journal}?offset=N&block=B`` reads (``HEAD`` reads metadata only) and
``PUT /{journal}`` appends the request body atomically, with Gazette's headers
and status codes:

* reads: 206 with ``X-Write-Head``, ``Content-Range: bytes {offset}-{max}/{max}``,
  ``X-Fragment-Name``, ``X-Fragment-Last-Modified``, ``X-Fragment-Location``
  (a signed URL, when the store gives one), ``X-Route-Token``; 404 unknown
  journal; 416 offset not yet available; 503 insufficient brokers; 500 other.
* appends: 204 with ``X-Commit-Begin``, ``X-Commit-End``, ``X-Commit-SHA1-Sum``,
  ``X-Write-Head``; 404 unknown journal; 500 other statuses.
* 400 for an unknown query key or a malformed value, naming it. ``offset`` is read as Go's
  ``strconv.ParseInt`` reads it (an optional sign and ASCII digits: ``1_0``, `` 5`` or ``５``
  are refused) and ``block`` as ``strconv.ParseBool``.
* 415 for an append body with a ``Content-Encoding`` other than identity (with
  ``Accept-Encoding: identity``): the gateway commits the bytes it is sent and would rather
  refuse than commit compressed ones; bodies are never decompressed. ``Transfer-Encoding``
  other than ``chunked`` (501) and request versions other than HTTP/1.0 and 1.1 (505) are
  refused before any route (``gazette.server.http``).
* HTTP/1.0 reads get the content without chunked coding, until the connection closes.
* with authorization on, ``Authorization: Bearer <token>`` granting READ (reads) or APPEND
  (appends): 401 without a valid token, 403 without the capability; a journal outside the
  token's selector is 404, as an unknown one.

A blocking read is one long-lived chunked response that streams content as it
commits, until the client goes away. A client that disconnects mid-PUT has its
append rolled back, like any broken Append stream.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from email.utils import formatdate

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from gazette import auth
from gazette.auth import Claims
from gazette.broker import append as append_mod
from gazette.broker import read as read_mod
from gazette.broker import wire
from gazette.broker.context import BrokerContext
from gazette.errors import GazetteError
from gazette.fragment import Fragment, sum_from_proto
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import validate
from gazette.protocol.errors import ValidationError
from gazette.server.edge import http_error
from gazette.server.http import CLIENT_LOG
from gazette.server.logs import clip

log = logging.getLogger(__name__)

MAX_INT64 = (1 << 63) - 1
# Go's strconv.ParseBool and ParseInt(s, 10, 64), which Gazette's gateway decodes queries with:
# exactly these spellings, and an optional sign before ASCII digits (no spaces, no "_", no
# other digits than 0-9, within int64).
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_INT64 = re.compile(r"[+-]?[0-9]+")
APPEND_CHUNK = 1 << 20


class BadRequest(GazetteError, ValueError):
    """The HTTP request's path or query is malformed."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400


class UnsupportedEncoding(GazetteError, ValueError):
    """An append body in a content coding: the gateway commits bytes as sent, so it refuses
    rather than commit compressed bytes (or expand a small body into gigabytes)."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 415


def _parse_bool(key: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadRequest(f"invalid value for query key {key!r}: {clip(value, 64)!r} (expected true or false)")


def parse_int64(key: str, value: str) -> int:
    """``value`` as Go's ``strconv.ParseInt(value, 10, 64)`` reads it, else BadRequest."""
    if _INT64.fullmatch(value) is not None:
        n = int(value)
        if -MAX_INT64 - 1 <= n <= MAX_INT64:
            return n
    raise BadRequest(f"invalid value for query key {key!r}: {clip(value, 64)!r} (expected a 64-bit integer)")


def parse_read_request(request: web.Request) -> pb.ReadRequest:
    req = pb.ReadRequest(journal=request.match_info["journal"], metadata_only=request.method == "HEAD")
    for key, value in request.query.items():
        k = key.lower()
        if k == "offset":
            req.offset = parse_int64(key, value)
        elif k == "block":
            req.block = _parse_bool(key, value)
        else:
            raise BadRequest(f"unknown query key {clip(key, 64)!r} (expected offset or block)")
    try:
        validate.validate_read_request(req)
    except ValidationError as err:
        raise BadRequest(str(err)) from None
    return req


def parse_append_request(request: web.Request) -> pb.AppendRequest:
    for key in request.query:
        raise BadRequest(f"unknown query key {clip(key, 64)!r} (appends take no query)")
    coding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if coding not in ("", "identity"):
        raise UnsupportedEncoding(
            f"Content-Encoding {clip(coding, 64)!r} is not supported: append the content itself")
    req = pb.AppendRequest(journal=request.match_info["journal"])
    try:
        validate.validate_append_request(req)
    except ValidationError as err:
        raise BadRequest(str(err)) from None
    return req


def _route_headers(headers: dict[str, str], hdr: pb.Header, path: str) -> None:
    route = hdr.route
    if len(route.members) != 0:
        headers["X-Route-Token"] = " ".join(str(route).split())
        if route.primary != -1 and len(route.endpoints) > route.primary and route.endpoints[route.primary]:
            headers["Location"] = route.endpoints[route.primary].rstrip("/") + path


_READ_STATUS = {
    pb.JOURNAL_NOT_FOUND: 404,
    pb.INSUFFICIENT_JOURNAL_BROKERS: 503,
    pb.OFFSET_NOT_YET_AVAILABLE: 416,
}


def _read_headers(resp: pb.ReadResponse, path: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    if resp.HasField("header"):
        _route_headers(headers, resp.header, path)
    if resp.HasField("fragment"):
        frag = resp.fragment
        headers["X-Fragment-Name"] = Fragment.from_proto(frag).content_name()
        if frag.mod_time:
            headers["X-Fragment-Last-Modified"] = formatdate(frag.mod_time, usegmt=True)
        if resp.fragment_url:
            headers["X-Fragment-Location"] = resp.fragment_url
        headers["Content-Range"] = f"bytes {resp.offset}-{MAX_INT64}/{MAX_INT64}"
    if resp.write_head:
        headers["X-Write-Head"] = str(resp.write_head)
    return headers


class Gateway:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/{journal:.+}", self.serve_read, allow_head=False),
            web.head("/{journal:.+}", self.serve_read),
            web.put("/{journal:.+}", self.serve_append),
        ]

    def _verify(self, request: web.Request, require: int) -> Claims:
        return self.broker.verifier.verify(request.headers.get("Authorization"), require)

    async def serve_read(self, request: web.Request) -> web.StreamResponse:
        try:
            claims = self._verify(request, auth.READ)
            req = parse_read_request(request)
        except (BadRequest, auth.AuthError) as err:
            return http_error(err)
        stream = read_mod.read(self.broker, req, claims).__aiter__()
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            return web.Response(status=500, text="broker ended the read without a response\n")
        except Exception as err:  # a failed proxy or store: answer, never crash the server
            log.warning("http gateway: read failed", extra={"journal": req.journal, "err": str(err)})
            return http_error(err)
        headers = _read_headers(first, request.path)
        if first.status != pb.OK:
            await _aclose(stream)
            name = pb.Status.Name(first.status)
            return web.Response(status=_READ_STATUS.get(first.status, 500), text=f"{name}\n", headers=headers)
        resp = web.StreamResponse(status=206, headers=headers)
        resp.content_type = "application/octet-stream"
        if request.method == "HEAD":
            await _aclose(stream)
            return resp
        if request.version >= HttpVersion11:
            resp.enable_chunked_encoding()
        # else HTTP/1.0, which has no chunked coding: the content runs until the connection
        # closes (aiohttp sends "Connection: close" for a body of unknown length).
        await resp.prepare(request)
        offset = first.offset
        try:
            async for msg in stream:
                if msg.status != pb.OK:
                    break  # e.g. OFFSET_NOT_YET_AVAILABLE once caught up, non-blocking
                if msg.content:
                    await resp.write(msg.content)
                    offset += len(msg.content)
                elif msg.offset != offset:
                    break  # an offset jump ends the response, as Gazette's gateway does
        except ConnectionError:
            pass  # the client went away: a routine end of a blocking read, nothing to log
        except Exception as err:  # the response has begun: end it, and say why in the log
            log.warning("http gateway: read failed mid-stream", extra={"journal": req.journal, "err": str(err)})
        finally:
            await _aclose(stream)
        with contextlib.suppress(ConnectionError):  # nor is a client gone before the end
            await resp.write_eof()
        return resp

    async def serve_append(self, request: web.Request) -> web.StreamResponse:
        try:
            claims = self._verify(request, auth.APPEND)
            req = parse_append_request(request)
        except UnsupportedEncoding as err:
            refusal = http_error(err)
            refusal.headers["Accept-Encoding"] = "identity"  # RFC 9110 §15.5.16
            refusal.force_close()  # its body is not read: nothing after it on this connection is
            return refusal
        except (BadRequest, auth.AuthError) as err:
            return http_error(err)

        async def chunks() -> AsyncIterator[wire.AppendChunk]:
            async for data in request.content.iter_chunked(APPEND_CHUNK):
                if data:
                    yield wire.ContentChunk(memoryview(data))
            yield pb.AppendRequest()  # commit

        try:
            resp = await append_mod.append(self.broker, req, chunks(), claims)
        except ConnectionError as err:
            # The client went away before its body was complete; append() has already rolled
            # the partial content back. Nobody is left to read an answer: note it quietly
            # rather than letting aiohttp log an error traceback for a routine disconnect.
            CLIENT_LOG.note("http gateway: client disconnected mid-append; rolled back",
                            journal=req.journal, err=str(err))
            return web.Response(status=400, text="client disconnected mid-body\n")
        except Exception as err:  # a broken stream (400), a failed proxy: answer, never crash
            if not isinstance(err, append_mod.AppendStreamError):
                log.warning("http gateway: append failed", extra={"journal": req.journal, "err": str(err)})
            return http_error(err)
        headers: dict[str, str] = {}
        _route_headers(headers, resp.header, request.path)
        if resp.HasField("commit"):
            headers["X-Commit-Begin"] = str(resp.commit.begin)
            headers["X-Commit-End"] = str(resp.commit.end)
            headers["X-Write-Head"] = str(resp.commit.end)
            headers["X-Commit-SHA1-Sum"] = sum_from_proto(resp.commit.sum).hex()
        if resp.status == pb.OK:
            return web.Response(status=204, headers=headers)
        name = pb.Status.Name(resp.status)
        return web.Response(status=404 if resp.status == pb.JOURNAL_NOT_FOUND else 500, text=f"{name}\n", headers=headers)


async def _aclose(stream: AsyncIterator[pb.ReadResponse]) -> None:
    close: Callable[[], object] | None = getattr(stream, "aclose", None)
    if close is not None:
        await close()  # type: ignore[misc]


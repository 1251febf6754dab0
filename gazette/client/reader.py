"""Reading journals: ``Reader`` (one Read RPC) and ``RetryReader`` (resuming reads).

Invariants:
- Both are async iterators of content chunks (``bytes``) in offset order; ``offset`` is
  always the journal offset of the next byte to be yielded, so a consumer that records
  ``offset`` after each chunk can resume exactly there.
- A response whose offset is beyond the requested one (content was removed, or an
  explicit offset became unavailable) moves ``offset`` forward: this is an *offset jump*,
  counted in ``jumps``, remembered in ``last_jump`` and passed to ``on_jump``. The
  resolution of offset -1 (read from the write head) is not a jump.
- ``fragment``, ``write_head`` and ``fragment_url`` describe the fragment the current
  chunks come from (the broker sends them in a metadata response before its content).
- A Reader ends (StopAsyncIteration) when the broker closes the stream cleanly, when
  ``end_offset`` is reached, or after a delegated fragment has been read to its end; it
  raises ``ReadError`` (``OffsetNotYetAvailable`` at the write head of a non-blocking
  read) or ``TransportError`` otherwise, and is then finished.
- A RetryReader ends only at ``end_offset`` or, for a non-blocking read, at the write
  head. Routing statuses and transient transport errors are retried with back-off,
  each new attempt routed by the last response header. SUSPENDED, NOT_ALLOWED, a
  journal still not found after a few attempts, and missing codecs are raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

import grpc

from gazette.client.errors import (
    ROUTING_STATUSES,
    BrokerStatusError,
    ClientError,
    CodecUnavailable,
    FragmentFetchError,
    OffsetNotYetAvailable,
    ReadError,
    ResponseValidationError,
    TransportError,
)
from gazette.client.journal_client import JournalClient, rpc_error
from gazette.errors import ValidationError
from gazette.protocol import protocol_pb2 as pb

JumpCallback = Callable[[int, int], None]
_FETCH_CHUNK = 1 << 20


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt``: brokers usually converge on a new
    assignment within a few etcd watch round trips, so start short."""
    if attempt < 0:
        return 0.0
    if attempt <= 1:
        return 0.05
    if attempt <= 3:
        return 0.1
    if attempt <= 5:
        return 1.0
    return 5.0


class Reader:
    """Content of one Read RPC (plus a delegated fragment, if the broker offers one)."""

    def __init__(self, client: JournalClient, request: pb.ReadRequest, *,
                 route: pb.Route | None = None, on_jump: JumpCallback | None = None,
                 file_root: str | None = None) -> None:
        if not request.journal:
            raise ValidationError("journal", "ReadRequest.journal is required")
        self.client = client
        self.request = pb.ReadRequest()
        self.request.CopyFrom(request)
        self.response = pb.ReadResponse()  # Last metadata response (never content).
        self.header: pb.Header | None = None
        self.endpoint = ""
        self.jumps = 0
        self.last_jump: tuple[int, int] | None = None
        self.progressed = False  # Whether any response or content arrived.
        self._on_jump = on_jump
        self._route = route
        self._file_root = file_root
        self._call: Any = None
        self._direct: AsyncIterator[bytes] | None = None
        self._done = False

    @property
    def journal(self) -> str:
        return self.request.journal

    @property
    def offset(self) -> int:
        return self.request.offset

    @property
    def fragment(self) -> pb.Fragment | None:
        return self.response.fragment if self.response.HasField("fragment") else None

    @property
    def write_head(self) -> int:
        return self.response.write_head

    @property
    def fragment_url(self) -> str:
        return self.response.fragment_url

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._done:
                raise StopAsyncIteration
            end = self.request.end_offset
            if end and self.request.offset >= end:
                await self.aclose()
                raise StopAsyncIteration
            if self._direct is not None:
                return await self._next_direct()
            if self._call is None:
                self._start()
            chunk = await self._next_response()
            if chunk is not None:
                return chunk

    async def aclose(self) -> None:
        self._done = True
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        direct, self._direct = self._direct, None
        if direct is not None:
            await direct.aclose()  # type: ignore[attr-defined]

    def _start(self) -> None:
        self.endpoint = self.client.endpoint_for(self.journal, False, self._route)
        self._call = self.client.stub(self.endpoint).Read(self.request)

    async def _next_response(self) -> bytes | None:
        try:
            resp = await self._call.read()
        except grpc.aio.AioRpcError as err:
            self._call = None
            self._done = True
            self.client.note_failure(self.journal, self.endpoint)
            raise rpc_error(err, self.endpoint, self.journal) from None

        if resp is grpc.aio.EOF:
            self._call = None
            if (self.response.fragment_url and not self.request.metadata_only
                    and self.response.HasField("fragment")):
                self._direct = open_fragment(self.response.fragment, self.request.offset,
                                             self.response.fragment_url, self._file_root)
                return None
            self._done = True
            raise StopAsyncIteration

        self.progressed = True
        if resp.HasField("header"):
            self.header = resp.header
            self.client.update_route(self.journal, resp.header.route)

        # A resolved offset beyond the requested one applies whatever the status: the
        # write head of OFFSET_NOT_YET_AVAILABLE is where a later read should resume.
        if resp.offset > self.request.offset:
            self._jump(resp.offset)

        if resp.status != pb.OK:
            self.response = resp
            await self.aclose()
            if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                raise OffsetNotYetAvailable(self.journal, resp.offset)
            raise ReadError(resp.status, self.journal)

        if resp.offset < self.request.offset:
            await self.aclose()
            raise ResponseValidationError(f"invalid ReadResponse offset ({resp.offset}; expected >= "
                                  f"{self.request.offset}) reading {self.journal!r}")

        content = resp.content
        if not content:
            self.response = resp  # Metadata of the fragment whose content follows.
            return None
        if resp.HasField("fragment"):
            await self.aclose()
            raise ResponseValidationError(f"ReadResponse of {self.journal!r} has both content "
                                  "and fragment")
        return self._advance(content)

    async def _next_direct(self) -> bytes:
        assert self._direct is not None
        try:
            chunk = await self._direct.__anext__()
        except StopAsyncIteration:
            self._direct = None
            self._done = True
            raise
        except BaseException:
            self._direct = None
            self._done = True
            raise
        return self._advance(chunk)

    def _advance(self, content: bytes) -> bytes:
        end = self.request.end_offset
        if end and self.request.offset + len(content) > end:
            content = content[:end - self.request.offset]
        self.request.offset += len(content)
        return content

    def _jump(self, to: int) -> None:
        was = self.request.offset
        self.request.offset = to
        if was < 0:
            return  # Offset -1 resolved to the write head: not a loss of content.
        self.jumps += 1
        self.last_jump = (was, to)
        if self._on_jump is not None:
            self._on_jump(was, to)


class RetryReader:
    """A Reader that resumes at its offset after transient failures."""

    def __init__(self, client: JournalClient, request: pb.ReadRequest, *,
                 on_jump: JumpCallback | None = None, file_root: str | None = None,
                 backoff: Callable[[int], float] = backoff,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 on_retry: Callable[[ClientError, int], None] | None = None) -> None:
        self.client = client
        self.jumps = 0
        self.last_jump: tuple[int, int] | None = None
        self.reached_head = False  # A non-blocking read ended at the write head.
        self._on_jump = on_jump
        self._on_retry = on_retry
        self._file_root = file_root
        self._backoff = backoff
        self._sleep = sleep
        self._closed = False
        self.reader = self._new_reader(request, None)

    @property
    def journal(self) -> str:
        return self.reader.journal

    @property
    def offset(self) -> int:
        return self.reader.offset

    @property
    def request(self) -> pb.ReadRequest:
        return self.reader.request

    @property
    def response(self) -> pb.ReadResponse:
        return self.reader.response

    @property
    def fragment(self) -> pb.Fragment | None:
        return self.reader.fragment

    @property
    def write_head(self) -> int:
        return self.reader.write_head

    def __aiter__(self) -> RetryReader:
        return self

    async def __anext__(self) -> bytes:
        attempt = 0
        while True:
            if self._closed:
                raise StopAsyncIteration
            reader = self.reader
            try:
                return await reader.__anext__()
            except StopAsyncIteration:
                end = reader.request.end_offset
                if end and reader.offset >= end:
                    self._closed = True
                    raise
                # The broker closed the stream (or a delegated fragment ended): resume at
                # once if it made progress, else back off as for an error.
                if reader.progressed:
                    attempt = -1
            except OffsetNotYetAvailable:
                if not reader.request.block:
                    self.reached_head = True
                    self._closed = True
                    raise StopAsyncIteration from None
            except BrokerStatusError as err:
                if err.status == pb.JOURNAL_NOT_FOUND:
                    # Etcd revisions propagate to brokers with some delay, so a journal
                    # created just now may not be known everywhere yet.
                    if reader.request.HasField("header") or attempt > 3:
                        raise
                elif err.status not in ROUTING_STATUSES:
                    raise
                self._notify(err, attempt)
            except TransportError as err:
                if not err.transient:
                    raise
                self._notify(err, attempt)
            except CodecUnavailable:
                raise
            except FragmentFetchError as err:
                self._notify(err, attempt)

            route = reader.header.route if reader.header is not None else None
            if route is not None and reader.endpoint != self.client.address and \
                    self.client.routes.route(reader.journal) is None:
                route = None  # The route failed at transport level: use the default.
            self.reader = self._new_reader(reader.request, route)
            delay = self._backoff(attempt)
            if delay > 0:
                await self._sleep(delay)
            attempt += 1

    async def seek(self, offset: int) -> None:
        """Continue reading at ``offset`` (a new Read RPC)."""
        req = pb.ReadRequest()
        req.CopyFrom(self.reader.request)
        req.offset = offset
        await self.reader.aclose()
        self._closed = False
        self.reached_head = False
        self.reader = self._new_reader(req, None)

    async def aclose(self) -> None:
        self._closed = True
        await self.reader.aclose()

    def _new_reader(self, request: pb.ReadRequest, route: pb.Route | None) -> Reader:
        return Reader(self.client, request, route=route, on_jump=self._jumped,
                      file_root=self._file_root)

    def _jumped(self, was: int, to: int) -> None:
        self.jumps += 1
        self.last_jump = (was, to)
        if self._on_jump is not None:
            self._on_jump(was, to)

    def _notify(self, err: ClientError, attempt: int) -> None:
        if self._on_retry is not None:
            self._on_retry(err, attempt)


# --- delegated fragment reads ---------------------------------------------------------

class _Decompressor(Protocol):
    def decompress(self, data: bytes) -> bytes: ...
    def finish(self) -> bytes: ...


class _Identity:
    def decompress(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


def decompressor(codec: int) -> _Decompressor:
    """Streaming decompressor of fragment content fetched with ``codec``.

    GZIP_OFFLOAD_DECOMPRESSION content arrives decoded by the store (``_fetch`` switches
    to GZIP when a store ignores the request to decode); the others come from
    gazette.fragment.codecs."""
    if codec in (pb.NONE, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _Identity()
    name = pb.CompressionCodec.Name(codec)  # type: ignore[arg-type]
    try:
        from gazette.fragment import codecs
        from gazette.fragment.errors import CodecError
    except ImportError:
        raise CodecUnavailable(
            f"cannot read a {name} fragment directly: its decompressor comes from "
            "gazette.fragment.codecs, which is not available") from None
    try:
        return _Checked(codecs.new_decompressor(cast(Any, codec)), CodecError)
    except CodecError as err:
        raise CodecUnavailable(f"no decompressor for {name} fragments: {err}") from None


class _Checked:
    """Reports a codec's complaint about corrupt or truncated content as a fetch error."""

    def __init__(self, inner: _Decompressor, error: type[Exception]) -> None:
        self._inner = inner
        self._error = error

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._inner.decompress(data)
        except self._error as err:
            raise FragmentFetchError(f"corrupt fragment content: {err}") from None

    def finish(self) -> bytes:
        try:
            return self._inner.finish()
        except self._error as err:
            raise FragmentFetchError(f"truncated fragment content: {err}") from None


async def open_fragment(fragment: pb.Fragment, offset: int, url: str,
                        file_root: str | None = None) -> AsyncIterator[bytes]:
    """Decompressed content of ``fragment`` fetched from ``url``, from ``offset`` on.

    ``file://`` URLs are read from the local file system, below ``file_root`` if given
    (a store shared with brokers, e.g. a NAS mount). The content must end exactly at
    ``fragment.end``."""
    if offset < fragment.begin or offset > fragment.end:
        raise FragmentFetchError(f"offset {offset} is outside fragment "
                                 f"[{fragment.begin}, {fragment.end}) of {url!r}")
    decoder: _Decompressor | None = None
    position = fragment.begin  # Journal offset of the next decoded byte.

    def take(data: bytes) -> bytes:
        # Decoded bytes before ``offset`` are skipped; none may pass fragment.end.
        nonlocal position
        begin = position
        position += len(data)
        if position > fragment.end:
            raise FragmentFetchError(f"fragment {url!r} is longer than its span "
                                     f"[{fragment.begin}, {fragment.end})")
        return data[offset - begin:] if begin < offset else data

    async for raw, effective in _fetch(url, file_root, fragment.compression_codec):
        if decoder is None:
            decoder = decompressor(effective)
        data = take(decoder.decompress(raw))
        if data:
            yield data
    if decoder is not None:
        data = take(decoder.finish())
        if data:
            yield data
    if position != fragment.end:
        raise FragmentFetchError(f"fragment {url!r} ended at offset {position}, "
                                 f"expected {fragment.end}")


async def _fetch(url: str, file_root: str | None,
                 codec: int) -> AsyncIterator[tuple[bytes, int]]:
    """Raw bytes of ``url`` with the codec to decode them by."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        path = unquote(parts.path)
        full = Path(file_root, path.lstrip("/")) if file_root else Path(path)
        try:
            f = await asyncio.to_thread(open, full, "rb")
        except OSError as err:
            raise FragmentFetchError(f"cannot open fragment {url!r}: {err}") from None
        try:
            while True:
                block = await asyncio.to_thread(f.read, _FETCH_CHUNK)
                if not block:
                    return
                yield block, codec
        finally:
            f.close()
        return
    if parts.scheme not in ("http", "https"):
        raise FragmentFetchError(f"unsupported fragment URL scheme in {url!r}")

    import aiohttp
    import yarl

    headers = {}
    if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
        headers["Accept-Encoding"] = "identity"
    elif codec == pb.GZIP:
        headers["Accept-Encoding"] = "gzip"
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            # encoded=True: send the URL byte for byte. A presigned URL is signed over its
            # exact path and query; re-quoting them (e.g. %3D to = in "date=..." postfixes)
            # breaks the signature.
            async with session.get(yarl.URL(url, encoded=True), headers=headers) as resp:
                if resp.status != 200:
                    raise FragmentFetchError(f"!OK fetching ({resp.status} {resp.reason}, {url!r})")
                effective = codec
                # Some stores ignore Accept-Encoding: identity and send gzip anyway.
                if codec == pb.GZIP_OFFLOAD_DECOMPRESSION and \
                        resp.headers.get("Content-Encoding") == "gzip":
                    effective = pb.GZIP
                async for block in resp.content.iter_chunked(_FETCH_CHUNK):
                    yield block, effective
    except aiohttp.ClientError as err:
        raise FragmentFetchError(f"fetching fragment {url!r}: {err}") from None


async def write_head(client: JournalClient, journal: str) -> int:
    """The journal's current write head (a metadata-only, non-blocking read at the head)."""
    reader = Reader(client, pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True))
    try:
        async for _ in reader:
            break
    except OffsetNotYetAvailable:
        pass
    finally:
        await reader.aclose()
    return reader.write_head

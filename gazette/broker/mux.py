"""One public port for gRPC and the HTTP/1.1 gateway.

grpcio owns its listeners and cannot share one with aiohttp, so the broker's
public port is an asyncio server that looks at the first bytes of each
connection:

* the HTTP/2 client preface (``PRI * HTTP/2.0``) means gRPC: the connection is
  spliced, protocol to protocol with no per-byte work, to grpcio listening on a
  private Unix socket;
* anything else is HTTP/1.x and the transport is handed, with the bytes already
  read, to aiohttp's protocol in this process (no copy, no second hop).

Invariants: bytes are forwarded in order and unchanged; each side's write
buffer applies back-pressure by pausing the other side's reads; closing either
side closes both. Clients that can (brokers among themselves, local clients)
may dial grpcio's socket directly and skip the splice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SNIFF_LEN = 4  # b"PRI " is never the start of an HTTP/1.x request line method we serve


class _Splice(asyncio.Protocol):
    """One direction-pair of a spliced connection: forwards whatever it reads to ``peer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Splice | None = None
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)

    def eof_received(self) -> bool | None:
        if self.peer is not None and self.peer.transport is not None and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        return True  # keep the transport half-open until the peer closes too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self.peer is not None and self.peer.transport is not None and not self.peer._closed:
            self.peer.transport.close()

    # Back-pressure: when our write buffer is full, stop reading from the peer.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Sniffer(asyncio.Protocol):
    """Buffers the first bytes of a connection, then hands it to gRPC or HTTP."""

    def __init__(self, mux: Multiplexer) -> None:
        self._mux = mux
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._decided = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._decided:  # gRPC splice still connecting: hold the bytes
            self._buf += data
            return
        self._buf += data
        if len(self._buf) < _SNIFF_LEN and H2_PREFACE.startswith(bytes(self._buf)):
            return
        self._decided = True
        assert self._transport is not None
        if bytes(self._buf[:_SNIFF_LEN]) == H2_PREFACE[:_SNIFF_LEN]:
            self._transport.pause_reading()
            task = asyncio.ensure_future(self._splice_grpc())
            self._mux._track(task)
        else:
            self._hand_to_http()

    def _hand_to_http(self) -> None:
        assert self._transport is not None
        proto: Any = self._mux.http_protocol_factory()
        self._transport.set_protocol(proto)
        proto.connection_made(self._transport)
        data, self._buf = bytes(self._buf), bytearray()
        proto.data_received(data)

    async def _splice_grpc(self) -> None:
        assert self._transport is not None
        client = self._transport
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_unix_connection(_Splice, self._mux.grpc_socket)
        except OSError as err:
            log.warning("gRPC splice: cannot reach grpc socket: %s", err)
            client.close()
            return
        down = _Splice()
        down.connection_made(client)
        down.peer, upstream.peer = upstream, down
        client.set_protocol(down)
        if client.is_closing():
            assert upstream.transport is not None
            upstream.transport.close()
            return
        assert upstream.transport is not None
        data, self._buf = bytes(self._buf), bytearray()
        upstream.transport.write(data)
        client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._buf = bytearray()


class Multiplexer:
    """Serves ``host:port``, dispatching each connection to gRPC or HTTP/1.1."""

    def __init__(self, grpc_socket: str, http_protocol_factory: Callable[[], asyncio.Protocol]) -> None:
        self.grpc_socket = grpc_socket
        self.http_protocol_factory = http_protocol_factory
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    def _track(self, task: asyncio.Future[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Sniffer(self), host, port, reuse_address=True)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._tasks):
            t.cancel()

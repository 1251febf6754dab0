"""A lean gRPC transport: HTTP/2 and gRPC framing in asyncio, for the broker's hot paths.

grpcio's Python layer costs about a millisecond of CPU per RPC and ~185 µs per streamed
message on this class of machine, which caps appends and replication far below what the
network and disks allow. This package speaks the same wire protocol (HTTP/2, gRPC
length-prefixed messages, ``grpc-status`` trailers), so Gazette's Go clients and grpcio
clients talk to our server and our channel talks to any gRPC server, while a unary call
costs tens of microseconds. It hosts servicers written for ``grpc.aio`` unchanged
(:class:`~gazette.rpc.server.RpcServer`) and offers a channel with grpc.aio's calling
conventions (:class:`~gazette.rpc.channel.Channel`) for generated stubs.

Modules: ``frames`` (pure codecs), ``connection`` (one HTTP/2 connection: settings, flow
control, pings), ``hpack_decoder``, ``server``, ``channel``, ``tls`` (server and client TLS
contexts: the server runs on the multiplexer's TLS transport, the channel dials with the
client context) and ``seam`` (the typed boundary to generated stubs). Not supported: message
compression, server push.
"""

import os


def use_grpcio() -> bool:
    """Whether grpcio serves and dials instead (``GAZETTE_RPC=grpcio``): a fallback, and the
    reference the interoperability tests compare against."""
    return os.environ.get("GAZETTE_RPC", "") == "grpcio"

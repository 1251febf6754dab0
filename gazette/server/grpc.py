"""Building a process's gRPC server and registering any generated servicer on it.

By default gRPC is served by :class:`gazette.rpc.server.RpcServer` on the process's one public
port (the mux hands it HTTP/2 connections); with ``GAZETTE_RPC=grpcio``, by grpcio on a private
Unix socket that the mux splices connections to. Either way services are registered the same
way, as the generated ``add_*Servicer_to_server`` would, by :func:`add_service`.

Invariants:

* ``add_service`` registers every method of a service descriptor, with the servicer's method
  of the same name, the request deserializer given for it (e.g. raw bytes or zero-copy views
  for hot streams) or the message's ``FromString``, and the response's ``SerializeToString``
  (a handler may also answer with the response already serialized, as ``bytes``: List builds
  its pages from the keyspace's raw specs).
* Server options match the peers': unlimited message sizes (flow control bounds memory), and
  client keepalive pings every 4 s or more are permitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from gazette.rpc import use_grpcio
from gazette.rpc.server import MAX_BUFFERED, RpcServer
from gazette.server.limits import ServerLimits

__all__ = ["CHANNEL_OPTIONS", "SERVER_OPTIONS", "GrpcServer", "add_service", "build_server"]

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
SERVER_OPTIONS = CHANNEL_OPTIONS + [
    ("grpc.http2.min_ping_interval_without_data_ms", 4000), ("grpc.http2.max_ping_strikes", 0),
]

GrpcServer: TypeAlias = "RpcServer | grpc.aio.Server"
"""A process's gRPC server: ours, or grpcio's (the fallback)."""


def build_server(unix_socket: str, limits: ServerLimits | None = None) -> GrpcServer:
    """Our RpcServer under ``limits`` (the ``--server.*`` budget), or (``GAZETTE_RPC=grpcio``)
    grpcio's listening on ``unix_socket`` (which has its own limits)."""
    if use_grpcio():
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_insecure_port(f"unix:{unix_socket}")
        return server
    limits = limits or ServerLimits()
    return RpcServer(max_buffered=MAX_BUFFERED if limits.max_buffered is None else limits.max_buffered,
                     connection_window=limits.connection_window, connection_buffer=limits.connection_buffer,
                     max_unread=limits.max_unread)


def add_service(server: GrpcServer, service: ServiceDescriptor, servicer: Any,
                deserializers: Mapping[str, Callable[[bytes], Any] | None] | None = None,
                methods: Mapping[str, Callable[..., Any]] | None = None) -> None:
    """Registers ``servicer`` for every method of ``service`` (see the module docstring);
    ``deserializers`` overrides a method's request decoding (None: the raw bytes), ``methods``
    the callable serving a method (in place of the servicer's own)."""
    overrides = dict(deserializers or {})
    served = dict(methods or {})
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for m in service.methods:
        req_cls = message_factory.GetMessageClass(m.input_type)
        resp_cls = message_factory.GetMessageClass(m.output_type)
        deserializer = overrides[m.name] if m.name in overrides else req_cls.FromString
        kind = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(m.client_streaming, m.server_streaming)]
        fn = served[m.name] if m.name in served else getattr(servicer, m.name)
        handlers[m.name] = kind(fn, request_deserializer=deserializer,
                                response_serializer=_serializer(resp_cls))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _serializer(resp_cls: Any) -> Callable[[Any], bytes]:
    serialize: Callable[[Any], bytes] = resp_cls.SerializeToString

    def serializer(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)

    return serializer

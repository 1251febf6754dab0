"""The one edge where errors become statuses, for every gRPC service and HTTP route.

Handlers raise typed errors (``gazette.errors.GazetteError`` subclasses, each naming its
``grpc_code`` and ``http_status``) and never map exceptions themselves. ``grpc_edge`` wraps a
servicer method (unary or streaming response) and ``http_error`` renders an error for the
HTTP gateway.

Invariants:

* A ``GazetteError`` ends the RPC with ``context.abort(err.grpc_code, str(err))``.
* A failed proxied call (``grpc.aio.AioRpcError``) passes its code and details on unchanged,
  so a client sees the status the owning server gave.
* gRPC's own abort (``grpc.aio.AbortError``, raised by ``context.abort``) and cancellation
  (``asyncio.CancelledError``, a ``BaseException``) pass through untouched: the edge never
  swallows a cancellation or re-maps an abort.
* Client-caused and transient endings log one clipped INFO line each, rate-limited
  process-wide (``gazette.server.logs.ClientLog``).
* Any other exception is a bug: it is logged with its traceback under a short incident id,
  and the RPC ends with ``UNKNOWN`` (the gateway with 500) saying only "internal error" and
  that id: no traceback, path or internal state reaches a client, whichever transport serves
  it (grpcio would otherwise send the exception's text). No request crashes a server.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
from aiohttp import web

from gazette.errors import GazetteError, incident
from gazette.server.logs import ClientLog

__all__ = ["end_rpc", "grpc_edge", "grpc_edge_bound", "grpc_status", "http_error"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def grpc_status(err: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The (code, details) an RPC failing with ``err`` ends with, or None to let it propagate."""
    if isinstance(err, grpc.aio.AbortError):
        return None
    if isinstance(err, GazetteError):
        return getattr(grpc.StatusCode, err.grpc_code), str(err)
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code(), err.details() or ""
    return None


_ENDINGS = ClientLog(log)


def _note(name: str, err: BaseException, code: grpc.StatusCode) -> None:
    # Client-caused and transient endings are routine: info, not warning, rate-limited and
    # clipped, so a misbehaving client can neither flood the log nor write its requests to it.
    _ENDINGS.note("rpc ended", rpc=name, code=code.name, err=str(err))


async def end_rpc(name: str, context: Any, err: Exception) -> None:
    """Ends the RPC ``name`` for ``err`` (``context.abort`` raises); an abort passes through.
    What ``grpc_edge`` does with a servicer's error, for a servicer that catches its own (a
    compiled one: ``broker/append.py``'s ``serve_append``)."""
    if isinstance(err, grpc.aio.AbortError):
        raise err
    status = grpc_status(err)
    if status is None:
        await context.abort(grpc.StatusCode.UNKNOWN, incident(log, name, err))
        return
    _note(name, err, status[0])
    await context.abort(*status)


def grpc_edge(method: F) -> F:
    """Wraps a grpc.aio servicer method (``async def`` or async generator) with the edge."""
    name = method.__name__
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for resp in method(self, request, context):
                    yield resp
            except Exception as err:
                await end_rpc(name, context, err)
        return cast(F, stream)

    call = cast(Callable[..., Awaitable[Any]], method)  # once: a subscripted Callable is built per evaluation

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await call(self, request, context)
        except Exception as err:
            await end_rpc(name, context, err)
            raise  # not reached: _end raises
    return cast(F, unary)


def grpc_edge_bound(method: Callable[..., Any]) -> Callable[..., Any]:
    """``grpc_edge`` for a bound servicer method ``(request, context)``: how an application's
    own service, registered through the consumer, gets the framework's error mapping."""
    name = getattr(method, "__name__", "rpc")
    if inspect.isasyncgenfunction(method):
        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for resp in method(request, context):
                    yield resp
            except Exception as err:
                await end_rpc(name, context, err)
        return stream

    async def unary(request: Any, context: Any) -> Any:
        try:
            return await method(request, context)
        except Exception as err:
            await end_rpc(name, context, err)
            raise  # not reached: _end raises
    return unary


def http_error(err: BaseException) -> web.Response:
    """The gateway's answer for ``err``: the error's ``http_status`` with a one-line text.

    A client error (4xx) says just what was wrong; a server-side failure says what kind of
    failure it was (a proxied call's gRPC code, else the error's type); a bug says only
    "internal error" and the incident id it is logged under.
    """
    if isinstance(err, GazetteError):
        status = err.http_status
        text = str(err) if status < 500 else f"{type(err).__name__}: {err}"
    elif isinstance(err, grpc.aio.AioRpcError):
        status, text = 500, f"{err.code().name}: {err.details()}"
    else:
        status, text = 500, incident(log, "http", err)
    return web.Response(status=status, text=f"{text}\n")

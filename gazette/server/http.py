"""The HTTP side of a process's public port: an aiohttp app with the operability routes.

``/debug/metrics`` serves the process's Prometheus registry in the text exposition format;
``/debug/ready`` answers 200 once the process has announced itself and serves its assignments
(the ``ready`` event, and the process's ``not_serving`` check finds nothing pending), 503
with the reason before that and while draining. Brokers add their gateway, consumers
their applications' routes.

Connections are served by :class:`GuardedHandler` (``http_protocol_factory``): aiohttp's
handler with a request-head timeout (``HTTP_HEAD_TIMEOUT``, 10 s: Go's ReadHeaderTimeout as
commonly set), an idle keep-alive bound (``HTTP_IDLE_TIMEOUT``), refusals of request versions
and transfer codings we do not implement (505, 501), bounded logs, and shedding ranks for the
multiplexer.

Invariants: the app accepts bodies of any size (``client_max_size=0``: the gateway streams
appends); the runner neither installs signal handlers (the process owns them) nor logs access;
a client's malformed request logs at most one bounded line per connection, no traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestPayloadError, _ErrInfo
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gazette.server.logs import ClientLog

__all__ = ["CLIENT_LOG", "GuardedHandler", "debug_routes", "http_protocol_factory", "start_app"]


def debug_routes(ready: asyncio.Event,
                 not_serving: Callable[[], str] = lambda: "") -> list[web.RouteDef]:
    """``/debug/metrics`` and ``/debug/ready`` (``ready`` set and ``not_serving()`` empty; else
    503 with the reason)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def is_ready(_: web.Request) -> web.Response:
        if not ready.is_set():
            return web.Response(status=503, text="not ready\n")
        reason = not_serving()
        if reason:
            return web.Response(status=503, text=f"not ready: {reason}\n")
        return web.Response(text="ready\n")

    return [web.get("/debug/metrics", metrics), web.get("/debug/ready", is_ready)]


HTTP_IDLE_TIMEOUT = 30.0  # above aiohttp clients' own 15 s, so they close first
HTTP_HEAD_TIMEOUT = 10.0  # a request head must be whole this long after its first byte (Go's ReadHeaderTimeout)

# Shedding ranks (``shed_rank()``): lower ranks are shed first, None is never shed.
RANK_SILENT = 0      # a connection that said nothing yet (the multiplexer's sniffer)
RANK_IDLE = 1        # HTTP/1.1 keep-alive, waiting for its next request
RANK_SLOW_HEAD = 2   # part of a request head, the rest not yet come
RANK_IDLE_H2 = 3     # an HTTP/2 connection with no open stream

log = logging.getLogger(__name__)
CLIENT_LOG = ClientLog(log)
"""Lines about HTTP/1.1 clients' misbehaviour, shared by every connection of the process."""

# What an HTTP/1.x client may do wrong: logged as one bounded line, never a traceback.
_CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    HttpProcessingError, RequestPayloadError, ConnectionError, asyncio.TimeoutError)
_VERSIONS = frozenset({HttpVersion10, HttpVersion11})


class GuardedHandler(web.RequestHandler):
    """aiohttp's HTTP/1.x connection handler, with what a public port needs besides:

    * A request head (the first one from the hand-off, later ones from their first byte) must
      be whole within ``head_timeout`` seconds, or the connection is closed.
    * A request line of another version than 1.0 or 1.1 is answered 505, a ``Transfer-Encoding``
      other than plain ``chunked`` 501 (RFC 9112 §6.1: a coding we do not implement), and the
      connection closed; the request never reaches a route.
    * Client errors (malformed requests, bodies, resets, timeouts) log one bounded line per
      connection through ``CLIENT_LOG``; anything else is a bug and keeps its traceback.
    * ``shed_rank()``/``shed()`` let the multiplexer close it when descriptors run short:
      idle ones first, then those holding half a head; one serving a request never.
    """

    __slots__ = ("head_timeout", "born", "_head_timer", "_last_payload", "_noted")

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop,
                 head_timeout: float = HTTP_HEAD_TIMEOUT, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self.head_timeout = head_timeout
        self.born = loop.time()
        self._head_timer: asyncio.TimerHandle | None = None
        self._last_payload: Any = None
        self._noted = False

    # -- request heads -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_head_timer()  # the first head is due from the hand-off

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and not self._in_body() and not self._request_in_progress:
            self._start_head_timer()
        before = self._request_count
        super().data_received(data)
        parsed = self._request_count - before
        if parsed:
            self._cancel_head_timer()
            self._check(parsed)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _in_body(self) -> bool:
        payload = self._last_payload
        return payload is not None and not payload.is_eof()

    def _start_head_timer(self) -> None:
        if self.head_timeout > 0 and not self._force_close:
            self._head_timer = self._loop.call_later(self.head_timeout, self._head_expired)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if not self._request_in_progress and not self._messages:
            self.note("request head not complete in time", timeout_s=self.head_timeout)
            self.force_close()

    def _check(self, parsed: int) -> None:
        """Refuses what the parser let through but we do not serve, in the last ``parsed``
        queued messages (a route never sees them; the connection closes after the answer)."""
        msgs = self._messages
        for i in range(len(msgs) - min(parsed, len(msgs)), len(msgs)):
            msg, payload = msgs[i]
            self._last_payload = payload
            if not isinstance(msg, RawRequestMessage):
                continue
            status, why = 0, ""
            if msg.version not in _VERSIONS:
                status, why = 505, f"HTTP version {msg.version.major}.{msg.version.minor} is not supported"
            else:
                codings = [c.strip().lower() for v in msg.headers.getall(hdrs.TRANSFER_ENCODING, ())
                           for c in v.split(",")]
                if codings and codings != ["chunked"]:
                    status, why = 501, f"Transfer-Encoding {', '.join(codings)!r} is not implemented (only chunked)"
            if status:
                exc = HttpProcessingError(code=status, message=why)
                msgs[i] = (_ErrInfo(status=status, exc=exc, message=why + "\n"), EMPTY_PAYLOAD)
                self._last_payload = None
                self.close()  # nothing after it is read: its body is not ours to parse

    # -- logs --------------------------------------------------------------------------------

    def note(self, what: str, **fields: object) -> None:
        """One bounded line about this connection's client, the first time only."""
        if not self._noted:
            self._noted = True
            CLIENT_LOG.note(f"http: {what}", peer=self._peer(), **fields)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, _CLIENT_ERRORS):
            self.note(str(args[0]).split(" from ")[0], err=_short(exc))
            return
        super().log_exception(*args, **kw)  # ours: with its traceback

    def log_debug(self, *args: Any, **kw: Any) -> None:
        kw.pop("exc_info", None)  # a debug line never carries a traceback either
        super().log_debug(*args, **kw)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, _CLIENT_ERRORS):
            # aiohttp's own line for a first bad method is a debug traceback; ours is the note.
            self.note(f"bad request ({status})", err=_short(exc))
            if request.writer.output_size > 0:  # as aiohttp: the answer began, the connection is broken
                raise ConnectionError("response already begun; cannot send an error answer")
            resp = web.Response(status=status, text=message or f"{status}\n")
            resp.force_close()
            return resp
        return super().handle_error(request, status, exc, message)

    # -- shedding ----------------------------------------------------------------------------

    def shed_rank(self) -> int | None:
        if self._request_in_progress or self._messages or self._in_body() or self._force_close:
            return None
        return RANK_SLOW_HEAD if self._head_timer is not None else RANK_IDLE

    def shed(self) -> None:
        self._noted = True  # the multiplexer counts sheds in a line of its own
        self.force_close()


def _short(exc: BaseException) -> str:
    """An exception's one-line gist: aiohttp's parser errors span lines and quote the request."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"


def http_protocol_factory(runner: web.AppRunner, *, head_timeout: float | None = None,
                          idle_timeout: float | None = None) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of ``runner``'s app for the multiplexer: ``GuardedHandler``s.

    Bodies reach routes as sent (``auto_decompress`` off): a route decides what a
    ``Content-Encoding`` means (the gateway refuses any but identity), and a small compressed
    body cannot expand into gigabytes before a route looks at it. Nothing is access-logged.
    """
    server = runner.server
    assert server is not None, "runner is not set up"
    loop = asyncio.get_running_loop()
    head_timeout = HTTP_HEAD_TIMEOUT if head_timeout is None else head_timeout
    idle_timeout = HTTP_IDLE_TIMEOUT if idle_timeout is None else idle_timeout

    def factory() -> asyncio.Protocol:
        return GuardedHandler(server, loop=loop, head_timeout=head_timeout, keepalive_timeout=idle_timeout,
                              access_log=None, auto_decompress=False)
    return factory


async def start_app(routes: Iterable[web.RouteDef]) -> web.AppRunner:
    """A set-up runner of an app serving ``routes`` (the multiplexer feeds its connections,
    made by ``http_protocol_factory``)."""
    app = web.Application(client_max_size=0)
    app.add_routes(list(routes))
    # An HTTP/1.1 connection waiting for a request (idle, or holding half of one) is closed
    # after HTTP_IDLE_TIMEOUT seconds; requests being served are not.
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           keepalive_timeout=HTTP_IDLE_TIMEOUT)
    await runner.setup()
    return runner

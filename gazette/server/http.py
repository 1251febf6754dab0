"""The HTTP side of a process's public port: an aiohttp app with the operability routes.

``/debug/metrics`` serves the process's Prometheus registry in the text exposition format;
``/debug/ready`` answers 200 once the process has announced itself and serves its assignments
(the ``ready`` event, and the process's ``not_serving`` check finds nothing pending), 503
with the reason before that and while draining. Brokers add their gateway, consumers
their applications' routes.

Invariants: the app accepts bodies of any size (``client_max_size=0``: the gateway streams
appends); the runner neither installs signal handlers (the process owns them) nor logs access.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["debug_routes", "start_app"]


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


async def start_app(routes: Iterable[web.RouteDef]) -> web.AppRunner:
    """A set-up runner of an app serving ``routes`` (the mux feeds its server connections)."""
    app = web.Application(client_max_size=0)
    app.add_routes(list(routes))
    # An HTTP/1.1 connection waiting for a request (idle, or holding half of one) is closed
    # after HTTP_IDLE_TIMEOUT seconds; requests being served are not.
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           keepalive_timeout=HTTP_IDLE_TIMEOUT)
    await runner.setup()
    return runner

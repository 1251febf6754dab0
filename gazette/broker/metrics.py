"""Operability endpoints and Prometheus metrics of a broker.

``/debug/metrics`` serves the process's Prometheus registry in the text
exposition format; ``/debug/ready`` answers 200 once the broker has announced
itself and serves its assignments, 503 before that and while draining.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

if TYPE_CHECKING:
    from gazette.broker.server import Broker

APPEND_BYTES = Counter("gazette_append_bytes_total", "Bytes committed by Append RPCs served locally.")
APPENDS = Counter("gazette_appends_total", "Append RPCs served locally, by status.", ["status"])
READ_BYTES = Counter("gazette_read_bytes_total", "Bytes sent by Read RPCs served locally.")
COMMIT_SECONDS = Histogram(
    "gazette_append_commit_seconds",
    "Time from an Append's first content chunk to its commit.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


def metrics_app_routes(broker: Broker) -> list[web.RouteDef]:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def ready(_: web.Request) -> web.Response:
        if broker.ready.is_set():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    return [web.get("/debug/metrics", metrics), web.get("/debug/ready", ready)]

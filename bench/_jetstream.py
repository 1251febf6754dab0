"""The benchmarks' shared NATS JetStream connection: one nats-py client, its JetStream context.

Each benchmark subclasses :class:`JetStreamClient` with its own workloads. Connecting never
reconnects (a peer that goes away ends the run with an error rather than skewing its figures).
"""

from __future__ import annotations

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext


class JetStreamClient:
    def __init__(self) -> None:
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "not connected"
        return self._js

    async def connect(self, ports: int | list[int]) -> None:
        """Connects to the nats-server(s) listening on loopback ``ports``."""
        servers = [f"nats://127.0.0.1:{p}" for p in ([ports] if isinstance(ports, int) else ports)]
        self.nc = await nats.connect(servers, max_reconnect_attempts=0)
        self._js = self.nc.jetstream()

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

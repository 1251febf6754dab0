"""A child process serving HTTP/1.1 through the public port's scaffolding (the multiplexer, the
guarded aiohttp handler), under a descriptor limit of the test's choosing.

Run as ``python fd_server.py --limit N [--head-timeout S] [--event-loop asyncio|uvloop]``. It prints ``port P`` once
listening, ``exhausted`` each time an ``accept()`` fails for want of descriptors, and answers
commands read from stdin, one a line: ``hog`` (open /dev/null until the limit is reached; prints
``hogged K``), ``free`` (close them; ``freed``), ``stats`` (``stats shed=S open=O fds=F``).
Logs go to stderr in the processes' text format.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys

from aiohttp import web

from gazette.server.http import http_protocol_factory, start_app
from gazette.server.logs import setup_logging
from gazette.server.loop import run as run_loop
from gazette.server.mux import Multiplexer


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(limit: int, head_timeout: float) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    runner = await start_app([web.get("/ready", ready)])
    mux = Multiplexer("unused.sock", http_protocol_factory(runner, head_timeout=head_timeout),
                      h2_protocol_factory=asyncio.Protocol)
    port = await mux.start("127.0.0.1", 0)
    on_exhausted = mux._accept_exhausted

    def exhausted() -> None:
        say("exhausted")
        on_exhausted()

    mux._accept_exhausted = exhausted  # type: ignore[method-assign]
    say(f"port {port}")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    hogged: list[int] = []
    while line := (await reader.readline()).decode().strip():
        if line == "hog":
            try:
                while True:
                    hogged.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            say(f"hogged {len(hogged)}")
        elif line == "free":
            for fd in hogged:
                os.close(fd)
            hogged.clear()
            say("freed")
        elif line == "stats":
            try:
                fds = len(os.listdir("/proc/self/fd"))
            except OSError:  # hogged: listing it needs a descriptor
                fds = -1
            say(f"stats shed={mux.shed_total} open={mux._open_count()} fds={fds} "
                f"failures={mux.accept_failures.total}")
    await mux.close()
    await runner.cleanup()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, required=True)
    ap.add_argument("--head-timeout", type=float, default=60.0)
    ap.add_argument("--event-loop", default="asyncio")  # the test's own (gazette.server.loop)
    args = ap.parse_args()
    setup_logging("info", "text")
    run_loop(main(args.limit, args.head_timeout), args.event_loop)

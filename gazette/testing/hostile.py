"""Hostile clients of a broker or consumer port, every class at once, for soaks and by hand.

    python -m gazette.testing.hostile --port 8080 --journal soak/victim --seconds 300

Each class is a loop that opens connections, misbehaves and closes them, at a bounded rate
(so the load is the same on any machine and the run stops by itself), addressing only the
given port on loopback:

* ``header_bomb``: one HEADERS frame carrying a header block as large as the server's
  advertised max frame size allows (up to 1 MiB), never decodable in bounded time if the
  server decoded before checking its size.
* ``continuation_flood``: HEADERS without END_HEADERS, then CONTINUATION frames, 2 MiB.
* ``partial_messages``: Append streams whose gRPC length prefix promises 15 MiB, of which
  1 MiB is sent, then held.
* ``unread_reads``: blocking Read streams of the journal whose answers are never read.
* ``refused_unread``: more streams than the server allows, answers (refusals) never read.
* ``garbage``: Append streams carrying random bytes as the request message.
* ``compressed``: a message with the compressed flag set.
* ``malformed``: requests breaking RFC 9113 §8.1 (pseudo-header after a regular one, a
  connection-specific header, no ``:path``).
* ``stalled_appends``: Appends of the journal that send their first message and then stall.
* ``slow_http1``: HTTP/1.1 request heads sent a byte at a time, and idle keep-alive sockets.

The process prints one line of counters per class when it ends. Nothing here asserts: the
soak test watches the server and a healthy client while this runs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from gazette.protocol import protocol_pb2 as pb
from gazette.rpc import frames as f

APPEND = "/protocol.Journal/Append"
READ = "/protocol.Journal/Read"

Attack = Callable[["Target"], Awaitable[None]]


class Target:
    """Where the attacks go, and what they counted."""

    def __init__(self, port: int, journal: str, until: float) -> None:
        self.port = port
        self.journal = journal
        self.until = until
        self.counts: Counter[str] = Counter()

    def running(self) -> bool:
        return time.monotonic() < self.until


class _Conn:
    """A raw HTTP/2 connection: the server's SETTINGS read, frames sent as asked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.max_frame = f.DEFAULT_MAX_FRAME

    @classmethod
    async def open(cls, port: int, window: int = f.DEFAULT_WINDOW) -> _Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer)
        writer.write(f.PREFACE + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: window}))
        frames = f.FrameReader(f.MAX_FRAME_LIMIT)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                while True:
                    data = await reader.read(1 << 16)
                    if not data:
                        break
                    got = [(t, fl, p) for t, fl, _, p in frames.feed(data)]
                    settings = [p for t, fl, p in got if t == f.SETTINGS and not fl & f.ACK]
                    if settings:
                        for key, value in f.parse_settings(memoryview(settings[0])):
                            if key == f.SETTINGS_MAX_FRAME_SIZE:
                                conn.max_frame = value
                        break
        writer.write(f.frame(f.SETTINGS, f.ACK, 0))
        return conn

    def headers(self, sid: int, path: str, flags: int = f.END_HEADERS, extra: bytes = b"") -> None:
        self.writer.write(f.frame(f.HEADERS, flags, sid,
                                  f.request_headers(path, "hostile", "hostile") + extra))

    def message(self, sid: int, body: bytes, end: bool = False, compressed: bool = False) -> None:
        prefix = bytes([1 if compressed else 0]) + len(body).to_bytes(4, "big")
        self.writer.write(f.frame(f.DATA, f.END_STREAM if end else 0, sid, prefix + body))

    async def drain_for(self, seconds: float) -> int:
        """Read (and drop) what the server sends for ``seconds``, or until it closes."""
        n = 0
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(seconds):
                while data := await self.reader.read(1 << 16):
                    n += len(data)
        return n

    async def hold(self, seconds: float) -> None:
        """Keep the connection open without reading, for ``seconds``."""
        await asyncio.sleep(seconds)

    def close(self) -> None:
        self.writer.close()


async def header_bomb(t: Target) -> None:
    conn = await _Conn.open(t.port)
    size = min(conn.max_frame, 1 << 20) - 64
    block = f.request_headers(APPEND, "hostile", "hostile") + f.literal("x-bomb", b"a" * size)
    conn.writer.write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block[: conn.max_frame]))
    await conn.drain_for(2)
    conn.close()


async def continuation_flood(t: Target) -> None:
    conn = await _Conn.open(t.port)
    conn.headers(1, APPEND, flags=0)
    chunk = b"\x00" * min(conn.max_frame, 16 << 10)
    for _ in range((2 << 20) // len(chunk)):
        conn.writer.write(f.frame(f.CONTINUATION, 0, 1, chunk))
    await conn.drain_for(2)
    conn.close()


async def partial_messages(t: Target) -> None:
    conn = await _Conn.open(t.port)
    for i in range(8):
        sid = 1 + 2 * i
        conn.headers(sid, APPEND)
        conn.writer.write(f.frame(f.DATA, 0, sid, b"\x00" + (15 << 20).to_bytes(4, "big")))
        chunk = os.urandom(16 << 10)
        for _ in range(64):
            conn.writer.write(f.frame(f.DATA, 0, sid, chunk))
    await conn.drain_for(8)
    conn.close()


async def unread_reads(t: Target) -> None:
    conn = await _Conn.open(t.port, window=f.MAX_WINDOW)
    conn.writer.write(f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW))
    req = pb.ReadRequest(journal=t.journal, offset=0, block=True).SerializeToString()
    for i in range(20):
        conn.headers(1 + 2 * i, READ)
        conn.message(1 + 2 * i, req, end=True)
    await conn.hold(10)
    conn.close()


async def refused_unread(t: Target) -> None:
    conn = await _Conn.open(t.port)
    for i in range(400):
        conn.headers(1 + 2 * i, READ)  # never sends a message: parked, then refused
    await conn.hold(5)
    conn.close()


async def garbage(t: Target) -> None:
    conn = await _Conn.open(t.port)
    for i in range(20):
        sid = 1 + 2 * i
        conn.headers(sid, APPEND)
        conn.message(sid, os.urandom(random.randrange(1, 200)), end=True)
    await conn.drain_for(2)
    conn.close()


async def compressed(t: Target) -> None:
    conn = await _Conn.open(t.port)
    conn.headers(1, APPEND, extra=f.literal("grpc-encoding", "gzip"))
    conn.message(1, b"\x1f\x8b" + os.urandom(20), end=True, compressed=True)
    conn.headers(3, APPEND)
    conn.message(3, os.urandom(20), end=True, compressed=True)
    await conn.drain_for(2)
    conn.close()


async def malformed(t: Target) -> None:
    conn = await _Conn.open(t.port)
    base = f.request_headers(APPEND, "hostile", "hostile")
    blocks = [
        f.literal("x-first", "1") + f.SCHEME_HTTP + base,   # a pseudo-header after a regular one
        base + f.literal("connection", "keep-alive"),        # connection-specific
        f.METHOD_POST + f.SCHEME_HTTP + f.CONTENT_TYPE_GRPC,  # no :path
        base + f.literal(":bogus", "1"),                      # unknown pseudo-header
    ]
    for i, block in enumerate(blocks):
        conn.writer.write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1 + 2 * i, block))
    await conn.drain_for(2)
    conn.close()


async def stalled_appends(t: Target) -> None:
    conn = await _Conn.open(t.port)
    first = pb.AppendRequest(journal=t.journal).SerializeToString()
    for i in range(50):
        sid = 1 + 2 * i
        conn.headers(sid, APPEND)
        conn.message(sid, first)  # then nothing: a stalled append
    await conn.drain_for(15)
    conn.close()


async def slow_http1(t: Target) -> None:
    socks: list[asyncio.StreamWriter] = []
    try:
        for _ in range(20):
            _, w = await asyncio.open_connection("127.0.0.1", t.port)
            socks.append(w)
        for _ in range(20):  # idle keep-alive sockets, after one complete request each
            r, w = await asyncio.open_connection("127.0.0.1", t.port)
            w.write(f"GET /{t.journal}?offset=0&block=false HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            socks.append(w)
        head = f"GET /{t.journal}?offset=0 HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode()
        for i in range(12):
            for w in socks[:20]:
                w.write(head[i % len(head): i % len(head) + 1])
            await asyncio.sleep(1)
    except ConnectionError:
        pass
    finally:
        for w in socks:
            w.close()


ATTACKS: dict[str, tuple[Attack, float]] = {
    # name: (attack, seconds between starts)
    "header_bomb": (header_bomb, 1.0),
    "continuation_flood": (continuation_flood, 1.0),
    "partial_messages": (partial_messages, 4.0),
    "unread_reads": (unread_reads, 5.0),
    "refused_unread": (refused_unread, 3.0),
    "garbage": (garbage, 0.5),
    "compressed": (compressed, 0.5),
    "malformed": (malformed, 0.5),
    "stalled_appends": (stalled_appends, 8.0),
    "slow_http1": (slow_http1, 6.0),
}


async def _guarded(name: str, attack: Attack, t: Target) -> None:
    try:
        await attack(t)
    except (OSError, asyncio.IncompleteReadError) as err:  # the server cut us off: expected
        t.counts[f"{name}.{type(err).__name__}"] += 1


async def _loop(name: str, attack: Attack, every: float, t: Target) -> None:
    running: set[asyncio.Task[None]] = set()
    try:
        while t.running():
            task = asyncio.create_task(_guarded(name, attack, t))
            running.add(task)
            task.add_done_callback(running.discard)
            t.counts[f"{name}.started"] += 1
            await asyncio.sleep(every)
    finally:
        for task in running:
            task.cancel()
        for task in list(running):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def run(port: int, journal: str, seconds: float, only: list[str] | None = None) -> Counter[str]:
    """Every attack (or those named) against ``port`` for ``seconds``; their counters."""
    t = Target(port, journal, time.monotonic() + seconds)
    names = only or list(ATTACKS)
    async with asyncio.TaskGroup() as tg:
        for name in names:
            attack, every = ATTACKS[name]
            tg.create_task(_loop(name, attack, every, t))
    return t.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--only", action="append", choices=sorted(ATTACKS))
    args = parser.parse_args()
    # asyncio warns of every write to a socket the server closed: that is the point here.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    counts = asyncio.run(run(args.port, args.journal, args.seconds, args.only))
    for key in sorted(counts):
        print(f"{key} {counts[key]}", flush=True)


if __name__ == "__main__":
    main()

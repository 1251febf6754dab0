"""The connection's sends: frames written within one turn of the loop leave together, but
never more than ``FLUSH_PARTS`` of them wait for the turn's end."""

from __future__ import annotations

import asyncio

import pytest

from fuzz.targets import RecordingTransport
from gazette.rpc.connection import FLUSH_PARTS
from gazette.rpc.server import RpcServer, ServerConnection

pytestmark = pytest.mark.both_loops  # the transport on asyncio's loop and on uvloop (conftest)


class CountingTransport(RecordingTransport):
    """Keeps what is written, and how many writes it took."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: object) -> None:
        self.writes += 1
        super().write(data)


async def test_writes_of_one_turn_leave_in_groups_of_at_most_flush_parts() -> None:
    server = RpcServer()
    conn = ServerConnection(server)
    transport = CountingTransport()
    conn.connection_made(transport)
    before = transport.writes  # the connection's preface
    frames = [bytes([i]) * 9 for i in range(2 * FLUSH_PARTS + 3)]
    for i, frame in enumerate(frames):
        conn.write(frame)
        # Nothing leaves before a group is full; each full group leaves at once, in one send.
        assert transport.writes - before == (i + 1) // FLUSH_PARTS
    await asyncio.sleep(0)  # the turn's end: the rest leaves, in one more send
    assert transport.writes - before == 3
    assert bytes(transport.out).endswith(b"".join(frames))
    conn.connection_lost(None)
    await server.handlers.aclose()


async def test_a_turn_with_few_writes_sends_once() -> None:
    server = RpcServer()
    conn = ServerConnection(server)
    transport = CountingTransport()
    conn.connection_made(transport)
    before = transport.writes
    for _ in range(3):  # a unary response: headers, message, trailers
        conn.write(b"\0" * 9)
    assert transport.writes == before
    await asyncio.sleep(0)  # the turn's end
    assert transport.writes == before + 1
    conn.connection_lost(None)
    await server.handlers.aclose()

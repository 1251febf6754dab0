"""gazctl journals read over many journals: whole-fragment multiplexing against the fake
Journal service, and which reads start, stop and resume as the selector's listing changes."""

from __future__ import annotations

import argparse
import asyncio
import io
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gazette.cli.gazctl import main
from gazette.cli.gazctl.common import Context
from gazette.cli.gazctl.journals.read import _ReadSession
from gazette.cli.gazctl.output import Log
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    for i in range(4):
        cluster.create(f"foobar/part-00{i}", {"my-label": ""}, length=64)
    b = await start_broker(cluster)
    yield b
    await b.stop()


async def read_all(broker: FakeBroker, *argv: str) -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), io.StringIO()
    env = {"HOME": "/nonexistent", "PATH": os.environ.get("PATH", ""),
           "BROKER_ADDRESS": broker.endpoint}
    code = await asyncio.to_thread(main, ["journals", "read", *argv], stdin=io.BytesIO(),
                                   stdout=out, stderr=err, env=env)
    return code, out.getvalue(), err.getvalue()


async def test_many_journals_multiplex_whole_fragments(broker: FakeBroker) -> None:
    # Several fragments per journal (length=64), written as whole appends of 3 records.
    spans: dict[str, list[bytes]] = {}
    for i in range(4):
        name = f"foobar/part-00{i}"
        for n in range(8):
            data = b"".join(b"j%d rec %02d.%d\n" % (i, n, k) for k in range(3))
            broker.cluster.write(name, data)
        spans[name] = [bytes(f.content) for f in broker.cluster.journals[name].fragments]
    code, out, err = await read_all(broker, "-l", "my-label")
    assert code == 0, err
    # The fake serves content in 5-byte responses: still, each fragment is copied whole.
    pos = 0
    seen: dict[str, list[bytes]] = {n: [] for n in spans}
    while pos < len(out):
        for name, frags in spans.items():
            nxt = len(seen[name])
            if nxt < len(frags) and out.startswith(frags[nxt], pos):
                seen[name].append(frags[nxt])
                pos += len(frags[nxt])
                break
        else:
            raise AssertionError(f"output at {pos} is not a whole next fragment: {out[pos:pos+40]!r}")
    assert seen == spans
    assert err.count("read started") == 4 and err.count("read finished") == 4


async def test_suspended_and_unmatched_journals_are_not_read(broker: FakeBroker) -> None:
    broker.cluster.write("foobar/part-000", b"zero\n")
    broker.cluster.write("foobar/part-001", b"one\n")
    broker.cluster.journals["foobar/part-001"].spec.suspend.level = pb.JournalSpec.Suspend.FULL
    broker.cluster.create("other/journal", {})  # Not selected.
    broker.cluster.write("other/journal", b"other\n")
    code, out, err = await read_all(broker, "-l", "prefix=foobar/")
    assert code == 0, err
    assert out == b"zero\n"

    code, out, err = await read_all(broker, "-l", "nothing-matches")
    assert code == 0 and out == b"" and "no journals were matched by the selector" in err


# --- reads following the listing ----------------------------------------------------------

def listing(*names: str) -> pb.ListResponse:
    resp = pb.ListResponse()
    for name in names:
        resp.journals.add().spec.name = name
    return resp


class Session(_ReadSession):
    """A read session whose pumps wait to be released instead of reading."""

    def __init__(self) -> None:
        args = argparse.Namespace(tail=False, offset=0)
        ctx = Context(args=args, log=Log(io.StringIO()), address="", stdin=io.BytesIO(),
                      stdout=io.BytesIO())
        super().__init__(ctx, client=None, out=io.BytesIO())  # type: ignore[arg-type]
        self.started: list[tuple[str, int]] = []
        self.release: dict[str, asyncio.Event] = {}

    async def pump(self, journal: str, offset: int) -> None:
        self.started.append((journal, offset))
        self.release[journal] = ev = asyncio.Event()
        try:
            await ev.wait()
        finally:
            self.offsets[journal] = offset + 10


async def settle(session: Session) -> None:
    """Reap every ended pump, as cmd_read's loop does."""
    await asyncio.sleep(0)  # Let started pumps run to their first await.
    for name, task in list(session.tasks.items()):
        if task.done() or task.cancelling():
            await asyncio.gather(task, return_exceptions=True)
            session.reap(name)
    await asyncio.sleep(0)


async def test_reads_follow_the_listing() -> None:
    s = Session()
    s.reconcile(listing("a", "b"))
    await settle(s)
    assert s.started == [("a", 0), ("b", 0)]

    # "a" reaches the write head: not restarted while it stays listed.
    s.release["a"].set()
    await settle(s)
    s.reconcile(listing("a", "b", "c"))
    await settle(s)
    assert s.started[2:] == [("c", 0)] and set(s.tasks) == {"b", "c"}

    # "b" stops matching; its read is cancelled and it is not counted as finished.
    s.reconcile(listing("a", "c"))
    await settle(s)
    assert set(s.tasks) == {"c"} and "b" not in s.finished

    # "b" and "a" match again: both resume from their last offsets.
    s.reconcile(listing("b", "c"))
    s.reconcile(listing("a", "b", "c"))
    await settle(s)
    assert s.started[3:] == [("b", 10), ("a", 10)]


async def test_a_journal_matched_again_before_its_read_ended_restarts() -> None:
    s = Session()
    s.reconcile(listing("a"))
    await settle(s)
    s.reconcile(listing())  # Cancels "a" ...
    s.reconcile(listing("a"))  # ... which matches again before its task has ended.
    assert len(s.started) == 1
    task: Any = s.tasks["a"]
    await asyncio.gather(task, return_exceptions=True)
    s.reap("a")
    await settle(s)
    assert s.started == [("a", 0), ("a", 10)] and "a" in s.tasks
    for t in s.tasks.values():
        t.cancel()
    await asyncio.gather(*s.tasks.values(), return_exceptions=True)

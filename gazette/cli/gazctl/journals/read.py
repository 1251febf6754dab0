"""``gazctl journals read``: read journal contents (Gazette's ``journals_read.go``).

Flags, help and output are Gazette's; see ``gazctl journals read --help``.

Invariants: each journal's content is written in whole-fragment spans: while one journal's
span is being copied no other journal writes, so appends holding whole messages stay whole
in the merged output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import IO

from gazette.cli.gazctl.common import CommandError, Context, selector_of, suspended_fully
from gazette.client.errors import (
    ClientError,
)
from gazette.client.journal_client import JournalClient
from gazette.client.listing import PolledList
from gazette.client.reader import RetryReader
from gazette.protocol import protocol_pb2 as pb
from gazette.tasks import Supervisor


def read_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label selector of journals to read")
    p.add_argument("-b", "--block", action="store_true",
                   help="Do not exit on journal EOF; wait for new data until signaled")
    p.add_argument("--tail", action="store_true",
                   help="Start reading from the journal write-head (rather than offset 0)")
    p.add_argument("--offset", type=int, default=0,
                   help="Offset to start reading journals not in --offsets from")
    p.add_argument("-o", "--output", default="-", help="Output file path. Use '-' for stdout")
    p.add_argument("--offsets", default="", help="Path from which initial journal offsets "
                   "are read at startup")
    p.add_argument("--offsets-out", default="", help="Path to which final journal offsets "
                   "are written at exit")
    p.add_argument("--file-root", default="", help="Filesystem path which roots file:// "
                   "fragment store")
    p.add_argument("--from", dest="from_unix", type=int, default=0,
                   help="Skip over fragments persisted before this time, in unix seconds "
                        "since epoch")
    p.add_argument("--interval", type=float, default=30.0, help=argparse.SUPPRESS)


class _ReadSession:
    def __init__(self, ctx: Context, client: JournalClient, out: IO[bytes]) -> None:
        self.ctx = ctx
        self.client = client
        self.out = out
        self.offsets: dict[str, int] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}  # The live reads, by journal.
        # Owns the reads; their failures are reaped by ``cmd_read``'s loop.
        self.group = Supervisor("gazctl read", "collect")
        self.finished: set[str] = set()  # Read to the write head (non-blocking reads).
        self.dropped: set[str] = set()  # Cancelled because the selector no longer matches.
        self.wanted: set[str] = set()  # Matched by the latest listing.
        self.lock = asyncio.Lock()  # Held while one journal copies a fragment span.
        self.changed = asyncio.Event()

    def reconcile(self, resp: pb.ListResponse) -> None:
        wanted = {j.spec.name for j in resp.journals if not suspended_fully(j)}
        self.wanted = wanted
        # A journal matched again after it stopped matching resumes from its last offset.
        self.finished &= wanted
        for name in sorted(wanted):
            if name not in self.tasks and name not in self.finished:
                self.start(name)
        for name, task in self.tasks.items():
            if name not in wanted:
                self.dropped.add(name)
                task.cancel()
        self.changed.set()

    def start(self, name: str) -> None:
        a = self.ctx.args
        offset = self.offsets.get(name, -1 if a.tail else a.offset)
        self.ctx.log.info("read started", journal=name, offset=offset)
        self.tasks[name] = self.group.spawn(name, self.pump(name, offset))

    def reap(self, name: str) -> None:
        """Account for the ended read of ``name``."""
        del self.tasks[name]
        if name not in self.dropped:
            self.finished.add(name)
            return
        self.dropped.discard(name)
        if name in self.wanted:  # Matched again while its cancelled read was ending.
            self.start(name)

    async def pump(self, journal: str, offset: int) -> None:
        a = self.ctx.args
        rr = RetryReader(
            self.client,
            pb.ReadRequest(journal=journal, offset=offset, block=a.block,
                           do_not_proxy=self.ctx.cache_size > 0, begin_mod_time=a.from_unix),
            file_root=a.file_root or None,
            on_jump=lambda was, to: self.ctx.log.warn("offset jump", journal=journal,
                                                      offset=was, to=to),
            on_retry=lambda err, n: self.ctx.log.warn("read failure (will retry)",
                                                      journal=journal, err=str(err), attempt=n),
        )
        holding = False
        try:
            async for chunk in rr:
                if not holding:
                    await self.lock.acquire()
                    holding = True
                    frag = rr.fragment
                    if self.ctx.log.enabled(10) and frag is not None:
                        self.ctx.log.debug("read is ready", **{
                            "fragment.Begin": frag.begin, "fragment.End": frag.end,
                            "fragment.URL": rr.response.fragment_url, "journal": journal,
                            "offset": rr.offset - len(chunk)})
                self.out.write(chunk)
                frag = rr.fragment
                if frag is None or rr.offset >= frag.end:
                    self.out.flush()
                    self.lock.release()
                    holding = False
        finally:
            if holding:
                self.out.flush()
                self.lock.release()
            self.offsets[journal] = rr.offset
            self.ctx.log.info("read finished", journal=journal, offset=rr.offset)
            await rr.aclose()


async def cmd_read(ctx: Context) -> None:
    a = ctx.args
    initial: dict[str, int] = {}
    if a.offsets:
        try:
            text = await asyncio.to_thread(Path(a.offsets).read_text)
            initial = {str(k): int(v) for k, v in json.loads(text).items()}
        except (OSError, ValueError, AttributeError) as err:
            raise CommandError("failed to read offsets", err=str(err), path=a.offsets) from None
        if a.offsets == a.offsets_out:
            os.replace(a.offsets, a.offsets + ".previous")
    selector = selector_of(a.selector)

    out: IO[bytes]
    if a.output == "-":
        out = ctx.stdout
    else:
        try:
            out = await asyncio.to_thread(open, a.output, "wb")  # Closed below.
        except OSError as err:
            raise CommandError("failed to open output file", err=str(err)) from None

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)

    try:
        async with ctx.client() as client:
            session = _ReadSession(ctx, client, out)
            session.offsets.update(initial)
            polled = PolledList(client, selector, interval=a.interval,
                                on_change=session.reconcile)
            try:
                first = await polled.start()
            except ClientError as err:
                raise CommandError("failed to resolve label selector to journals",
                                   err=str(err)) from None
            if not first.journals:
                ctx.log.warn("no journals were matched by the selector")
            stopper = loop.create_task(stop.wait())
            try:
                while session.tasks and not stop.is_set():
                    session.changed.clear()
                    changed = loop.create_task(session.changed.wait())
                    await asyncio.wait([*session.tasks.values(), stopper, changed],
                                       return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
                    for name, task in list(session.tasks.items()):
                        if task.done():
                            dropped = name in session.dropped  # Its errors don't matter.
                            session.reap(name)
                            if not dropped and not task.cancelled() \
                                    and task.exception() is not None:
                                exc = task.exception()
                                raise CommandError("error reading journal", journal=name,
                                                   err=str(exc)) from None
            finally:
                stopper.cancel()
                await polled.stop()
                await session.group.aclose()
        if a.offsets_out:
            tmp = a.offsets_out + ".temp"
            await asyncio.to_thread(Path(tmp).write_text, json.dumps(session.offsets) + "\n")
            os.replace(tmp, a.offsets_out)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if out is not ctx.stdout:
            out.close()

"""``gazctl journals append``: append journal content (Gazette's ``journals_append.go``).

Flags, help and output are Gazette's; see ``gazctl journals append --help``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import IO

from google.protobuf import text_format

from gazette.cli.gazctl.common import CommandError, Context, selector_of
from gazette.cli.gazctl.journals.framing import (
    FRAMINGS,
    MAPPINGS,
    Mapped,
    RecordMapper,
    check_flags,
    router,
    splitter,
)
from gazette.client.appender import Appender, append
from gazette.client.errors import (
    ClientError,
)
from gazette.client.journal_client import JournalClient
from gazette.client.listing import PolledList
from gazette.client.reader import backoff
from gazette.message.errors import MappingError
from gazette.protocol import protocol_pb2 as pb


def append_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True,
                   help="Label selector of journals to append to")
    p.add_argument("-i", "--input", default="-", help="Input file path. Use '-' for stdin")
    p.add_argument("-f", "--framing", default="none", choices=FRAMINGS,
                   help="Framing of records in input, if any")
    p.add_argument("-m", "--mapping", default="random", choices=MAPPINGS,
                   help="Mapping function of records to journals")
    p.add_argument("--base64", action="store_true",
                   help="Partition keys under 'lines' framing are interpreted as base64")
    # How often the selector is listed again while appending (Gazette watches it).
    p.add_argument("--interval", type=float, default=10.0, help=argparse.SUPPRESS)


_READ_BLOCK = 1 << 20
PRIMARY_WAIT = 30.0
"""Seconds an append waits for a journal without a primary broker to be assigned one."""


async def cmd_append(ctx: Context) -> None:
    a = ctx.args
    problem = check_flags(a.framing, a.mapping, a.base64)
    if problem is not None:
        raise CommandError(problem)
    selector = selector_of(a.selector)
    try:
        fin: IO[bytes] = (ctx.stdin if a.input == "-"
                          else await asyncio.to_thread(open, a.input, "rb"))
    except OSError as err:
        raise CommandError("failed to open input file", err=str(err)) from None
    read = getattr(fin, "read1", fin.read)

    async def block() -> bytes:
        # read1: a streamed input (a pipe fed a record at a time) is appended as it arrives.
        data: bytes = await asyncio.to_thread(read, _READ_BLOCK)
        return data

    try:
        async with ctx.client() as client:
            polled = PolledList(client, selector, interval=a.interval,
                                on_error=lambda err: ctx.log.warn(
                                    "listing journals failed (will retry)", err=str(err)))
            try:
                await polled.start()
            except ClientError as err:
                raise CommandError("failed to resolve label selector to journals",
                                   err=str(err)) from None

            def partitions() -> pb.ListResponse:
                assert polled.list is not None  # Set by start().
                return polled.list

            try:
                if a.framing == "none":
                    try:
                        journal = router("random", partitions)(None)
                    except MappingError as err:
                        raise CommandError("mapping to journal", err=str(err),
                                           selector=a.selector) from None
                    await _await_primary(ctx, polled, journal)
                    await _append_all(ctx, client, journal, block)
                else:
                    await _append_records(ctx, client, partitions, block)
            finally:
                await polled.stop()
    finally:
        if fin is not ctx.stdin:
            fin.close()


async def _await_primary(ctx: Context, polled: PolledList, journal: str) -> None:
    """Waits (up to ``PRIMARY_WAIT``) until ``journal`` has a primary. A journal applied a
    moment ago has none until the allocator assigns it, and a streamed append cannot be
    replayed once its content was read, so it waits before it starts (Gazette's append
    service retries instead). Past the wait the append goes ahead and fails with the
    broker's status."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PRIMARY_WAIT
    attempt = 0
    while True:
        assert polled.list is not None  # Set by start().
        listed = next((j for j in polled.list.journals if j.spec.name == journal), None)
        if listed is None or listed.route.primary >= 0 or loop.time() >= deadline:
            return
        if attempt == 0:
            ctx.log.info("waiting for the journal to be assigned a primary broker", journal=journal)
        await asyncio.sleep(backoff(attempt))  # a retry's pause, not a synchronisation
        attempt += 1
        try:
            await polled.refresh()
        except ClientError as err:
            ctx.log.warn("listing journals failed (will retry)", err=str(err))


async def _append_all(ctx: Context, client: JournalClient, journal: str,
                      block: Callable[[], Awaitable[bytes]]) -> None:
    app = Appender(client, journal)
    try:
        while data := await block():
            await app.write(data)
        resp = await app.commit()
    except ClientError as err:
        await app.abort()
        raise CommandError("appending to journal", err=str(err), journal=journal) from None
    except BaseException:
        await app.abort()
        raise
    ctx.log.debug("append response", commit=text_format.MessageToString(
        resp.commit, as_one_line=True), broker=resp.header.process_id.suffix)


async def _append_records(ctx: Context, client: JournalClient,
                          partitions: Callable[[], pb.ListResponse],
                          block: Callable[[], Awaitable[bytes]]) -> None:
    """Appends each block's whole records, grouped per journal, before reading the next:
    records mapped to one journal keep their input order."""
    a = ctx.args
    split = splitter(a.framing, a.base64)
    keyed = a.mapping != "random"

    def on_mapped(journal: str, key: bytes) -> None:
        ctx.log.debug("mapped partition key to journal", journal=journal,
                      key=key.decode(errors="replace"))

    mapper = RecordMapper(split, router(a.mapping, partitions), keyed,
                          on_mapped if ctx.log.enabled(10) else None)
    rest = b""
    eof = False
    while not eof:
        data = await block()
        eof = not data
        buf = rest + data if rest else data
        records, used, err = split.split(buf)
        if err is None and eof:
            err = split.end_error(buf[used:])
        rest = buf[used:]
        listing = partitions()
        if not keyed and len(listing.journals) == 1:
            # One journal: the block's whole records go as they are, in one append.
            mapped = Mapped(batches={listing.journals[0].spec.name: [buf[:used]]}
                            if used else {})
        else:
            mapped = mapper.feed(records)
        await _append_batches(client, mapped.batches)
        if mapped.error is not None:
            raise CommandError("failed to process record stream",
                               err=f"{mapped.stage}: {mapped.error}")
        if err is not None:
            what = "unpacking partition key" if keyed and mapper.pending_key is None \
                else "unpacking record"
            raise CommandError("failed to process record stream", err=f"{what}: {err}")
    if mapper.pending_key is not None:
        ctx.log.warn("input ended with a partition key but no record; nothing appended for it",
                     key=mapper.pending_key.decode(errors="replace"))


async def _append_batches(client: JournalClient, batches: dict[str, list[bytes]]) -> None:
    async def one(journal: str, records: list[bytes]) -> None:
        try:
            await append(client, journal, records[0] if len(records) == 1
                         else b"".join(records))
        except ClientError as err:
            raise CommandError("failed to process record stream", err=str(err),
                               journal=journal) from None

    # Every append finishes (or fails) before an error is raised: none is left running.
    results = await asyncio.gather(*(one(j, r) for j, r in batches.items()),
                                   return_exceptions=True)
    for res in results:
        if isinstance(res, BaseException):
            raise res

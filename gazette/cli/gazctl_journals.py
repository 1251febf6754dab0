"""The ``gazctl journals`` commands: list, apply, edit, read, append, fragments, prune,
reset-head and suspend.

Invariants:
- Each command is an async function of a ``Context``; failures the user can act upon
  raise ``CommandError`` (a message plus log fields), which gazctl prints as one line.
- Selectors use Gazette's grammar (gazette.protocol.labels), spec YAML is Gazette's journal-space
  hierarchy (gazette.journalspace), durations are Go's (gazette.durations).
- ``read`` writes each journal's content in whole-fragment spans: while one journal's
  span is being copied no other journal writes, so appends holding whole messages stay
  whole in the merged output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from google.protobuf import text_format

from gazette.cli.gazctl_append import (
    FRAMINGS,
    MAPPINGS,
    Mapped,
    RecordMapper,
    check_flags,
    router,
    splitter,
)
from gazette.cli.gazctl_output import (
    Log,
    go_json,
    ibytes,
    json_line,
    reltime,
    render_table,
)
from gazette.client.appender import Appender, append
from gazette.client.errors import (
    AppendError,
    ApplyError,
    ClientError,
    OffsetNotYetAvailable,
)
from gazette.client.journal_client import JournalClient
from gazette.client.listing import PolledList, parse_selector
from gazette.client.reader import Reader, RetryReader
from gazette.errors import GazetteError
from gazette.message.errors import MappingError
from gazette.protocol import protocol_pb2 as pb


class CommandError(GazetteError):
    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields


@dataclass
class Context:
    args: argparse.Namespace
    log: Log
    address: str
    stdin: IO[bytes]
    stdout: IO[bytes]
    cache_size: int = 0
    zone: str = ""
    env: Any = field(default_factory=dict)

    def client(self) -> JournalClient:
        return JournalClient(self.address, zone=self.zone)


def _selector(text: str | None) -> pb.LabelSelector:
    try:
        return parse_selector(text or "")
    except GazetteError as err:
        raise CommandError("failed to parse label selector", err=str(err),
                           selector=text or "") from None


async def _list(client: JournalClient, selector: str | None,
                what: str = "failed to list journals") -> pb.ListResponse:
    sel = _selector(selector)
    try:
        return await client.list(sel)
    except ClientError as err:
        raise CommandError(what, err=str(err), broker=client.address) from None


def _suspended_fully(j: pb.ListResponse.Journal) -> bool:
    return j.spec.suspend.level == pb.JournalSpec.Suspend.FULL


def _add_list_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", default="", help="Label Selector query to filter on")
    p.add_argument("-o", "--format", default="table", choices=["table", "yaml", "json", "proto"],
                   help="Output format")
    p.add_argument("-L", "--label-columns", dest="labels", action="append", default=[],
                   help="Labels to present as columns, eg -L label-one -L label-two")
    p.add_argument("-p", "--primary", action="store_true", help="Show primary column")
    p.add_argument("-r", "--replicas", action="store_true", help="Show replicas column")
    p.add_argument("--rf", action="store_true", help="Show replication factor column")
    p.add_argument("--stores", action="store_true", help="Show fragment store column")
    p.add_argument("--watch", action="store_true",
                   help="Keep listing as the journals change (polls every --interval)")
    p.add_argument("--interval", type=float, default=10.0, help=argparse.SUPPRESS)


# --- list ---------------------------------------------------------------------------------

def _journals_yaml(resp: pb.ListResponse) -> str:
    from gazette.journalspace import from_list_response, to_yaml

    return to_yaml(from_list_response(resp))


def _list_output(ctx: Context, resp: pb.ListResponse) -> None:
    a = ctx.args
    out: str
    if a.format == "yaml":
        out = _journals_yaml(resp)
    elif a.format == "json":
        from google.protobuf.json_format import MessageToDict

        out = json_line(MessageToDict(resp, preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True))
    elif a.format == "proto":
        out = text_format.MessageToString(resp)
    else:
        headers = ["Name"]
        headers += ["RF"] if a.rf else []
        headers += ["Primary"] if a.primary else []
        headers += ["Replicas"] if a.replicas else []
        headers += ["Stores"] if a.stores else []
        headers += a.labels
        rows = []
        for j in resp.journals:
            primary, replicas = "<none>", []
            for i, m in enumerate(j.route.members):
                if i == j.route.primary:
                    primary = m.suffix
                else:
                    replicas.append(m.suffix)
            if j.spec.suspend.level != pb.JournalSpec.Suspend.NONE:
                primary += " <S>"
            row = [j.spec.name]
            row += [str(j.spec.replication)] if a.rf else []
            row += [primary] if a.primary else []
            row += [",".join(replicas)] if a.replicas else []
            if a.stores:
                row.append(j.spec.fragment.stores[0] if j.spec.fragment.stores else "<none>")
            for name in a.labels:
                values = [lb.value for lb in j.spec.labels.labels if lb.name == name]
                row.append(",".join(values) if values else "<none>")
            rows.append(row)
        out = render_table(headers, rows)
    ctx.stdout.write(out.encode())
    ctx.stdout.flush()


async def cmd_list(ctx: Context) -> None:
    async with ctx.client() as client:
        if not ctx.args.watch:
            _list_output(ctx, await _list(client, ctx.args.selector))
            return
        polled = PolledList(client, _selector(ctx.args.selector), interval=ctx.args.interval,
                            on_change=lambda resp: _list_output(ctx, resp),
                            on_error=lambda err: ctx.log.warn("listing failed (will retry)",
                                                              err=str(err)))
        try:
            await polled.start()
        except ClientError as err:
            raise CommandError("failed to list journals", err=str(err)) from None
        try:
            await polled.run()
        finally:
            await polled.stop()


# --- apply / edit -------------------------------------------------------------------------

def _apply_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--specs", default="-", help="Input specifications path to apply. "
                   "Use '-' for stdin")
    p.add_argument("--dry-run", action="store_true", help="Perform a dry-run of the apply")
    p.add_argument("--max-txn-size", type=int, default=0,
                   help="maximum number of specs to be processed within an apply "
                        "transaction. If 0, the default, all changes are issued in a single "
                        "transaction")


def changes_from_yaml(text: str) -> pb.ApplyRequest:
    """The ApplyRequest of a journal-space YAML document (Gazette's hierarchy)."""
    from gazette.journalspace import flatten, parse_yaml

    req = pb.ApplyRequest()
    for entry in flatten(parse_yaml(text)):
        change = req.changes.add(expect_mod_revision=entry.revision)
        if entry.delete:
            change.delete = entry.spec.name
        else:
            change.upsert.CopyFrom(entry.spec)
    return req


def _decode_specs(text: str) -> pb.ApplyRequest:
    try:
        return changes_from_yaml(text)
    except (ValueError, GazetteError) as err:  # SpecSpaceError and YAML errors.
        raise CommandError("failed to decode journal tree", err=str(err)) from None


async def _apply(ctx: Context, client: JournalClient, req: pb.ApplyRequest) -> None:
    try:
        resp = await client.apply(req, ctx.args.max_txn_size)
    except ClientError as err:
        raise CommandError("failed to apply journals", err=str(err)) from None
    ctx.log.info("successfully applied", revision=resp.header.etcd.revision)


async def cmd_apply(ctx: Context) -> None:
    path = ctx.args.specs
    try:
        data = ctx.stdin.read() if path == "-" else await asyncio.to_thread(Path(path).read_bytes)
    except OSError as err:
        raise CommandError("failed to read YAML input", err=str(err)) from None
    req = _decode_specs(data.decode())
    if ctx.args.dry_run:
        ctx.stdout.write(text_format.MessageToString(req).encode())
        ctx.stdout.flush()
        return
    async with ctx.client() as client:
        await _apply(ctx, client, req)


_EDIT_HEADER = """\
# Please edit the journal specifications below. Lines beginning with '#' at the top
# are ignored, and an empty file aborts the edit. Revisions are checked when applying:
# if a journal changed since it was listed, nothing is applied.
"""


def _strip_header(text: str) -> str:
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    return "".join(lines[i:])


def _run_editor(ctx: Context, path: str) -> None:
    editor = ctx.env.get("VISUAL") or ctx.env.get("EDITOR") or "vi"
    result = subprocess.run(["/bin/sh", "-c", f'{editor} "$1"', "editor", path], check=False)
    if result.returncode != 0:
        raise CommandError("editor failed", editor=editor, status=result.returncode)


async def cmd_edit(ctx: Context) -> None:
    async with ctx.client() as client:
        resp = await _list(client, ctx.args.selector)
        if not resp.journals:
            raise CommandError("no journals match selector", selector=ctx.args.selector)
        original = _journals_yaml(resp)
        before, message = original, ""
        fd, path = tempfile.mkstemp(prefix="gazctl-journals-edit-", suffix=".yaml")
        os.close(fd)
        try:
            while True:
                header = _EDIT_HEADER + "".join(f"# {line}\n" for line in message.splitlines())
                await asyncio.to_thread(Path(path).write_text, header + before)
                await asyncio.to_thread(_run_editor, ctx, path)
                edited = _strip_header(await asyncio.to_thread(Path(path).read_text))
                if not edited.strip():
                    ctx.log.info("Cancelled; empty file.")
                    return
                if edited == before:
                    ctx.log.info("Cancelled; no changes to invalid file." if message
                                 else "Cancelled; nothing to do.")
                    return
                try:
                    req = changes_from_yaml(edited)
                except (ValueError, GazetteError) as err:
                    before, message = edited, f"error: {err}"
                    continue  # Re-open the editor with the error shown at the top.
                try:
                    resp_apply = await client.apply(req, ctx.args.max_txn_size)
                except ApplyError as err:
                    if err.status == pb.ETCD_TRANSACTION_FAILED:
                        raise CommandError(
                            "failed to apply journals: a journal changed since it was listed "
                            "(stale revision); re-run edit to start from the current specs",
                            err=str(err)) from None
                    raise CommandError("failed to apply journals", err=str(err)) from None
                except ClientError as err:
                    raise CommandError("failed to apply journals", err=str(err)) from None
                ctx.log.info("successfully applied", revision=resp_apply.header.etcd.revision)
                return
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)


# --- read ---------------------------------------------------------------------------------

def _read_flags(p: argparse.ArgumentParser) -> None:
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
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.finished: set[str] = set()  # Read to the write head (non-blocking reads).
        self.dropped: set[str] = set()  # Cancelled because the selector no longer matches.
        self.wanted: set[str] = set()  # Matched by the latest listing.
        self.lock = asyncio.Lock()  # Held while one journal copies a fragment span.
        self.changed = asyncio.Event()

    def reconcile(self, resp: pb.ListResponse) -> None:
        wanted = {j.spec.name for j in resp.journals if not _suspended_fully(j)}
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
        self.tasks[name] = asyncio.get_running_loop().create_task(self.pump(name, offset))

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
    selector = _selector(a.selector)

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
                for task in session.tasks.values():
                    task.cancel()
                await asyncio.gather(*session.tasks.values(), return_exceptions=True)
        if a.offsets_out:
            tmp = a.offsets_out + ".temp"
            await asyncio.to_thread(Path(tmp).write_text, json.dumps(session.offsets) + "\n")
            os.replace(tmp, a.offsets_out)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if out is not ctx.stdout:
            out.close()


# --- append -------------------------------------------------------------------------------

def _append_flags(p: argparse.ArgumentParser) -> None:
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


async def cmd_append(ctx: Context) -> None:
    a = ctx.args
    problem = check_flags(a.framing, a.mapping, a.base64)
    if problem is not None:
        raise CommandError(problem)
    selector = _selector(a.selector)
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
                    await _append_all(ctx, client, journal, block)
                else:
                    await _append_records(ctx, client, partitions, block)
            finally:
                await polled.stop()
    finally:
        if fin is not ctx.stdin:
            fin.close()


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


# --- fragments / prune --------------------------------------------------------------------

def _fragments_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", default="", help="Label Selector query to filter on")
    p.add_argument("-o", "--format", default="table", choices=["table", "json", "proto"],
                   help="Output format")
    p.add_argument("--from", dest="from_unix", type=int, default=0,
                   help="Restrict to fragments created at or after this time, in unix "
                        "seconds since epoch")
    p.add_argument("--to", dest="to_unix", type=int, default=0,
                   help="Restrict to fragments created before this time, in unix seconds "
                        "since epoch")
    p.add_argument("--url-ttl", default="0s", help="Provide a signed GET URL with the given TTL")


async def _fragments_of(client: JournalClient, journals: list[str], from_unix: int = 0,
                        to_unix: int = 0, ttl: float | None = None) -> list[pb.FragmentsResponse]:
    async def one(name: str) -> pb.FragmentsResponse:
        try:
            return await client.list_fragments(name, begin_mod_time=from_unix,
                                               end_mod_time=to_unix, signature_ttl=ttl)
        except ClientError as err:
            raise CommandError("failed to fetch fragments", err=str(err), journal=name) from None

    return list(await asyncio.gather(*(one(n) for n in journals)))


def sha1_hex(s: pb.SHA1Sum) -> str:
    return (s.part1.to_bytes(8, "big") + s.part2.to_bytes(8, "big")
            + s.part3.to_bytes(4, "big")).hex()


async def cmd_fragments(ctx: Context) -> None:
    a = ctx.args
    from gazette.durations import parse_duration_ns

    try:
        ttl = parse_duration_ns(a.url_ttl) / 1e9
    except ValueError as err:
        raise CommandError("invalid --url-ttl", err=str(err)) from None
    async with ctx.client() as client:
        resp = await _list(client, a.selector)
        names = [j.spec.name for j in resp.journals if not _suspended_fully(j)]
        responses = await _fragments_of(client, names, a.from_unix, a.to_unix, ttl or None)
    if a.format == "json":
        out = "".join(json_line(go_json(f)) for r in responses for f in r.fragments)
    elif a.format == "proto":
        out = "".join(text_format.MessageToString(r) for r in responses)
    else:
        headers = ["Journal", "Offset", "Length", "Persisted", "SHA1", "Compression"]
        if ttl:
            headers.append("URL")
        rows = []
        now = time.time()
        for r in responses:
            for f in r.fragments:
                s = f.spec
                row = [s.journal, str(s.begin), ibytes(s.end - s.begin),
                       reltime(s.mod_time, now) if s.mod_time else "",
                       sha1_hex(s.sum)[:12] + "...",
                       pb.CompressionCodec.Name(s.compression_codec)]
                if ttl:
                    row.append(f.signed_url)
                rows.append(row)
        out = render_table(headers, rows)
    ctx.stdout.write(out.encode())
    ctx.stdout.flush()


def _prune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")
    p.add_argument("--dry-run", action="store_true", help="Perform a dry-run of the apply")
    p.add_argument("--file-root", default="", help="Filesystem path which roots file:// "
                   "fragment stores")


async def _remove_fragment(spec: pb.Fragment, file_root: str | None) -> None:
    from gazette.fragment.fragment import Fragment
    from gazette.stores import store_for_url

    await store_for_url(spec.backing_store, file_root).remove(Fragment.from_proto(spec))


async def cmd_prune(ctx: Context) -> None:
    a = ctx.args
    async with ctx.client() as client:
        resp = await _list(client, a.selector)
        if not resp.journals:
            raise CommandError("no journals match selector", selector=a.selector)
        now = time.time()
        totals = {"journalsTotal": len(resp.journals), "journalsPruned": 0,
                  "fragmentsTotal": 0, "fragmentsPruned": 0, "bytesTotal": 0, "bytesPruned": 0}
        for j in resp.journals:
            retention = j.spec.fragment.retention.ToNanoseconds() / 1e9
            (frags,) = await _fragments_of(client, [j.spec.name])
            aged = []
            for f in frags.fragments:
                totals["fragmentsTotal"] += 1
                totals["bytesTotal"] += f.spec.end - f.spec.begin
                if f.spec.backing_store and now - f.spec.mod_time >= retention:
                    aged.append(f.spec)
            ctx.log.info("fetched aged fragments", journal=j.spec.name,
                         total=len(frags.fragments), aged=len(aged))
            for spec in aged:
                ctx.log.info("pruning fragment", journal=spec.journal,
                             begin=spec.begin, end=spec.end, mod=spec.mod_time)
                if not a.dry_run:
                    try:
                        await _remove_fragment(spec, a.file_root or None)
                    except (GazetteError, OSError, Exception) as err:
                        raise CommandError("error removing fragment", err=str(err),
                                           journal=spec.journal, begin=spec.begin) from None
                totals["fragmentsPruned"] += 1
                totals["bytesPruned"] += spec.end - spec.begin
            totals["journalsPruned"] += 1
            ctx.log.info("pruned journal", journal=j.spec.name, **totals)
        ctx.log.info("finished pruning all journals", **totals)


# --- reset-head / suspend -----------------------------------------------------------------

def _selector_only(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")


def _edit_flags(p: argparse.ArgumentParser) -> None:
    _selector_only(p)
    p.add_argument("--max-txn-size", type=int, default=0,
                   help="maximum number of specs to be processed within an apply transaction")


def _suspend_flags(p: argparse.ArgumentParser) -> None:
    _selector_only(p)
    p.add_argument("-f", "--force", action="store_true",
                   help="Suspend journals even if they have local fragments")


async def _reset_head(ctx: Context, client: JournalClient, journal: str) -> bool:
    reader = Reader(client, pb.ReadRequest(journal=journal, offset=-1, block=False,
                                           metadata_only=True))
    try:
        async for _ in reader:
            pass
    except OffsetNotYetAvailable:
        pass
    except ClientError as err:
        ctx.log.error("failed to read head of journal", journal=journal, err=str(err))
        return False
    app = Appender(client, journal, offset=reader.response.offset,
                   suspend=pb.AppendRequest.SUSPEND_KEEP)
    try:
        await app.commit()
    except AppendError as err:
        if err.status == pb.WRONG_APPEND_OFFSET:
            ctx.log.info("did not reset (raced writes)", journal=journal)
            return True
        ctx.log.error("failed to reset journal offset", journal=journal, err=str(err))
        return False
    except ClientError as err:
        ctx.log.error("failed to reset journal offset", journal=journal, err=str(err))
        return False
    ctx.log.info("reset write head", journal=journal)
    return True


async def cmd_reset_head(ctx: Context) -> None:
    async with ctx.client() as client:
        resp = await _list(client, ctx.args.selector, "failed to resolve journals from selector")
        names = [j.spec.name for j in resp.journals if not _suspended_fully(j)]
        ok = await asyncio.gather(*(_reset_head(ctx, client, n) for n in names))
    if not all(ok):
        raise CommandError("failed to reset the head of some journals",
                           failed=sum(1 for x in ok if not x))


async def cmd_suspend(ctx: Context) -> None:
    mode = pb.AppendRequest.SUSPEND_NOW if ctx.args.force else pb.AppendRequest.SUSPEND_IF_FLUSHED

    async with ctx.client() as client:
        resp = await _list(client, ctx.args.selector, "failed to resolve journals from selector")

        async def one(journal: str) -> None:
            app = Appender(client, journal, suspend=mode)
            try:
                r = await app.commit()
                status = r.status
            except AppendError as err:
                if err.status != pb.SUSPENDED:
                    raise CommandError(f"failed to suspend journal {journal}",
                                       err=str(err)) from None
                status = err.status
            except ClientError as err:
                raise CommandError(f"failed to suspend journal {journal}", err=str(err)) from None
            ctx.log.info("journal suspension status", journal=journal,
                         status=pb.Status.Name(status))

        await asyncio.gather(*(one(j.spec.name) for j in resp.journals
                               if not _suspended_fully(j)))


# --- registry -----------------------------------------------------------------------------

Command = tuple[str, str, Callable[[argparse.ArgumentParser], None],
                Callable[[Context], Coroutine[Any, Any, None]]]

COMMANDS: dict[str, Command] = {
    "append": ("Append journal content", """\
Append content to one or more journals.

A label --selector is required, and determines the set of journals which are appended
(it is listed again every few seconds while appending, so journals may come and go).

If --framing 'none', then --mapping must be 'random' and the whole input is atomically
appended to a random journal of the selector (--selector name=my/journal picks one).

If --framing 'lines', records are read from the input line by line; each is mapped to a
journal and appended atomically, and records mapped to one journal keep their relative
order. --framing 'fixed' works alike with records delimited by a leading fixed-framing
header. Newlines and fixed-framing headers are kept in the appended records.

If --mapping 'random', each record goes to a random journal. If --mapping 'modulo' or
'rendezvous', each record is preceded by its partition key written with the same framing
(for 'lines': 'A-Partition-Key\\nA-Record\\n'); the key maps the record that follows
(FNV-1a modulo the journal count, or highest-random-weight hashing). Give binary keys
under 'lines' base64-encoded, with --base64. If --mapping 'direct', each record is
preceded by the name of its journal, which must be a current journal of the selector.

Use --log.level=debug to see each mapping decision.

Examples:
  gazctl journals append -l name=my/journal -i ./fizzbuzz
  gazctl attach-uuids rides.csv | awk -F, '{print $13}{print}' \\
    | gazctl journals append -l my-label --framing lines --mapping modulo
""", _append_flags, cmd_append),
    "apply": ("Apply journal specifications", """\
Apply a collection of JournalSpec creations, updates, or deletions, given as a YAML
journal hierarchy (the format of "journals list -o yaml"). Each journal's "revision" must
match its current etcd revision (0 or absent creates, -1 skips the check), else nothing is
applied. Set "delete: true" on a journal or a parent to delete.
""", _apply_flags, cmd_apply),
    "edit": ("Edit journal specifications", """\
Edit the journal specifications matching --selector in $EDITOR and apply the result.
Revisions are checked: if a journal changed since it was listed, nothing is applied.
""", _edit_flags, cmd_edit),
    "fragments": ("List journal fragments", """\
List fragments of selected journals, optionally restricted to those persisted within
[--from, --to) (unix seconds), with signed URLs when --url-ttl is given.
""", _fragments_flags, cmd_fragments),
    "list": ("List journals", """\
List journal specifications and status. Use --selector to restrict the listing; journal
selectors also support the meta-labels "name" and "prefix":
    --selector "name in (foo/bar, baz/bing)"
    --selector "prefix = my/prefix/"
Formats: table (see the column flags), yaml (a hierarchy "journals apply" accepts),
json and proto.
""", _add_list_flags, cmd_list),
    "prune": ("Deletes fragments older than the configured retention", """\
Delete fragments of matching journals from their stores once older than the journal's
fragment retention.
""", _prune_flags, cmd_prune),
    "read": ("Read journal contents", """\
Read the contents of one or more journals.

A label --selector is required, and determines the set of journals which are read.
Matched journals are read concurrently and their content is multiplexed into the output
(or stdout) in whole-fragment spans: so long as appends hold whole messages, so does the
merged output (no record is cut by another journal's content).

The selector is listed again periodically: reads start for journals that come to match
it and stop for those that no longer do (a journal matching again resumes where it
stopped). Reads end at the write head, or go on waiting for new content with --block,
until Ctrl-C or SIGTERM. --tail starts reads of journals not in --offsets at the write
head. --offsets gives initial offsets (a JSON object of journal to offset), and
--offsets-out receives the final ones on exit.

Examples:
  gazctl journals read -l name=my/journal
  gazctl journals read -l my-label --block --tail
""", _read_flags, cmd_read),
    "reset-head": ("Reset journal append offset (disaster recovery)", """\
Jump the append offset of journals forward to the largest offset of their fragment index,
so appends may proceed after brokers lost their replicated offset.
""", _selector_only, cmd_reset_head),
    "suspend": ("Suspend idle journals", """\
Suspend idle journals to use fewer or zero broker replicas.
""", _suspend_flags, cmd_suspend),
}

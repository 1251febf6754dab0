"""``gazctl journals fragments``: list journal fragments (Gazette's ``journals_fragments.go``).

Flags, help and output are Gazette's; see ``gazctl journals fragments --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from google.protobuf import text_format

from gazette.cli.gazctl.common import CommandError, Context, list_selected, suspended_fully
from gazette.cli.gazctl.output import (
    go_json,
    ibytes,
    json_line,
    reltime,
    render_table,
)
from gazette.client.errors import (
    ClientError,
)
from gazette.client.journal_client import JournalClient
from gazette.protocol import protocol_pb2 as pb


def fragments_flags(p: argparse.ArgumentParser) -> None:
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


async def fragments_of(client: JournalClient, journals: list[str], from_unix: int = 0,
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
        resp = await list_selected(client, a.selector)
        names = [j.spec.name for j in resp.journals if not suspended_fully(j)]
        responses = await fragments_of(client, names, a.from_unix, a.to_unix, ttl or None)
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

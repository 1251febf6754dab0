"""``gazctl journals prune``: deletes fragments older than the configured retention (Gazette's ``journals_prune.go``).

Flags, help and output are Gazette's; see ``gazctl journals prune --help``.
"""

from __future__ import annotations

import argparse
import time

from gazette.cli.gazctl.common import CommandError, Context, list_selected
from gazette.cli.gazctl.journals.fragments import fragments_of
from gazette.errors import GazetteError
from gazette.protocol import protocol_pb2 as pb


def prune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")
    p.add_argument("--dry-run", action="store_true", help="Perform a dry-run of the apply")
    p.add_argument("--file-root", default="", help="Filesystem path which roots file:// "
                   "fragment stores")


async def remove_fragment(spec: pb.Fragment, file_root: str | None) -> None:
    from gazette.fragment.fragment import Fragment
    from gazette.fragment.stores import store_for_url

    await store_for_url(spec.backing_store, file_root).remove(Fragment.from_proto(spec))


async def cmd_prune(ctx: Context) -> None:
    a = ctx.args
    async with ctx.client() as client:
        resp = await list_selected(client, a.selector)
        if not resp.journals:
            raise CommandError("no journals match selector", selector=a.selector)
        now = time.time()
        totals = {"journalsTotal": len(resp.journals), "journalsPruned": 0,
                  "fragmentsTotal": 0, "fragmentsPruned": 0, "bytesTotal": 0, "bytesPruned": 0}
        for j in resp.journals:
            retention = j.spec.fragment.retention.ToNanoseconds() / 1e9
            (frags,) = await fragments_of(client, [j.spec.name])
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
                        await remove_fragment(spec, a.file_root or None)
                    except (GazetteError, OSError, Exception) as err:
                        raise CommandError("error removing fragment", err=str(err),
                                           journal=spec.journal, begin=spec.begin) from None
                totals["fragmentsPruned"] += 1
                totals["bytesPruned"] += spec.end - spec.begin
            totals["journalsPruned"] += 1
            ctx.log.info("pruned journal", journal=j.spec.name, **totals)
        ctx.log.info("finished pruning all journals", **totals)

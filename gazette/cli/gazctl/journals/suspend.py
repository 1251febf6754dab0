"""``gazctl journals suspend``: suspend idle journals (Gazette's ``journals_suspend.go``).

Flags, help and output are Gazette's; see ``gazctl journals suspend --help``.
"""

from __future__ import annotations

import argparse
import asyncio

from gazette.cli.gazctl.common import (
    CommandError,
    Context,
    list_selected,
    selector_only,
    suspended_fully,
)
from gazette.client.appender import Appender
from gazette.client.errors import (
    AppendError,
    ClientError,
)
from gazette.protocol import protocol_pb2 as pb


def suspend_flags(p: argparse.ArgumentParser) -> None:
    selector_only(p)
    p.add_argument("-f", "--force", action="store_true",
                   help="Suspend journals even if they have local fragments")


async def cmd_suspend(ctx: Context) -> None:
    mode = pb.AppendRequest.SUSPEND_NOW if ctx.args.force else pb.AppendRequest.SUSPEND_IF_FLUSHED

    async with ctx.client() as client:
        resp = await list_selected(client, ctx.args.selector, "failed to resolve journals from selector")

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
                               if not suspended_fully(j)))

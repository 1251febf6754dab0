"""``gazctl journals reset-head``: reset journal append offset (disaster recovery) (Gazette's ``journals_reset_head.go``).

Flags, help and output are Gazette's; see ``gazctl journals reset-head --help``.
"""

from __future__ import annotations

import asyncio

from gazette.cli.gazctl.common import CommandError, Context, list_selected, suspended_fully
from gazette.client.appender import Appender
from gazette.client.errors import (
    AppendError,
    ClientError,
    OffsetNotYetAvailable,
)
from gazette.client.journal_client import JournalClient
from gazette.client.reader import Reader
from gazette.protocol import protocol_pb2 as pb


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
        resp = await list_selected(client, ctx.args.selector, "failed to resolve journals from selector")
        names = [j.spec.name for j in resp.journals if not suspended_fully(j)]
        ok = await asyncio.gather(*(_reset_head(ctx, client, n) for n in names))
    if not all(ok):
        raise CommandError("failed to reset the head of some journals",
                           failed=sum(1 for x in ok if not x))

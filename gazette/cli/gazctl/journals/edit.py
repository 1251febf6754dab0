"""``gazctl journals edit``: edit journal specifications (Gazette's ``journals_edit.go``).

Flags, help and output are Gazette's; see ``gazctl journals edit --help``.
"""

from __future__ import annotations

import argparse

from gazette.cli.gazctl.common import CommandError, Context, list_selected, selector_only
from gazette.cli.gazctl.edit_loop import edit_and_apply
from gazette.cli.gazctl.journals.apply import changes_from_yaml
from gazette.cli.gazctl.journals.list import journals_yaml
from gazette.client.errors import (
    ApplyError,
    ClientError,
)
from gazette.protocol import protocol_pb2 as pb


async def cmd_edit(ctx: Context) -> None:
    async with ctx.client() as client:
        resp = await list_selected(client, ctx.args.selector)
        if not resp.journals:
            raise CommandError("no journals match selector", selector=ctx.args.selector)

        async def apply(text: str) -> None:
            try:
                resp_apply = await client.apply(changes_from_yaml(text), ctx.args.max_txn_size)
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

        await edit_and_apply(ctx, "journal", journals_yaml(resp), changes_from_yaml, apply)


def edit_flags(p: argparse.ArgumentParser) -> None:
    selector_only(p)
    p.add_argument("--max-txn-size", type=int, default=0,
                   help="maximum number of specs to be processed within an apply transaction")

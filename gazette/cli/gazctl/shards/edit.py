"""``gazctl shards edit``: edit shard specifications in ``$EDITOR`` (Gazette's
``shards_edit.go``); revision-checked, so a shard changed meanwhile applies nothing."""

from __future__ import annotations

import argparse

from gazette.cli.gazctl.common import Context
from gazette.cli.gazctl.edit_loop import edit_and_apply
from gazette.cli.gazctl.shards.apply import apply_changes, changes_from_yaml
from gazette.cli.gazctl.shards.list import list_shards, shards_yaml


def edit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")
    p.add_argument("--max-txn-size", type=int, default=0,
                   help="maximum number of specs to be processed within an apply transaction")


async def cmd_edit(ctx: Context) -> None:
    async with ctx.shard_client() as client:
        resp = await list_shards(client, ctx.args.selector)
        if not resp.shards:
            from gazette.cli.gazctl.common import CommandError

            raise CommandError("no shards match selector", selector=ctx.args.selector)

        async def apply(text: str) -> None:
            await apply_changes(ctx, client, changes_from_yaml(text))

        await edit_and_apply(ctx, "shard", shards_yaml(resp), changes_from_yaml, apply)

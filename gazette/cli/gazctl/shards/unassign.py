"""``gazctl shards unassign``: remove shard assignments (Gazette's ``shards_unassign.go``), so
the allocator re-assigns them shortly: restarts failed shards, or moves shards off a process."""

from __future__ import annotations

import argparse

from gazette.cli.gazctl.common import CommandError, Context
from gazette.cli.gazctl.shards.list import list_shards
from gazette.client.errors import ClientError
from gazette.consumer.client import ShardStatusError
from gazette.protocol import consumer_pb2 as pc

_CHUNK = 100


def unassign_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")
    p.add_argument("--failed", action="store_true",
                   help="Only remove assignments from failed shards")
    p.add_argument("--dry-run", action="store_true",
                   help="Perform a dry-run, printing matching shards")


async def cmd_unassign(ctx: Context) -> None:
    a = ctx.args
    async with ctx.shard_client() as client:
        listed = await list_shards(client, a.selector)
        by_id = {sh.spec.id: sh for sh in listed.shards}
        ids = [sh.spec.id for sh in listed.shards
               if not a.failed or any(st.code == pc.ReplicaStatus.FAILED for st in sh.status)]
        for start in range(0, len(ids), _CHUNK):
            try:
                resp = await client.unassign(ids[start:start + _CHUNK], only_failed=a.failed,
                                             dry_run=a.dry_run)
            except (ClientError, ShardStatusError) as err:
                raise CommandError("failed to unassign shards", err=str(err)) from None
            for shard_id in resp.shards:
                sh = by_id[shard_id]
                ctx.log.info("would unassign shard" if a.dry_run else "unassigned shard",
                             id=shard_id,
                             status=",".join(pc.ReplicaStatus.Code.Name(s.code) for s in sh.status),
                             members=",".join(f"{m.zone}#{m.suffix}" for m in sh.route.members))

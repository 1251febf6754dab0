"""``gazctl shards recover``: plays a shard's recovery log into a directory, to inspect its
store as of the log's write head (Gazette's ``shards_recover.go``).

The shard's spec comes from List (``id`` selector), its hints from GetHints (primary, else the
first backup), and the player finishes at the write head: it reads, never appends, so it never
fences the live primary. The directory must not exist or be empty: playback owns it, and a
failed playback removes what it wrote.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from gazette.cli.gazctl.common import CommandError, Context
from gazette.cli.gazctl.shards.list import list_shards
from gazette.client.errors import ClientError
from gazette.consumer.client import ShardStatusError

if TYPE_CHECKING:
    from gazette.recoverylog import PlaybackProgress


def recover_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", required=True, help="Shard ID")
    p.add_argument("-d", "--dir", required=True, help="Directory to write the played recovery log into")


def _usable(path: str) -> bool:
    return not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path))


async def cmd_recover(ctx: Context) -> None:
    # The recovery log is imported by the commands that read one, not by every gazctl start.
    from gazette.consumer.recovery import new_player, pick_first_hints, recovery_log  # noqa: PLC0415
    from gazette.recoverylog import RecoveryLogError  # noqa: PLC0415

    a = ctx.args
    if not _usable(a.dir):
        raise CommandError("--dir exists and is not an empty directory (playback owns it)", dir=a.dir)
    async with ctx.shard_client() as shards:
        listed = await list_shards(shards, f"id={a.id}")
        if len(listed.shards) != 1:
            raise CommandError("no shard exists with the given id", id=a.id)
        spec = listed.shards[0].spec
        if not spec.recovery_log_prefix:
            raise CommandError("shard has no recovery log (its spec sets no recovery_log_prefix)", id=a.id)
        try:
            resp = await shards.get_hints(a.id)
        except (ClientError, ShardStatusError) as err:
            raise CommandError("failed to fetch hints for shard", id=a.id, err=str(err)) from None
    hints = pick_first_hints(resp, recovery_log(spec))
    ctx.log.debug("fetched shard recovery hints", id=a.id, log=hints.log,
                  live_files=len(hints.live_nodes))

    def progress(p: PlaybackProgress) -> None:
        ctx.log.info("playing recovery log", id=a.id, progress=p.describe())

    async with ctx.client() as client:
        player = await new_player(client, spec, hints, directory=a.dir, on_progress=progress)
        player.finish_at_write_head()
        try:
            fsm = await player.play()
        except RecoveryLogError as err:
            raise CommandError("failed to play recoverylog", id=a.id, err=str(err)) from None
    ctx.log.info("recovered shard store", id=a.id, dir=player.dir, log=hints.log,
                 offset=player.write_head, files=len(fsm.live_nodes))

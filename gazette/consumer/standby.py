"""A shard's hot standby in this process (Gazette's ``consumer/shard.go``, standby half).

A process assigned a shard in a slot other than 0 is one of its standbys. A shard without a
recovery log has nothing to follow, and its replica is reported STANDBY at once. A shard with
one runs a ``StandbyReplica``: it writes BACKFILL, starts a player of the shard's log from its
hints into a fresh directory, writes STANDBY when playback first reaches the log's write head,
and then tails the log, re-enacting each transaction the primary records, until it is
promoted or leaves.

Invariants:

* Promotion hands the player over (``release``), still playing: the new primary's recovery
  injects its hand-off into that player, reads only what the standby had not yet read, and the
  standby's directory becomes the primary's store. Nothing is replayed from the start.
* A replica that leaves (not promoted) cancels its playback and removes its directory.
* A failed playback (a corrupt log, a missing one) is written FAILED on the replica's
  assignment with the error, naming the offset; the replica's directory is removed.
"""

from __future__ import annotations

import asyncio
import logging

from gazette.client import JournalClient
from gazette.consumer.recovery import HintsStore, RecoveryError, new_player
from gazette.consumer.shard import StatusWriter
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import Player
from gazette.tasks import wait_first

__all__ = ["StandbyReplica"]

log = logging.getLogger(__name__)


class StandbyReplica:
    """A hot standby of a recording shard (BACKFILL → STANDBY, until promoted or gone)."""

    def __init__(self, spec: pc.ShardSpec, client: JournalClient, hints: HintsStore,
                 write_status: StatusWriter, *, root: str | None = None) -> None:
        self.spec = spec
        self.client = client
        self.hints = hints
        self._write_status = write_status
        self._root = root
        self.player: Player | None = None

    def release(self) -> Player | None:
        """Takes the player (still playing) for the promoted primary; the replica's task, when
        cancelled next, leaves it alone. None when playback had not started yet."""
        player, self.player = self.player, None
        return player

    async def run(self) -> None:
        sid = self.spec.id
        try:
            await self._write_status(sid, pc.ReplicaStatus(code=pc.ReplicaStatus.BACKFILL))
            player = self.player = await new_player(self.client, self.spec, await self.hints.pick(),
                                                    root=self._root)
            playing = player.start()
            await wait_first(playing, player.tailing.wait())
            if playing.done():
                playing.result()  # a PlaybackError, with the log and offset
                raise RecoveryError(f"shard {sid}: standby playback ended unasked")
            log.info("shard standby is tailing its recovery log", extra={
                "shard": sid, "log": player.hints.log, "offset": player.write_head})
            await self._write_status(sid, pc.ReplicaStatus(code=pc.ReplicaStatus.STANDBY))
            # Until promoted (the player is released, then this task cancelled) or gone.
            await asyncio.shield(playing)
            raise RecoveryError(f"shard {sid}: standby playback ended unasked")
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the replica fails alone, with the error's text
            log.warning("shard standby failed", extra={"shard": sid, "err": str(err)})
            await self._write_status(sid, pc.ReplicaStatus(
                code=pc.ReplicaStatus.FAILED, errors=[f"{type(err).__name__}: {err}"]))
        finally:
            if self.player is not None:
                await self.player.aclose()

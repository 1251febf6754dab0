"""``gazctl shards prune``: deletes recovery-log fragments that no live file of any selected
shard's store still needs (Gazette's ``shards_prune.go``).

A recovery log holds every write a store ever made, compactions included; a player only reads
the segments its hints name, then everything after the last one. So a fragment can go when it
overlaps no segment of any hints (primary and every backup) of any shard whose hints reference
its log; the last segment of each hints is open-ended, covering the log's tail.

Invariants (why it never deletes what a recovery needs):

* A log is pruned only if *every* selected shard referencing it has all its hints (primary and
  each backup) present with live files; otherwise the log is skipped, with the reason.
* Segments are folded per log they name, so a log forked from another (hints whose early
  segments name the parent log) keeps the parent's fragments its children still need: select
  all shards of a forked history together.
* A fragment overlapping no segment at the log's tail, not yet persisted (a broker's spool),
  means the selector missed a shard writing that log: nothing more is deleted and the command
  fails. Earlier unpersisted fragments (closed, awaiting persistence) are left for a later run.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING

from gazette.cli.gazctl.common import CommandError, Context
from gazette.cli.gazctl.journals.fragments import fragments_of
from gazette.cli.gazctl.journals.prune import remove_fragment
from gazette.cli.gazctl.shards.list import list_shards
from gazette.client.errors import ClientError
from gazette.consumer.client import ShardStatusError
from gazette.errors import GazetteError
from gazette.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    from gazette.recoverylog import FSMHints, Segment


def prune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", required=True, help="Label Selector query to filter on")
    p.add_argument("--dry-run", action="store_true", help="Perform a dry-run of the prune")
    p.add_argument("--file-root", default="", help="Filesystem path which roots file:// fragment stores")


def fold_hints(hints: FSMHints, sets: dict[str, list[Segment]]) -> None:
    """Adds the segments ``hints`` need to ``sets`` (by log), the last one open-ended: playback
    reads everything after it."""
    from gazette.recoverylog.fsm import live_log_segments  # noqa: PLC0415 - see cmd_prune

    _, segments = live_log_segments(hints)
    segs = list(segments)
    segs[-1] = replace(segs[-1], last_offset=0)
    for seg in segs:
        sets[seg.log].append(seg)


def overlaps(segments: list[Segment], frag: pb.Fragment) -> bool:
    """Whether ``frag`` holds any byte of any segment (a zero offset is open-ended)."""
    return any((seg.first_offset < frag.end or frag.end == 0) and
               (seg.last_offset > frag.begin or seg.last_offset == 0) for seg in segments)


async def cmd_prune(ctx: Context) -> None:
    # The recovery log is imported by the commands that read one, not by every gazctl start.
    from gazette.consumer.recovery import recovery_log  # noqa: PLC0415
    from gazette.recoverylog import FSMHints  # noqa: PLC0415

    a = ctx.args
    sets: dict[str, list[Segment]] = defaultdict(list)
    skip: dict[str, str] = {}
    totals = {"shardsTotal": 0, "fragmentsTotal": 0, "fragmentsPruned": 0, "bytesTotal": 0,
              "bytesPruned": 0, "skippedJournals": 0}
    async with ctx.shard_client() as shards:
        for sh in (await list_shards(shards, a.selector)).shards:
            totals["shardsTotal"] += 1
            log = recovery_log(sh.spec)
            if not log:
                continue
            try:
                resp = await shards.get_hints(sh.spec.id)
            except (ClientError, ShardStatusError) as err:
                raise CommandError("failed to fetch hints", shard=sh.spec.id, err=str(err)) from None
            for rh in [*resp.backup_hints, resp.primary_hints]:
                hints = FSMHints.from_proto(rh.hints) if rh.HasField("hints") else None
                if hints is None or not hints.live_nodes:
                    reason = "hints have no live files" if hints is not None else \
                        "has not written all hints required for pruning"
                    ctx.log.debug("will skip pruning recovery log journal", shard=sh.spec.id,
                                  reason=reason, journal=log)
                    skip.setdefault(log, f"shard {sh.spec.id} {reason}")
                    break
                try:
                    fold_hints(hints, sets)
                except GazetteError as err:
                    raise CommandError("unable to fetch hint segments", shard=sh.spec.id, err=str(err)) from None
    async with ctx.client() as client:
        for journal in sorted(sets):
            if journal in skip:
                totals["skippedJournals"] += 1
                ctx.log.warn("skipping journal because a shard is missing hints that cover it",
                             journal=journal, reason=skip[journal])
                continue
            (frags,) = await fragments_of(client, [journal])
            pruned = 0
            tail = max((f.spec.end for f in frags.fragments), default=0)
            for f in frags.fragments:
                spec = f.spec
                totals["fragmentsTotal"] += 1
                totals["bytesTotal"] += spec.end - spec.begin
                if overlaps(sets[journal], spec):
                    continue
                if not spec.backing_store:
                    if spec.end == tail:  # the log is still written past every hinted segment
                        raise CommandError(
                            "unpersisted fragment does not overlap any hinted segments (the label "
                            "selector argument does not include all shards using this log)",
                            journal=journal, begin=spec.begin, end=spec.end)
                    ctx.log.debug("skipping fragment not yet persisted", journal=journal,
                                  begin=spec.begin, end=spec.end)
                    continue
                ctx.log.info("pruning fragment", journal=journal, begin=spec.begin, end=spec.end,
                             size=spec.end - spec.begin, mod=spec.mod_time, dry_run=a.dry_run)
                if not a.dry_run:
                    try:
                        await remove_fragment(spec, a.file_root or None)
                    except (GazetteError, OSError) as err:
                        raise CommandError("failed to remove fragment", journal=journal,
                                           begin=spec.begin, err=str(err)) from None
                pruned += 1
                totals["fragmentsPruned"] += 1
                totals["bytesPruned"] += spec.end - spec.begin
            ctx.log.info("finished pruning log", journal=journal, pruned=pruned, **totals)
    ctx.log.info("finished pruning logs for all shards", **totals)

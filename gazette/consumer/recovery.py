"""Recovering a shard's embedded store from its recovery log, and keeping its hints
(Gazette's ``consumer/recovery.go``).

A shard whose spec has a ``recovery_log_prefix`` records its store into the journal
``{recovery_log_prefix}/{shard id}``. Its hints live in etcd: ``{hint_prefix}/{id}.primary``
(written by the primary as it records: after recovery, every ``hint_interval`` and when the
shard leaves the process) and ``.backup.0..N-1`` (on each recovery the recovered hints are
pushed in front, shifting older ones back), so a player can start from an older hint when a
newer one is bad. Every hint write is conditioned on this process's assignment still existing
(its create revision), so a process that lost the shard never overwrites its successor's hints.

Invariants:

* ``recover`` returns a ``Recorder`` only after its hand-off no-op was read back as applied:
  from then on the previous owner's appends fail REGISTER_MISMATCH.
* The log must exist and be labelled ``content-type: application/x-gazette-recoverylog``;
  hints must name the shard's log; else recovery fails naming what is wrong.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Callable
from typing import Any

import aetcd

from gazette.client import JournalClient, get_journal
from gazette.consumer.errors import ConsumerError
from gazette.consumer.interfaces import Assignment
from gazette.etcd import txn
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import (
    CONTENT_TYPE,
    FSMHints,
    PlaybackProgress,
    Player,
    PlayerState,
    Recorder,
    hint_keys,
    take_over,
)

__all__ = ["HintsStore", "RecoveryError", "new_player", "pick_first_hints", "recover", "recovery_log"]

log = logging.getLogger(__name__)


class RecoveryError(ConsumerError):
    """The shard's store cannot be recovered (a missing or mislabelled log, bad hints)."""


def recovery_log(spec: pc.ShardSpec) -> str:
    return f"{spec.recovery_log_prefix}/{spec.id}" if spec.recovery_log_prefix else ""


class HintsStore:
    def __init__(self, etcd: aetcd.Client, spec: pc.ShardSpec) -> None:
        self.etcd = etcd
        self.log = recovery_log(spec)
        self.primary, self.backups = hint_keys(spec.hint_prefix, spec.id, spec.hint_backups)

    async def fetch(self) -> list[tuple[FSMHints | None, int]]:
        """(hints or None, mod revision) of the primary key, then each backup key."""
        out: list[tuple[FSMHints | None, int]] = []
        for key in [self.primary, *self.backups]:
            kv = await self.etcd.get(key.encode())
            if kv is None:
                out.append((None, 0))
                continue
            hints = FSMHints.decode(kv.value)
            if hints.log != self.log:
                raise RecoveryError(f"hints at {key} name log {hints.log}, not the shard's {self.log}")
            out.append((hints, kv.mod_revision))
        return out

    async def pick(self) -> FSMHints:
        """The first hints present (primary, then backups), or empty hints of the log."""
        for hints, _ in await self.fetch():
            if hints is not None:
                return hints
        return FSMHints(log=self.log)

    async def store_recorded(self, hints: FSMHints, assignment: Assignment) -> bool:
        resp = await txn.commit(self.etcd, [txn.Cmp(assignment.key, "create", assignment.create_revision)],
                                [txn.Put(self.primary, hints.to_json())])
        return bool(resp.succeeded)

    async def store_recovered(self, hints: FSMHints, assignment: Assignment) -> bool:
        """Pushes ``hints`` in front of the backups (and writes them as primary, too)."""
        fetched = (await self.fetch())[1:]
        cmps = [txn.Cmp(assignment.key, "create", assignment.create_revision)]
        ops: list[txn.Op] = [txn.Put(self.primary, hints.to_json())]
        value: bytes | None = hints.to_json()
        for key, (old, rev) in zip(self.backups, fetched, strict=True):
            if value is None:
                break
            cmps.append(txn.Cmp(key, "mod", rev))
            ops.append(txn.Put(key, value))
            value = old.to_json() if old is not None else None
        resp = await txn.commit(self.etcd, cmps, ops)
        return bool(resp.succeeded)

    async def response(self) -> pc.GetHintsResponse:
        resp = pc.GetHintsResponse(status=pc.Status.OK)
        fetched = await self.fetch()
        if fetched[0][0] is not None:
            resp.primary_hints.hints.CopyFrom(fetched[0][0].to_proto())
        for hints, _ in fetched[1:]:
            rh = resp.backup_hints.add()
            if hints is not None:
                rh.hints.CopyFrom(hints.to_proto())
        return resp


def pick_first_hints(resp: pc.GetHintsResponse, log: str) -> FSMHints:
    """The primary hints of a GetHints response if present, else its first backup hints, else
    empty hints of ``log`` (Gazette's ``PickFirstHints``); hints must name ``log``."""
    found = [resp.primary_hints] if resp.primary_hints.HasField("hints") else []
    found += [b for b in resp.backup_hints if b.HasField("hints")]
    if not found:
        return FSMHints(log=log)
    hints = FSMHints.from_proto(found[0].hints)
    if hints.log != log:
        raise RecoveryError(f"hints name log {hints.log}, not the shard's {log}")
    return hints


def _report(shard: str) -> Any:
    def report(p: PlaybackProgress) -> None:
        if p.state is PlayerState.TAIL:  # a standby following the head: not news every 5 s
            log.debug("standby of shard %s tailing: %s", shard, p.describe(), extra={"shard": shard})
        else:
            log.info("recovering shard %s: %s", shard, p.describe(), extra={"shard": shard})
    return report


async def new_player(client: JournalClient, spec: pc.ShardSpec, hints: FSMHints, *,
                     root: str | None = None, directory: str | None = None,
                     on_progress: Callable[[PlaybackProgress], None] | None = None) -> Player:
    """A player of the shard's log into a fresh directory (``directory``, or a new one under
    ``root``), after checking the log's spec."""
    name = recovery_log(spec)
    try:
        jspec = await get_journal(client, name)
    except Exception as err:  # noqa: BLE001 - any failure to fetch the spec ends recovery, named
        raise RecoveryError(f"shard {spec.id}: recovery log {name}: {err}") from None
    labels = {lbl.name: lbl.value for lbl in jspec.spec.labels.labels}
    if labels.get("content-type") != CONTENT_TYPE:
        raise RecoveryError(f"shard {spec.id}: recovery log {name} has content-type "
                            f"{labels.get('content-type', '(none)')!r}, expected {CONTENT_TYPE}")
    if directory is None:
        directory = tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9_.-]", "_", spec.id) + "-", dir=root)
    return Player(client, hints, directory, on_progress=on_progress or _report(spec.id))


async def recover(player: Player, spec: pc.ShardSpec) -> Recorder:
    """The shard's recorder, once ``player`` reached the head and handed the log off."""
    recorder = await take_over(player)
    log.info("shard store recovered", extra={"shard": spec.id, "dir": player.dir,
                                             "author": f"{recorder.author:08x}",
                                             "files": len(recorder.fsm.live_nodes)})
    return recorder

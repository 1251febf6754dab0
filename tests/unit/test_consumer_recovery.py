"""consumer/recovery.py: the shard's log name, hints picked from a GetHints response, hints kept
in etcd (rotated backups, writes conditioned on the assignment), and the player's checks of the
log, as case tables (Gazette's ``recovery_test.go``). Hints live in a real etcd (the ``etcd``
fixture, a prefix of the test's own); logs in the in-process fake broker."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import gazette
from gazette.consumer.interfaces import Assignment
from gazette.consumer.recovery import (
    HintsStore,
    RecoveryError,
    new_player,
    pick_first_hints,
    recovery_log,
)
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import CONTENT_TYPE, FSMHints
from gazette.testing.etcd import EtcdFixture
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

LOG = "recovery/logs/shard-a"


def hints(version: str, log: str = LOG) -> FSMHints:
    return FSMHints(log=log, properties={"/version": version})


def spec(prefix: str = "recovery/logs", backups: int = 2, hint_prefix: str = "/hints") -> pc.ShardSpec:
    return pc.ShardSpec(id="shard-a", recovery_log_prefix=prefix, hint_prefix=hint_prefix,
                        hint_backups=backups)


@pytest.mark.parametrize(("prefix", "expect"), [
    ("recovery/logs", "recovery/logs/shard-a"),
    ("", ""),  # no recovery log: the store is not recorded
])
def test_recovery_log_names(prefix: str, expect: str) -> None:
    assert recovery_log(spec(prefix)) == expect


def response(primary: FSMHints | None, *backups: FSMHints | None) -> pc.GetHintsResponse:
    resp = pc.GetHintsResponse(status=pc.Status.OK)
    if primary is not None:
        resp.primary_hints.hints.CopyFrom(primary.to_proto())
    for b in backups:
        rh = resp.backup_hints.add()
        if b is not None:
            rh.hints.CopyFrom(b.to_proto())
    return resp


@pytest.mark.parametrize(("resp", "expect"), [
    (response(hints("p"), hints("b0")), hints("p")),  # the primary first
    (response(None, None, hints("b1")), hints("b1")),  # else the first backup present
    (response(None, hints("b0"), hints("b1")), hints("b0")),
    (response(None, None, None), FSMHints(log=LOG)),  # else empty hints of the log
    (response(None), FSMHints(log=LOG)),
    (response(hints("p", log="other/log")), "hints name log other/log, not the shard's " + LOG),
    (response(None, hints("b0", log="other/log")), "hints name log other/log"),
], ids=["primary", "second-backup", "first-backup", "none", "no-backups", "wrong-log", "wrong-log-backup"])
def test_pick_first_hints(resp: pc.GetHintsResponse, expect: FSMHints | str) -> None:
    if isinstance(expect, str):
        with pytest.raises(RecoveryError, match=expect):
            pick_first_hints(resp, LOG)
    else:
        assert pick_first_hints(resp, LOG) == expect


async def assignment(etcd: EtcdFixture) -> Assignment:
    key = f"{etcd.prefix}/assign/shard-a#zone#member#0"
    resp = await etcd.client.put(key.encode(), b"")
    return Assignment(key=key, create_revision=resp.header.revision)


# Each case: the hints written as recovered, in order; then what primary and backups hold.
ROTATIONS = [
    (["1"], "1", ["1", None]),
    (["1", "2"], "2", ["2", "1"]),
    (["1", "2", "3"], "3", ["3", "2"]),  # the oldest falls off the end
]


@pytest.mark.parametrize(("recovered", "primary", "backups"), ROTATIONS)
async def test_recovered_hints_rotate_through_the_backups(
        etcd: EtcdFixture, recovered: list[str], primary: str, backups: list[str | None]) -> None:
    store = HintsStore(etcd.client, spec(hint_prefix=etcd.prefix + "/hints"))
    asn = await assignment(etcd)
    for v in recovered:
        assert await store.store_recovered(hints(v), asn)
    fetched = await store.fetch()
    got = [h.properties["/version"] if h is not None else None for h, _ in fetched]
    assert got == [primary, *backups]
    assert await store.pick() == hints(primary)
    resp = await store.response()
    assert pick_first_hints(resp, LOG) == hints(primary)
    assert [pick_first_hints(pc.GetHintsResponse(primary_hints=b), LOG) if b.HasField("hints") else None
            for b in resp.backup_hints] == [hints(v) if v else None for v in backups]


@pytest.mark.parametrize("write", ["store_recorded", "store_recovered"])
async def test_hint_writes_are_conditioned_on_the_assignment(etcd: EtcdFixture, write: str) -> None:
    store = HintsStore(etcd.client, spec(hint_prefix=etcd.prefix + "/hints"))
    asn = await assignment(etcd)
    assert await getattr(store, write)(hints("mine"), asn)
    # The assignment is gone (this process lost the shard) or re-created (another owner).
    await etcd.client.delete(asn.key.encode())
    assert not await getattr(store, write)(hints("stale"), asn)
    await etcd.client.put(asn.key.encode(), b"")
    assert not await getattr(store, write)(hints("stale"), asn)
    assert await store.pick() == hints("mine")


async def test_an_empty_hints_store_picks_empty_hints_and_refuses_another_logs(etcd: EtcdFixture) -> None:
    store = HintsStore(etcd.client, spec(hint_prefix=etcd.prefix + "/hints"))
    assert await store.pick() == FSMHints(log=LOG)
    assert await store.fetch() == [(None, 0)] * 3
    await etcd.client.put(store.backups[1].encode(), hints("x", log="other/log").to_json())
    with pytest.raises(RecoveryError, match=f"hints at {store.backups[1]} name log other/log"):
        await store.pick()


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create(LOG, {"content-type": CONTENT_TYPE})
    cluster.create("recovery/logs/shard-json", {"content-type": "application/x-ndjson"})
    cluster.create("recovery/logs/shard-bare")
    b = await start_broker(cluster)
    yield b
    await b.stop()


@pytest.mark.parametrize(("shard", "error"), [
    ("shard-a", None),
    ("shard-missing", "shard shard-missing: recovery log recovery/logs/shard-missing: "),
    ("shard-json", "has content-type 'application/x-ndjson', expected " + CONTENT_TYPE),
    ("shard-bare", "has content-type '\\(none\\)'"),
])
async def test_new_player_checks_the_log(broker: FakeBroker, tmp_path: Path, shard: str,
                                         error: str | None) -> None:
    s = spec()
    s.id = shard
    async with gazette.JournalClient(broker.endpoint) as client:
        if error is not None:
            with pytest.raises(RecoveryError, match=error):
                await new_player(client, s, FSMHints(log=recovery_log(s)), root=str(tmp_path))
            assert os.listdir(tmp_path) == []  # nothing made for a refused log
            return
        player = await new_player(client, s, FSMHints(log=LOG), root=str(tmp_path))
        try:
            assert Path(player.dir).parent == tmp_path and Path(player.dir).name.startswith("shard-a-")
            assert player.hints == FSMHints(log=LOG)
        finally:
            await player.aclose()
        assert os.listdir(tmp_path) == []  # the player removed its directory

"""A leader's State built with an EntryCache kept across rounds equals one decoded afresh,
through random histories of items, members and assignments changing; entries unchanged since
the last round are re-used, not decoded again; the leader's yielding extraction reads one
snapshot however the keyspace changes while it pauses."""

from __future__ import annotations

import asyncio

import pytest
from consumer_cluster import LOCAL, LOCAL_ENDPOINT, REMOTE, REMOTE_ENDPOINT, MemoryEtcd
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.allocator import state as state_module
from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.allocator.specs import journal_is_consistent
from gazette.allocator.state import EntryCache, State
from gazette.broker.keys import broker_decoder
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import protocol_pb2 as pb

ROOT = "/gazette/test"
NAMES = [f"j/{i}" for i in range(6)]


def _member(pid: pb.ProcessSpec.ID, endpoint: str, limit: int) -> tuple[str, bytes]:
    spec = pb.BrokerSpec(journal_limit=limit)
    spec.process_spec.id.CopyFrom(pid)
    spec.process_spec.endpoint = endpoint
    return members_key(ROOT, pid.zone, pid.suffix), spec.SerializeToString()


def _summary(s: State) -> object:
    return (s.revision, [e.key for e in s.items], [(e.key, e.decoded) for e in s.members],
            [(e.key, e.mod_revision) for e in s.assignments], s.network_key, s.member_total, s.member_primary,
            [(li.item.key, li.index) for li in s.local_items], s.zones, s.zone_slots, s.item_slots,
            s.member_slots)


op = st.tuples(st.sampled_from(["item", "drop", "assign", "unassign", "limit"]), st.sampled_from(NAMES),
               st.booleans(), st.integers(0, 2))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(op, min_size=1, max_size=4), min_size=1, max_size=10))
def test_cached_rounds_equal_fresh_ones(batches: list[list[tuple[str, str, bool, int]]]) -> None:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    etcd = MemoryEtcd(ks)
    etcd.write([_member(LOCAL, LOCAL_ENDPOINT, 10), _member(REMOTE, REMOTE_ENDPOINT, 10)])
    local_key = members_key(ROOT, LOCAL.zone, LOCAL.suffix)
    cache = EntryCache()
    for batch in batches:
        ops: dict[str, bytes | None] = {}
        for kind, name, local, n in batch:
            pid = LOCAL if local else REMOTE
            if kind == "item":
                ops[items_key(ROOT, name)] = pb.JournalSpec(name=name, replication=1 + n % 2).SerializeToString()
            elif kind == "drop":
                ops[items_key(ROOT, name)] = None
            elif kind == "assign":
                ops[assignment_key(ROOT, name, pid.zone, pid.suffix, n % 2)] = b""
            elif kind == "unassign":
                ops[assignment_key(ROOT, name, pid.zone, pid.suffix, n % 2)] = None
            else:
                key, value = _member(pid, LOCAL_ENDPOINT if local else REMOTE_ENDPOINT, 5 + n)
                ops[key] = value
        etcd.write(ops.items())
        cached = State.from_keyspace(ks, local_key, journal_is_consistent, cache=cache)
        fresh = State.from_keyspace(ks, local_key, journal_is_consistent)
        assert _summary(cached) == _summary(fresh)


def test_unchanged_entries_are_reused() -> None:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    etcd = MemoryEtcd(ks)
    etcd.write([_member(LOCAL, LOCAL_ENDPOINT, 10),
                (items_key(ROOT, "j/a"), pb.JournalSpec(name="j/a", replication=1).SerializeToString()),
                (items_key(ROOT, "j/b"), pb.JournalSpec(name="j/b", replication=1).SerializeToString())])
    local_key = members_key(ROOT, LOCAL.zone, LOCAL.suffix)
    cache = EntryCache()
    first = State.from_keyspace(ks, local_key, journal_is_consistent, cache=cache)
    etcd.write([(items_key(ROOT, "j/b"), pb.JournalSpec(name="j/b", replication=2).SerializeToString())])
    second = State.from_keyspace(ks, local_key, journal_is_consistent, cache=cache)
    assert second.items[0] is first.items[0]  # j/a: unchanged, the same entry
    assert second.items[1] is not first.items[1] and second.items[1].decoded.replication == 2


async def test_yielding_extraction_reads_one_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "YIELD_EVERY", 2)  # pause often,
    monkeypatch.setattr(state_module, "HOLD_AT_MOST", 0.0)  # and yield at every pause
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    etcd = MemoryEtcd(ks)
    etcd.write([_member(LOCAL, LOCAL_ENDPOINT, 10), _member(REMOTE, REMOTE_ENDPOINT, 10)])
    etcd.write([(items_key(ROOT, n), pb.JournalSpec(name=n, replication=2).SerializeToString())
                for n in NAMES])
    etcd.write([(assignment_key(ROOT, n, LOCAL.zone, LOCAL.suffix, 0), b"") for n in NAMES[:4]])
    local_key = members_key(ROOT, LOCAL.zone, LOCAL.suffix)
    before = State.from_keyspace(ks, local_key, journal_is_consistent)

    task = asyncio.create_task(State.from_keyspace_yielding(ks, local_key, journal_is_consistent,
                                                            cache=EntryCache()))
    await asyncio.sleep(0)  # one step of the task: it read the keyspace and paused
    assert not task.done()
    etcd.write([(items_key(ROOT, "j/new"), pb.JournalSpec(name="j/new", replication=1).SerializeToString()),
                (assignment_key(ROOT, NAMES[0], LOCAL.zone, LOCAL.suffix, 0), None)])
    assert _summary(await task) == _summary(before)  # the snapshot at the call, not a mix
    after = await State.from_keyspace_yielding(ks, local_key, journal_is_consistent)
    assert _summary(after) == _summary(State.from_keyspace(ks, local_key, journal_is_consistent))
    assert _summary(after) != _summary(before)

"""A leader's State built with an EntryCache kept across rounds equals one decoded afresh,
through random histories of items, members and assignments changing; entries unchanged since
the last round are re-used, not decoded again."""

from __future__ import annotations

from consumer_cluster import LOCAL, LOCAL_ENDPOINT, REMOTE, REMOTE_ENDPOINT, MemoryEtcd
from hypothesis import given, settings
from hypothesis import strategies as st

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

"""The broker resolver's keyspace observer works on the journals an update touched
(``KeySpace.changed``), not on the whole keyspace: checked against a full recomputation after
every step of random histories of items and assignments being put and deleted."""

from __future__ import annotations

import asyncio
from typing import Any

from consumer_cluster import LOCAL, LOCAL_ENDPOINT, REMOTE, REMOTE_ENDPOINT, MemoryEtcd
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.broker.keys import broker_decoder
from gazette.broker.resolver import Resolver
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import protocol_pb2 as pb

ROOT = "/gazette/test"
JOURNALS = [f"j/{i}" for i in range(5)]


class Rep:
    def __init__(self, spec: pb.JournalSpec) -> None:
        self.spec, self.primary, self.cancelled = spec, False, False
        self.route_signal = asyncio.Event()
        self.assignments_sig: tuple[tuple[str, int], ...] = ()
        self.retired = None
        self.signals = 0

    def set_primary(self, primary: bool) -> None:
        self.primary = primary

    def signal_route_change(self) -> None:
        self.signals += 1

    def cancel(self) -> None:
        self.cancelled = True


def _member(pid: pb.ProcessSpec.ID, endpoint: str) -> tuple[str, bytes]:
    spec = pb.BrokerSpec(journal_limit=100)
    spec.process_spec.id.CopyFrom(pid)
    spec.process_spec.endpoint = endpoint
    return members_key(ROOT, pid.zone, pid.suffix), spec.SerializeToString()


def _expected(etcd: MemoryEtcd) -> dict[str, tuple[bool, int]]:
    """Journal -> (primary, item create revision) from etcd's keys, computed from scratch."""
    out: dict[str, tuple[bool, int]] = {}
    for name in JOURNALS:
        item = etcd.kv.get(items_key(ROOT, name))
        slots = [s for s in (0, 1) if assignment_key(ROOT, name, LOCAL.zone, LOCAL.suffix, s) in etcd.kv]
        if item is not None and slots:
            out[name] = (min(slots) == 0, item[1])
    return out


op = st.tuples(st.sampled_from(["item", "drop-item", "assign", "unassign"]), st.sampled_from(JOURNALS),
               st.sampled_from(["local", "remote"]), st.integers(0, 1))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(op, min_size=1, max_size=4), min_size=1, max_size=12))
def test_replicas_follow_a_full_recomputation(batches: list[list[tuple[str, str, str, int]]]) -> None:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    made: list[tuple[str, Any]] = []

    def new_replica(journal: str, spec: pb.JournalSpec) -> Any:
        made.append((journal, Rep(spec)))
        return made[-1][1]

    resolver = Resolver(ks, LOCAL, new_replica)
    etcd = MemoryEtcd(ks)
    etcd.write([_member(LOCAL, LOCAL_ENDPOINT), _member(REMOTE, REMOTE_ENDPOINT)])
    for batch in batches:
        ops: dict[str, bytes | None] = {}
        for kind, name, who, slot in batch:
            pid = LOCAL if who == "local" else REMOTE
            if kind == "item":
                ops[items_key(ROOT, name)] = pb.JournalSpec(name=name, replication=2).SerializeToString()
            elif kind == "drop-item":
                ops[items_key(ROOT, name)] = None
            elif kind == "assign":  # a member holds one slot of an item: moving it drops the other
                ops[assignment_key(ROOT, name, pid.zone, pid.suffix, 1 - slot)] = None
                ops[assignment_key(ROOT, name, pid.zone, pid.suffix, slot)] = b""
            else:
                ops[assignment_key(ROOT, name, pid.zone, pid.suffix, slot)] = None
        etcd.write(ops.items())
        expected = _expected(etcd)
        assert resolver.replicas is not None
        got = {name: (r.primary, resolver._create_revs[name]) for name, r in resolver.replicas.items()}
        assert got == expected
        # Every replica made and no longer held was cancelled; every held one was not.
        held = {id(r) for r in resolver.replicas.values()}
        for _, r in made:
            assert r.cancelled == (id(r) not in held)
        # Each held replica's signature is its journal's assignments, in key order.
        for name, r in resolver.replicas.items():
            prefix = f"{ROOT}/assign/{name}#"
            assert r.assignments_sig == tuple((k, v[2]) for k, v in sorted(etcd.kv.items()) if k.startswith(prefix))


def test_a_load_walks_everything() -> None:
    """``changed`` is None after a load: every assigned journal is considered."""
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    resolver = Resolver(ks, LOCAL, lambda journal, spec: Rep(spec))
    etcd = MemoryEtcd(ks)
    etcd.write([_member(LOCAL, LOCAL_ENDPOINT),
                (items_key(ROOT, "j/a"), pb.JournalSpec(name="j/a", replication=1).SerializeToString()),
                (assignment_key(ROOT, "j/a", LOCAL.zone, LOCAL.suffix, 0), b"")])
    assert resolver.replicas is not None and set(resolver.replicas) == {"j/a"}
    assert ks.changed is None  # outside an observer
    resolver.replicas.clear()
    ks._install(ks._snap, ks.header, None)
    assert set(resolver.replicas) == {"j/a"}

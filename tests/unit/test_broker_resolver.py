"""The broker's resolver as a case table over a keyspace fed in memory (Gazette's
``broker/resolver_test.go``): every Status a resolution answers for reads and appends, the
process it names, routes with endpoints (the plumbing it shares with the consumer's resolver),
local replicas following assignments, claim scoping and the proxied-request checks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from consumer_cluster import CLUSTER_ID, LOCAL, LOCAL_ENDPOINT, REMOTE, REMOTE_ENDPOINT, MemoryEtcd

from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.auth import Claims
from gazette.broker.keys import broker_decoder
from gazette.broker.resolver import Resolver
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSelector
from gazette.server.cluster import ForeignCluster, MisroutedRequest

ROOT = "/gazette/test"


class FakeReplica:
    """What the resolver does to a local replica: its spec, primary flag and route signal."""

    def __init__(self, journal: str, spec: pb.JournalSpec) -> None:
        self.journal, self.spec = journal, spec
        self.primary = False
        self.route_signal = asyncio.Event()
        self.assignments_sig: tuple[tuple[str, int], ...] = ()
        self.retired = None
        self.cancelled = False

    def set_primary(self, primary: bool) -> None:
        self.primary = primary

    def signal_route_change(self) -> None:
        self.route_signal.set()
        self.route_signal = asyncio.Event()

    def cancel(self) -> None:
        self.cancelled = True


def _journal(name: str, suspended: bool = False, **labels: str) -> bytes:
    spec = pb.JournalSpec(name=name, replication=2)
    for k, v in sorted(labels.items()):
        spec.labels.labels.add(name=k, value=v)
    if suspended:
        spec.suspend.level = pb.JournalSpec.Suspend.FULL
    return spec.SerializeToString()


def _broker(pid: pb.ProcessSpec.ID, endpoint: str) -> tuple[str, bytes]:
    spec = pb.BrokerSpec(journal_limit=10)
    spec.process_spec.id.CopyFrom(pid)
    spec.process_spec.endpoint = endpoint
    return members_key(ROOT, pid.zone, pid.suffix), spec.SerializeToString()


def _assign(journal: str, pid: pb.ProcessSpec.ID, slot: int) -> tuple[str, bytes]:
    return assignment_key(ROOT, journal, pid.zone, pid.suffix, slot), b""


@pytest.fixture
def world() -> tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]]:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    replicas: dict[str, FakeReplica] = {}

    def new_replica(journal: str, spec: pb.JournalSpec) -> Any:
        replicas[journal] = FakeReplica(journal, spec)
        return replicas[journal]

    resolver = Resolver(ks, LOCAL, new_replica)
    etcd = MemoryEtcd(ks)
    etcd.write([_broker(LOCAL, LOCAL_ENDPOINT), _broker(REMOTE, REMOTE_ENDPOINT)])
    etcd.write([(items_key(ROOT, name), _journal(name, name == "j/suspended", app="a" if "local" in name else "b"))
                for name in ("j/local-primary", "j/remote-primary", "j/remote-only", "j/no-primary",
                             "j/unassigned", "j/suspended")])
    etcd.write([
        _assign("j/local-primary", LOCAL, 0), _assign("j/local-primary", REMOTE, 1),
        _assign("j/remote-primary", REMOTE, 0), _assign("j/remote-primary", LOCAL, 1),
        _assign("j/remote-only", REMOTE, 0),
        _assign("j/no-primary", LOCAL, 1),
        _assign("j/suspended", LOCAL, 0),
    ])
    return etcd, resolver, replicas


L, R = LOCAL, REMOTE


@pytest.mark.parametrize(
    ("journal", "may_proxy", "require_primary", "status", "process"),
    [
        ("j/missing", True, False, pb.JOURNAL_NOT_FOUND, L),
        ("j/suspended", True, True, pb.SUSPENDED, L),
        ("j/unassigned", True, True, pb.NO_JOURNAL_PRIMARY_BROKER, L),
        ("j/unassigned", True, False, pb.INSUFFICIENT_JOURNAL_BROKERS, L),
        ("j/no-primary", True, True, pb.NO_JOURNAL_PRIMARY_BROKER, L),
        ("j/no-primary", False, False, pb.OK, L),  # a read: any member serves it
        ("j/remote-primary", False, True, pb.NOT_JOURNAL_PRIMARY_BROKER, L),
        ("j/remote-primary", True, True, pb.OK, R),  # an append: proxied to the primary
        ("j/remote-primary", False, False, pb.OK, L),  # a read, served by this member
        ("j/remote-only", False, False, pb.NOT_JOURNAL_BROKER, L),
        ("j/remote-only", True, False, pb.OK, R),
        ("j/local-primary", False, True, pb.OK, L),
        ("j/local-primary;meta", False, True, pb.OK, L),  # Gazette's ";meta" suffix is stripped
    ],
    ids=["not-found", "suspended", "no-primary-append", "no-broker-read", "standby-only-append",
         "standby-only-read", "not-primary", "proxy-append", "member-read", "not-broker", "proxy-read",
         "local-append", "meta-suffix"],
)
async def test_resolution(world: tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]], journal: str,
                          may_proxy: bool, require_primary: bool, status: int, process: pb.ProcessSpec.ID) -> None:
    etcd, resolver, replicas = world
    res = await resolver.resolve(journal, may_proxy=may_proxy, require_primary=require_primary)
    assert res.status == status and res.header.process_id == process
    assert res.header.etcd.revision == etcd.revision and res.header.etcd.cluster_id == CLUSTER_ID
    name = journal.split(";")[0]
    assert (res.replica is not None) == (name in replicas)  # a local replica, whatever the status
    # Endpoints are attached for every member (the plumbing the consumer shares).
    ends = {(L.zone, L.suffix): LOCAL_ENDPOINT, (R.zone, R.suffix): REMOTE_ENDPOINT}
    assert list(res.route.endpoints) == [ends[(m.zone, m.suffix)] for m in res.route.members]


async def test_local_replicas_follow_assignments(world: tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]]) -> None:
    etcd, resolver, replicas = world
    assert sorted(replicas) == ["j/local-primary", "j/no-primary", "j/remote-primary", "j/suspended"]
    assert replicas["j/local-primary"].primary and not replicas["j/remote-primary"].primary
    signal = replicas["j/remote-primary"].route_signal
    # The primary moves here: the replica becomes primary and its route signal fires.
    etcd.write([(assignment_key(ROOT, "j/remote-primary", REMOTE.zone, REMOTE.suffix, 0), None),
                (assignment_key(ROOT, "j/remote-primary", LOCAL.zone, LOCAL.suffix, 1), None),
                _assign("j/remote-primary", LOCAL, 0)])
    assert replicas["j/remote-primary"].primary and signal.is_set()
    # An assignment that goes stops its replica.
    etcd.write([(assignment_key(ROOT, "j/no-primary", LOCAL.zone, LOCAL.suffix, 1), None)])
    assert replicas["j/no-primary"].cancelled and "j/no-primary" not in (resolver.replicas or {})


async def test_a_journal_outside_the_claims_is_not_found(
        world: tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]]) -> None:
    _, resolver, _ = world
    sel = pb.LabelSelector()
    sel.include.labels.add(name="app", value="a")
    claims = Claims(0, LabelSelector.from_proto(sel))
    hidden = await resolver.resolve("j/remote-primary", may_proxy=True, require_primary=True, claims=claims)
    assert hidden.status == pb.JOURNAL_NOT_FOUND and hidden.spec is None and not hidden.route.members
    seen = await resolver.resolve("j/local-primary", may_proxy=True, require_primary=True, claims=claims)
    assert seen.status == pb.OK


@pytest.mark.parametrize(
    ("suffix", "cluster_id", "error"),
    [("someone-else", CLUSTER_ID, MisroutedRequest), (LOCAL.suffix, CLUSTER_ID + 1, ForeignCluster)],
    ids=["misrouted", "foreign-cluster"],
)
async def test_a_proxied_request_that_reached_the_wrong_place_is_refused(
        world: tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]], suffix: str, cluster_id: int,
        error: type[Exception]) -> None:
    etcd, resolver, _ = world
    hdr = pb.Header()
    hdr.process_id.CopyFrom(LOCAL)
    hdr.process_id.suffix = suffix
    hdr.etcd.cluster_id, hdr.etcd.member_id, hdr.etcd.revision = cluster_id, 1, etcd.revision
    with pytest.raises(error):
        await resolver.resolve("j/local-primary", may_proxy=False, require_primary=True, proxy_header=hdr)


async def test_a_later_revision_is_waited_for(world: tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]]) -> None:
    etcd, resolver, _ = world
    resolving = asyncio.create_task(resolver.resolve(
        "j/new", may_proxy=True, require_primary=True, min_etcd_revision=etcd.revision + 1))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not resolving.done()
    etcd.write([(items_key(ROOT, "j/new"), _journal("j/new"))])
    res = await resolving
    assert res.status == pb.NO_JOURNAL_PRIMARY_BROKER and res.header.etcd.revision == etcd.revision


async def test_the_cached_resolution_is_found_without_a_coroutine(
        world: tuple[MemoryEtcd, Resolver, dict[str, FakeReplica]]) -> None:
    etcd, resolver, _ = world
    ask = {"may_proxy": True, "require_primary": True}
    assert resolver.cached("j/local-primary", **ask) is None  # nothing resolved yet
    res = await resolver.resolve("j/local-primary", **ask)
    assert resolver.cached("j/local-primary", **ask) is res
    assert resolver.cached("j/local-primary", may_proxy=False, require_primary=True) is None  # another ask
    # Scoped by claims as resolve scopes it.
    sel = pb.LabelSelector()
    sel.include.labels.add(name="app", value="b")
    hidden = resolver.cached("j/local-primary", **ask, claims=Claims(0, LabelSelector.from_proto(sel)))
    assert hidden is not None and hidden.status == pb.JOURNAL_NOT_FOUND and hidden.spec is None
    # What asks for more than the cache holds is resolve's: a later revision, a proxied header.
    assert resolver.cached("j/local-primary", **ask, min_etcd_revision=etcd.revision + 1) is None
    assert resolver.cached("j/local-primary", **ask, proxy_header=res.header) is None
    etcd.write([(items_key(ROOT, "j/new"), _journal("j/new"))])  # a new revision: stale
    assert resolver.cached("j/local-primary", **ask) is None

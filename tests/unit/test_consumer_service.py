"""The consumer's Shard service as case tables over a keyspace fed in memory (no etcd, no
consumer process): List (selectors, routes with endpoints, replica statuses, claim scoping),
Apply (one transaction, revision checks, source journals checked, claim scoping), Stat (every
status it answers, served locally or forwarded once with the resolution's header), GetHints
and Unassign. Journals live in an in-process fake broker; errors end at the shared edge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from consumer_cluster import (
    LOCAL,
    LOCAL_ENDPOINT,
    REMOTE,
    REMOTE_ENDPOINT,
    FakeHost,
    FakeRuntime,
    MemoryEtcd,
    new_cluster,
    shard_spec,
)

from gazette.allocator.keys import assignment_key, assignments_prefix, items_key
from gazette.auth import NO_AUTH, Claims
from gazette.client import JournalClient
from gazette.consumer.resolver import Resolver
from gazette.consumer.service import ShardService
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSelector
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker

PRIMARY, STANDBY, FAILED = pc.ReplicaStatus.PRIMARY, pc.ReplicaStatus.STANDBY, pc.ReplicaStatus.FAILED


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class Context:
    """A grpc.aio servicer context: no token, and ``abort`` raises."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class Scoped:
    """A verifier granting every capability, only on shards labelled ``app=a``."""

    def verify(self, authorization: str | None, require: int) -> Claims:
        sel = pb.LabelSelector()
        sel.include.labels.add(name="app", value="a")
        return Claims(require, LabelSelector.from_proto(sel))


@dataclass
class Peers:
    """The other consumers, as the service forwards to them: records what it sent where."""

    sent: list[tuple[str, pc.StatRequest]] = field(default_factory=list)

    def stub(self, endpoint: str) -> Peers:
        self._endpoint = endpoint
        return self

    async def Stat(self, req: pc.StatRequest) -> pc.StatResponse:  # noqa: N802 - the stub's name
        self.sent.append((self._endpoint, req))
        resp = pc.StatResponse(status=pc.Status.OK)
        resp.header.CopyFrom(req.header)
        resp.read_through["in/a"] = 99
        return resp


@dataclass
class Process:
    """The consumer process as the service sees it (``ConsumerContext``)."""

    etcd: MemoryEtcd
    keyspace: KeySpace
    client: JournalClient
    host: FakeHost
    peers: Peers = field(default_factory=Peers)
    verifier: Any = NO_AUTH
    local_id: pb.ProcessSpec.ID = field(default_factory=lambda: LOCAL)

    def __post_init__(self) -> None:
        self.shards = self.host.shards
        self.resolver = Resolver(self.host)  # type: ignore[arg-type]


@dataclass
class World:
    proc: Process
    svc: ShardService
    broker: FakeBroker
    runtime: FakeRuntime


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """Journals in/a and in/b (framed) and in/raw (no content-type); consumers local and
    remote; shards a-local (labels app=a, primary here), a-remote (app=a, primary there),
    b-idle (app=b, standby here only) and b-failed (app=b, failed primary here)."""
    cluster = FakeCluster()
    for name in ("in/a", "in/b"):
        cluster.create(name, {"content-type": "application/x-ndjson"})
    cluster.create("in/raw")
    broker = await start_broker(cluster)
    etcd = new_cluster()
    etcd.member(LOCAL, LOCAL_ENDPOINT)
    etcd.member(REMOTE, REMOTE_ENDPOINT)
    etcd.shard(shard_spec("a-local", "in/a", app="a"))
    etcd.shard(shard_spec("a-remote", "in/a", app="a"))
    etcd.shard(shard_spec("b-idle", "in/b", app="b"))
    etcd.shard(shard_spec("b-failed", "in/b", app="b"))
    etcd.assign("a-local", LOCAL, 0, PRIMARY)
    etcd.assign("a-local", REMOTE, 1, STANDBY)
    etcd.assign("a-remote", REMOTE, 0, PRIMARY)
    etcd.assign("b-idle", LOCAL, 1)
    etcd.assign("b-failed", LOCAL, 0, FAILED)
    host = FakeHost(etcd.ks)
    rt = FakeRuntime(shard_spec("a-local", "in/a", app="a"), read_through={"in/a": 7}, publish_at={"out/x": 3})
    rt.ready.set()
    host.start(rt)
    client = JournalClient(broker.endpoint)
    proc = Process(etcd, etcd.ks, client, host)
    try:
        yield World(proc, ShardService(proc), broker, rt)  # type: ignore[arg-type]
    finally:
        await client.close()
        await broker.stop()


# -- List ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("include", "scoped", "listed"),
    [
        ({}, False, ["a-local", "a-remote", "b-failed", "b-idle"]),
        ({"app": "b"}, False, ["b-failed", "b-idle"]),
        ({"id": "a-remote"}, False, ["a-remote"]),  # the meta-label
        ({}, True, ["a-local", "a-remote"]),  # a token scoped to app=a sees only those
        ({"app": "b"}, True, []),
    ],
    ids=["all", "by-label", "by-id", "scoped", "scoped-out"],
)
async def test_list(world: World, include: dict[str, str], scoped: bool, listed: list[str]) -> None:
    if scoped:
        world.proc.verifier = Scoped()
    req = pc.ListRequest()
    for name, value in include.items():
        req.selector.include.labels.add(name=name, value=value)
    resp = await world.svc.List(req, Context())
    assert resp.status == pc.Status.OK
    assert [s.spec.id for s in resp.shards] == listed
    assert resp.header.process_id == LOCAL and resp.header.etcd.revision == world.proc.etcd.revision


async def test_list_carries_routes_endpoints_statuses_and_revisions(world: World) -> None:
    resp = await world.svc.List(pc.ListRequest(), Context())
    by_id = {s.spec.id: s for s in resp.shards}
    a = by_id["a-local"]
    assert [(m.zone, m.suffix) for m in a.route.members] == [(LOCAL.zone, LOCAL.suffix), (REMOTE.zone, REMOTE.suffix)]
    assert a.route.primary == 0 and list(a.route.endpoints) == [LOCAL_ENDPOINT, REMOTE_ENDPOINT]
    assert [s.code for s in a.status] == [PRIMARY, STANDBY]
    assert [s.code for s in by_id["b-idle"].status] == [pc.ReplicaStatus.IDLE] and by_id["b-idle"].route.primary == -1
    kv = world.proc.keyspace.search(items_key(world.proc.keyspace.root, "a-local"))
    assert kv is not None and (a.mod_revision, a.create_revision) == (kv.mod_revision, kv.create_revision)


# -- Apply --------------------------------------------------------------------------------


def _upsert(spec: pc.ShardSpec, expect: int = 0) -> pc.ApplyRequest.Change:
    return pc.ApplyRequest.Change(upsert=spec, expect_mod_revision=expect)


async def test_apply_creates_changes_and_deletes_in_one_transaction(world: World) -> None:
    ks, etcd = world.proc.keyspace, world.proc.etcd
    old = ks.search(items_key(ks.root, "b-idle"))
    assert old is not None
    changed = shard_spec("b-idle", "in/a", "in/b", app="b")
    req = pc.ApplyRequest(changes=[
        _upsert(shard_spec("new-shard", "in/a", app="a")),
        _upsert(changed, old.mod_revision),
        pc.ApplyRequest.Change(delete="b-failed", expect_mod_revision=-1),
    ])
    txns = etcd.txns
    resp = await world.svc.Apply(req, Context())
    assert resp.status == pc.Status.OK and etcd.txns == txns + 1
    # Read-your-writes: the keyspace has the changes when the answer comes.
    assert resp.header.etcd.revision == etcd.revision == ks.revision
    assert ks.search(items_key(ks.root, "new-shard")) is not None
    got = ks.search(items_key(ks.root, "b-idle"))
    assert got is not None and got.value == changed
    assert ks.search(items_key(ks.root, "b-failed")) is None


@pytest.mark.parametrize(
    ("change", "status"),
    [
        (lambda ks: _upsert(shard_spec("a-local", "in/a", app="a"), 0), pc.Status.ETCD_TRANSACTION_FAILED),  # exists
        (lambda ks: _upsert(shard_spec("a-local", "in/a", app="a"), 1), pc.Status.ETCD_TRANSACTION_FAILED),  # stale
        (lambda ks: pc.ApplyRequest.Change(delete="nothing", expect_mod_revision=3),
         pc.Status.ETCD_TRANSACTION_FAILED),
    ],
    ids=["create-existing", "stale-revision", "delete-missing"],
)
async def test_apply_refused_by_revision_applies_nothing(world: World, change: Any, status: int) -> None:
    ks = world.proc.keyspace
    before = ks.revision
    req = pc.ApplyRequest(changes=[_upsert(shard_spec("would-be", "in/a")), change(ks)])
    resp = await world.svc.Apply(req, Context())
    assert resp.status == status
    assert ks.revision == before and ks.search(items_key(ks.root, "would-be")) is None


@pytest.mark.parametrize(
    ("spec", "scoped", "code", "detail"),
    [
        (shard_spec("shard-x", "in/a", "in/missing"), False, grpc.StatusCode.INVALID_ARGUMENT,
         "changes[0].upsert.sources[1].journal: journal 'in/missing' does not exist"),
        (shard_spec("shard-x", "in/raw"), False, grpc.StatusCode.INVALID_ARGUMENT,
         "changes[0].upsert.sources[0].journal"),  # no content-type: cannot be framed
        (shard_spec("shard-x", "in/a", app="b"), True, grpc.StatusCode.PERMISSION_DENIED, "not authorized to shard-x"),
        (pc.ShardSpec(id="bad id!"), False, grpc.StatusCode.INVALID_ARGUMENT, "changes[0].upsert.id"),
    ],
    ids=["missing-source", "unframed-source", "out-of-scope", "invalid-spec"],
)
async def test_apply_refusals_end_the_rpc(world: World, spec: pc.ShardSpec, scoped: bool,
                                          code: grpc.StatusCode, detail: str) -> None:
    if scoped:
        world.proc.verifier = Scoped()
    before = world.proc.keyspace.revision
    with pytest.raises(Aborted) as info:
        await world.svc.Apply(pc.ApplyRequest(changes=[_upsert(spec)]), Context())
    assert info.value.code == code and detail in info.value.details
    assert world.proc.keyspace.revision == before


async def test_a_scoped_token_deletes_by_id_alone(world: World) -> None:
    world.proc.verifier = Scoped()
    with pytest.raises(Aborted) as info:  # b-idle is app=b, but a delete is scoped by its id
        await world.svc.Apply(pc.ApplyRequest(changes=[pc.ApplyRequest.Change(delete="b-idle", expect_mod_revision=-1)]),
                              Context())
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED


# -- Stat ---------------------------------------------------------------------------------


async def _forwarded_header(world: World, shard: str) -> pb.Header:
    """The header a process that resolved ``shard`` with this process as its primary sends."""
    hdr = (await world.proc.resolver.resolve(shard, may_proxy=True)).header
    hdr.process_id.CopyFrom(LOCAL)
    return hdr


@pytest.mark.parametrize(
    ("shard", "proxied", "status", "process"),
    [
        ("no-such-shard", False, pc.Status.SHARD_NOT_FOUND, LOCAL),
        ("b-idle", False, pc.Status.NO_SHARD_PRIMARY, LOCAL),
        # A request some process forwarded here (it carries a header): never forwarded again.
        ("a-remote", True, pc.Status.NOT_SHARD_PRIMARY, LOCAL),
        ("a-local", False, pc.Status.OK, LOCAL),
        ("a-local", True, pc.Status.OK, LOCAL),
    ],
    ids=["not-found", "no-primary", "not-primary", "local", "local-proxied"],
)
async def test_stat_statuses(world: World, shard: str, proxied: bool, status: int, process: pb.ProcessSpec.ID) -> None:
    req = pc.StatRequest(shard=shard, read_through={"in/a": 7})
    if proxied:
        req.header.CopyFrom(await _forwarded_header(world, shard))
    resp = await world.svc.Stat(req, Context())
    assert resp.status == status and resp.header.process_id == process
    assert world.proc.peers.sent == []
    if status == pc.Status.OK:
        assert dict(resp.read_through) == {"in/a": 7} and dict(resp.publish_at) == {"out/x": 3}
    else:
        assert not resp.read_through


async def test_stat_of_a_stopped_shard_is_shard_stopped(world: World) -> None:
    rt = FakeRuntime(shard_spec("a-local", "in/a", app="a"))  # restarted, not ready
    task = world.proc.host.start(rt)
    stat = asyncio.create_task(world.svc.Stat(pc.StatRequest(shard="a-local"), Context()))
    for _ in range(50):  # let it block on the store
        await asyncio.sleep(0)
    assert not stat.done()
    task.set_result(None)
    resp = await stat
    assert resp.status == pc.Status.SHARD_STOPPED and resp.header.process_id == LOCAL


async def test_stat_of_a_remote_primary_is_forwarded_once_with_the_resolution_header(world: World) -> None:
    req = pc.StatRequest(shard="a-remote", read_through={"in/a": 5})
    resp = await world.svc.Stat(req, Context())
    assert resp.status == pc.Status.OK and dict(resp.read_through) == {"in/a": 99}  # the peer's answer
    [(endpoint, fwd)] = world.proc.peers.sent
    assert endpoint == REMOTE_ENDPOINT
    assert fwd.shard == "a-remote" and dict(fwd.read_through) == {"in/a": 5}
    assert fwd.header.process_id == REMOTE  # the peer checks it is the one meant
    assert fwd.header.etcd.revision == world.proc.keyspace.revision  # and reads through our revision
    assert list(fwd.header.route.endpoints) == [REMOTE_ENDPOINT]


@pytest.mark.parametrize(
    ("suffix", "cluster_id", "code"),
    [("someone-else", 0, grpc.StatusCode.UNAVAILABLE), ("", 12345, grpc.StatusCode.FAILED_PRECONDITION)],
    ids=["misrouted", "foreign-cluster"],
)
async def test_stat_refuses_a_request_forwarded_to_the_wrong_place(
    world: World, suffix: str, cluster_id: int, code: grpc.StatusCode,
) -> None:
    req = pc.StatRequest(shard="a-local")
    req.header.CopyFrom(await _forwarded_header(world, "a-local"))
    if suffix:
        req.header.process_id.suffix = suffix
    if cluster_id:
        req.header.etcd.cluster_id = cluster_id
    with pytest.raises(Aborted) as info:
        await world.svc.Stat(req, Context())
    assert info.value.code == code


async def test_stat_out_of_scope_is_not_found(world: World) -> None:
    world.proc.verifier = Scoped()
    resp = await world.svc.Stat(pc.StatRequest(shard="b-idle"), Context())
    assert resp.status == pc.Status.SHARD_NOT_FOUND and resp.header.process_id == LOCAL
    resp = await world.svc.Stat(pc.StatRequest(shard="a-local"), Context())
    assert resp.status == pc.Status.OK


# -- GetHints and Unassign ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shard", "scoped", "status"),
    [("no-such-shard", False, pc.Status.SHARD_NOT_FOUND), ("b-idle", True, pc.Status.SHARD_NOT_FOUND),
     ("a-local", False, pc.Status.OK)],  # no recovery log: no hints, OK
    ids=["not-found", "out-of-scope", "no-log"],
)
async def test_get_hints(world: World, shard: str, scoped: bool, status: int) -> None:
    if scoped:
        world.proc.verifier = Scoped()
    resp = await world.svc.GetHints(pc.GetHintsRequest(shard=shard), Context())
    assert resp.status == status and not resp.HasField("primary_hints")
    assert resp.header.process_id == LOCAL


@pytest.mark.parametrize(
    ("shards", "only_failed", "dry_run", "named", "removed"),
    [
        (["a-local"], False, False, ["a-local"], {"a-local"}),
        (["a-local", "b-failed"], True, False, ["b-failed"], {"b-failed"}),  # only failed replicas
        (["a-local", "b-failed"], False, True, ["a-local", "b-failed"], set()),  # says, changes nothing
        (["unassigned-nothing"], False, False, [], set()),
    ],
    ids=["all-replicas", "only-failed", "dry-run", "nothing-assigned"],
)
async def test_unassign(world: World, shards: list[str], only_failed: bool, dry_run: bool,
                        named: list[str], removed: set[str]) -> None:
    ks = world.proc.keyspace
    before = {kv.key for kv in ks.prefixed(assignments_prefix(ks.root))}
    resp = await world.svc.Unassign(pc.UnassignRequest(shards=shards, only_failed=only_failed, dry_run=dry_run),
                                    Context())
    assert resp.status == pc.Status.OK and list(resp.shards) == named
    after = {kv.key for kv in ks.prefixed(assignments_prefix(ks.root))}
    assert {k for k in before - after} == {k for k in before if any(f"/{s}#" in k for s in removed)}
    assert assignment_key(ks.root, "a-remote", REMOTE.zone, REMOTE.suffix, 0) in after


async def test_unassign_out_of_scope_is_refused(world: World) -> None:
    world.proc.verifier = Scoped()
    with pytest.raises(Aborted) as info:
        await world.svc.Unassign(pc.UnassignRequest(shards=["b-failed"]), Context())
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED

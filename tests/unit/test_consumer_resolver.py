"""The consumer's resolver as case tables over a keyspace fed in memory (Gazette's
``consumer/resolver_test.go``): every Shard status a resolution answers (OK, SHARD_NOT_FOUND,
NO_SHARD_PRIMARY, NOT_SHARD_PRIMARY, SHARD_STOPPED), proxying to a remote primary with its
endpoint, the checks of a proxied request, and what a resolution waits for (a local shard
starting, its store becoming ready, transactions reading through offsets, a later revision)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from consumer_cluster import (
    CLUSTER_ID,
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

from gazette.consumer.resolver import Resolution, Resolver, replica_statuses
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.server.cluster import ForeignCluster, MisroutedRequest

GONE = pb.ProcessSpec.ID(zone="zone-c", suffix="gone")  # assigned, but no member key
PRIMARY, STANDBY = pc.ReplicaStatus.PRIMARY, pc.ReplicaStatus.STANDBY


async def settle() -> None:
    """Lets every runnable task run until it blocks (a bounded number of loop turns)."""
    for _ in range(50):
        await asyncio.sleep(0)


@dataclass
class World:
    etcd: MemoryEtcd
    host: FakeHost
    resolver: Resolver
    runtime: FakeRuntime  # the local primary of "local-primary", ready
    task: asyncio.Future[None]  # stands for its task


@pytest.fixture
async def world() -> World:
    """Two consumers (local and remote) and a shard of each kind of assignment:

    local-primary   local slot 0 (PRIMARY), remote slot 1 (STANDBY); started here and ready
    remote-primary  remote slot 0 (PRIMARY), local slot 1 (STANDBY)
    standby-only    local slot 1 (STANDBY): no primary
    unassigned      no assignment
    orphan-primary  slot 0 on a consumer whose member key is gone (no endpoint)
    """
    etcd = new_cluster()
    etcd.member(LOCAL, LOCAL_ENDPOINT)
    etcd.member(REMOTE, REMOTE_ENDPOINT)
    for sid in ("local-primary", "remote-primary", "standby-only", "unassigned", "orphan-primary"):
        etcd.shard(shard_spec(sid, "in/a", "in/b"))
    etcd.assign("local-primary", LOCAL, 0, PRIMARY)
    etcd.assign("local-primary", REMOTE, 1, STANDBY)
    etcd.assign("remote-primary", REMOTE, 0, PRIMARY)
    etcd.assign("remote-primary", LOCAL, 1, STANDBY)
    etcd.assign("standby-only", LOCAL, 1, STANDBY)
    etcd.assign("orphan-primary", GONE, 0, PRIMARY)
    host = FakeHost(etcd.ks)
    rt = FakeRuntime(shard_spec("local-primary", "in/a", "in/b"))
    rt.ready.set()
    task = host.start(rt)
    return World(etcd, host, Resolver(host), rt, task)  # type: ignore[arg-type]


def _ids(route: pb.Route) -> list[tuple[str, str]]:
    return [(m.zone, m.suffix) for m in route.members]


L, R = (LOCAL.zone, LOCAL.suffix), (REMOTE.zone, REMOTE.suffix)


@pytest.mark.parametrize(
    ("shard", "may_proxy", "status", "process", "members", "primary", "endpoint"),
    [
        # No spec: not found, whoever asks; the answer is ours.
        ("no-such-shard", True, pc.Status.SHARD_NOT_FOUND, L, [], -1, ""),
        # A spec without a primary assignment.
        ("unassigned", True, pc.Status.NO_SHARD_PRIMARY, L, [], -1, ""),
        ("standby-only", True, pc.Status.NO_SHARD_PRIMARY, L, [L], -1, ""),
        # The primary is elsewhere and the caller forbids proxying.
        ("remote-primary", False, pc.Status.NOT_SHARD_PRIMARY, L, [L, R], 1, ""),
        # ... or allows it: OK, addressed to the primary, at its endpoint.
        ("remote-primary", True, pc.Status.OK, R, [L, R], 1, REMOTE_ENDPOINT),
        # The primary is here (proxying allowed or not): served locally.
        ("local-primary", True, pc.Status.OK, L, [L, R], 0, ""),
        ("local-primary", False, pc.Status.OK, L, [L, R], 0, ""),
    ],
    ids=["not-found", "no-assignment", "standby-only", "not-primary", "proxy", "local", "local-no-proxy"],
)
async def test_resolution_status_header_and_route(
    world: World, shard: str, may_proxy: bool, status: int, process: tuple[str, str],
    members: list[tuple[str, str]], primary: int, endpoint: str,
) -> None:
    res = await world.resolver.resolve(shard, may_proxy=may_proxy)
    assert res.status == status
    assert (res.header.process_id.zone, res.header.process_id.suffix) == process
    assert _ids(res.header.route) == members and res.header.route.primary == primary
    # Endpoints are attached, one per member, from the member specs (Gazette's AttachEndpoints).
    assert list(res.header.route.endpoints) == [{L: LOCAL_ENDPOINT, R: REMOTE_ENDPOINT}[m] for m in members]
    assert res.header.etcd.revision == world.etcd.revision
    assert res.header.etcd.cluster_id == CLUSTER_ID
    assert res.endpoint == endpoint and res.proxied == bool(endpoint)
    local = status == pc.Status.OK and not endpoint
    assert (res.shard is world.runtime) == local
    assert res.store == ("the store" if local else None)
    assert (res.spec is not None) == (shard != "no-such-shard")


async def test_endpoints_are_attached_for_every_member_even_unknown_ones(world: World) -> None:
    route = (await world.resolver.resolve("orphan-primary", may_proxy=False)).header.route
    assert _ids(route) == [(GONE.zone, GONE.suffix)] and list(route.endpoints) == [""]


async def test_replica_statuses_follow_route_members(world: World) -> None:
    from gazette.allocator import item_route
    route, assignments = item_route(world.etcd.ks, "remote-primary")
    assert _ids(route) == [L, R]
    assert [s.code for s in replica_statuses(assignments)] == [STANDBY, PRIMARY]


# -- a proxied request ---------------------------------------------------------------------


def _proxy_header(world: World, **change: Any) -> pb.Header:
    hdr = pb.Header()
    hdr.process_id.CopyFrom(LOCAL)
    hdr.etcd.cluster_id = CLUSTER_ID
    hdr.etcd.revision = world.etcd.revision
    for name, value in change.items():
        if name == "suffix":
            hdr.process_id.suffix = value
        elif name == "cluster_id":
            hdr.etcd.cluster_id = value
        elif name == "no_process":
            hdr.ClearField("process_id")
    return hdr


@pytest.mark.parametrize(
    ("change", "error", "code"),
    [
        ({"suffix": "another"}, MisroutedRequest, "UNAVAILABLE"),  # a stale route: retried
        ({"cluster_id": CLUSTER_ID + 1}, ForeignCluster, "FAILED_PRECONDITION"),  # a deployment error
    ],
    ids=["wrong-process", "foreign-cluster"],
)
async def test_a_proxied_request_that_reached_the_wrong_place_is_refused(
    world: World, change: dict[str, Any], error: type[Exception], code: str,
) -> None:
    with pytest.raises(error) as info:
        await world.resolver.resolve("local-primary", may_proxy=False, proxy_header=_proxy_header(world, **change))
    assert getattr(info.value, "grpc_code") == code  # noqa: B009 - the class attribute the edge maps


@pytest.mark.parametrize(
    ("shard", "change", "status"),
    [
        ("local-primary", {}, pc.Status.OK),
        ("local-primary", {"no_process": True}, pc.Status.OK),  # no process named: any will do
        # Addressed here, but the primary moved meanwhile: refused, never a second hop.
        ("remote-primary", {}, pc.Status.NOT_SHARD_PRIMARY),
    ],
    ids=["addressed-here", "unaddressed", "moved"],
)
async def test_a_proxied_request_is_resolved_here_without_a_second_hop(
    world: World, shard: str, change: dict[str, Any], status: int,
) -> None:
    res = await world.resolver.resolve(shard, may_proxy=False, proxy_header=_proxy_header(world, **change))
    assert res.status == status and not res.proxied
    assert res.header.process_id == LOCAL


async def test_a_proxied_request_waits_for_its_senders_revision(world: World) -> None:
    hdr = _proxy_header(world)
    hdr.etcd.revision = world.etcd.revision + 1  # the sender saw a write we have not
    resolving = asyncio.create_task(world.resolver.resolve("remote-primary", may_proxy=False, proxy_header=hdr))
    await settle()
    assert not resolving.done()
    world.etcd.shard(shard_spec("later", "in/a"))  # the write the sender saw
    res = await resolving
    assert res.status == pc.Status.NOT_SHARD_PRIMARY  # primary elsewhere: refused, not re-proxied
    assert res.header.etcd.revision == hdr.etcd.revision


# -- what a resolution waits for -------------------------------------------------------------


async def test_a_primary_that_stops_before_its_store_is_ready_is_shard_stopped(world: World) -> None:
    rt = FakeRuntime(shard_spec("local-primary", "in/a"))  # restarted: not ready again yet
    task = world.host.start(rt)
    resolving = asyncio.create_task(world.resolver.resolve("local-primary"))
    await settle()
    assert not resolving.done()
    task.set_result(None)  # the shard ends (e.g. it failed, or its assignment went)
    res = await resolving
    assert res.status == pc.Status.SHARD_STOPPED and res.shard is None
    assert res.header.process_id == LOCAL


async def test_a_resolution_waits_for_the_store_to_be_ready(world: World) -> None:
    rt = FakeRuntime(shard_spec("local-primary", "in/a"))
    world.host.start(rt)
    resolving = asyncio.create_task(world.resolver.resolve("local-primary"))
    await settle()
    assert not resolving.done()
    rt.ready.set()
    res = await resolving
    assert res.status == pc.Status.OK and res.shard is rt


async def test_read_through_waits_for_a_transaction_reading_through_the_offsets(world: World) -> None:
    rt = world.runtime
    rt.read_through.update({"in/a": 10, "in/b": 5})
    wanted = {"in/a": 20, "in/b": 5, "not/a/source": 1 << 40}  # a journal it does not read: ignored
    resolving = asyncio.create_task(world.resolver.resolve("local-primary", read_through=wanted))
    await settle()
    assert not resolving.done()
    rt.complete_txn(in_a=19)  # not far enough
    await settle()
    assert not resolving.done()
    rt.complete_txn(in_a=20)
    res = await resolving
    assert res.status == pc.Status.OK and res.shard is rt
    assert rt.progress()[0] == {"in/a": 20, "in/b": 5}


async def test_read_through_is_shard_stopped_when_the_shard_ends_first(world: World) -> None:
    resolving = asyncio.create_task(world.resolver.resolve("local-primary", read_through={"in/a": 1}))
    await settle()
    assert not resolving.done()
    world.task.set_result(None)
    res = await resolving
    assert res.status == pc.Status.SHARD_STOPPED and res.header.process_id == LOCAL


async def test_an_assigned_shard_not_yet_started_is_waited_for(world: World) -> None:
    world.etcd.shard(shard_spec("new", "in/a"))
    world.etcd.assign("new", LOCAL, 0, pc.ReplicaStatus.IDLE)
    resolving = asyncio.create_task(world.resolver.resolve("new"))
    await world.host.waiter()
    world.host.reconciled()  # a reconcile that did not start it: it waits for the next one
    await world.host.waiter()
    assert not resolving.done()
    rt = FakeRuntime(shard_spec("new", "in/a"))
    rt.ready.set()
    world.host.start(rt)
    world.host.reconciled()
    res = await resolving
    assert res.status == pc.Status.OK and res.shard is rt


async def test_a_remote_primary_without_an_endpoint_is_waited_for(world: World) -> None:
    resolving = asyncio.create_task(world.resolver.resolve("orphan-primary"))
    await world.host.waiter()  # for the primary's member spec
    world.etcd.member(GONE, "http://back:8081")  # its consumer (re)announces itself
    world.host.reconciled()
    res: Resolution = await resolving
    assert res.status == pc.Status.OK and res.proxied and res.endpoint == "http://back:8081"
    assert res.header.process_id == GONE and res.shard is None


async def test_shards_with_source(world: World) -> None:
    world.etcd.shard(shard_spec("other", "in/c"))
    assert [s.id for s in world.resolver.shards_with_source("in/c")] == ["other"]
    assert {s.id for s in world.resolver.shards_with_source("in/a")} == {
        "local-primary", "remote-primary", "standby-only", "unassigned", "orphan-primary"}
    assert world.resolver.shards_with_source("nothing") == []

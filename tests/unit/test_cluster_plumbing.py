"""The plumbing brokers and consumers share, on its own: routes from assignments with endpoints
(``allocator.item_route``), the proxy check (``server.cluster``), the channel pool and apply
batching (``client.channels``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from consumer_cluster import (
    CLUSTER_ID,
    LOCAL,
    LOCAL_ENDPOINT,
    REMOTE,
    REMOTE_ENDPOINT,
    new_cluster,
    shard_spec,
)

from gazette.allocator import item_route
from gazette.client.channels import ChannelPool, apply_in_batches
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.server.cluster import ForeignCluster, MisroutedRequest, check_proxy_header

OTHER = pb.ProcessSpec.ID(zone="zone-a", suffix="other")  # sorts between LOCAL and REMOTE


@pytest.mark.parametrize(
    ("assigned", "members", "primary", "endpoints"),
    [
        ([], [], -1, []),  # no members: no endpoints either
        ([(REMOTE, 1), (LOCAL, 0)], [LOCAL, REMOTE], 0, [LOCAL_ENDPOINT, REMOTE_ENDPOINT]),
        ([(REMOTE, 0), (LOCAL, 1)], [LOCAL, REMOTE], 1, [LOCAL_ENDPOINT, REMOTE_ENDPOINT]),
        ([(LOCAL, 1)], [LOCAL], -1, [LOCAL_ENDPOINT]),
        # A member missing from the keyspace: its endpoint is "", the others still attached.
        ([(OTHER, 0), (REMOTE, 1)], [OTHER, REMOTE], 0, ["", REMOTE_ENDPOINT]),
        ([(OTHER, 0)], [OTHER], 0, [""]),
    ],
    ids=["none", "primary-first", "primary-second", "no-primary", "unknown-member", "only-unknown"],
)
def test_item_route(assigned: list[tuple[pb.ProcessSpec.ID, int]], members: list[pb.ProcessSpec.ID],
                    primary: int, endpoints: list[str]) -> None:
    etcd = new_cluster()
    etcd.member(LOCAL, LOCAL_ENDPOINT)
    etcd.member(REMOTE, REMOTE_ENDPOINT)
    etcd.shard(shard_spec("item", "in/a"))
    for pid, slot in assigned:
        etcd.assign("item", pid, slot, pc.ReplicaStatus.STANDBY)
    etcd.assign("item-2", LOCAL, 0)  # another item's assignment, whose key extends "item"
    route, assignments = item_route(etcd.ks, "item")
    assert list(route.members) == members and route.primary == primary
    assert list(route.endpoints) == endpoints
    assert len(assignments) == len(assigned)


def _header(**change: Any) -> pb.Header:
    hdr = pb.Header()
    hdr.process_id.CopyFrom(LOCAL)
    hdr.etcd.cluster_id, hdr.etcd.member_id, hdr.etcd.revision = CLUSTER_ID, 1, 5
    for name, value in change.items():
        if name == "suffix":
            hdr.process_id.suffix = value
        elif name == "cluster_id":
            hdr.etcd.cluster_id = value
        elif name == "clear":
            hdr.ClearField(value)
    return hdr


@pytest.mark.parametrize(
    ("header", "result"),
    [
        (None, 0),  # not proxied
        (_header(), 5),  # addressed here: resolved at or after the sender's revision
        (_header(clear="process_id"), 5),  # no process named
        (_header(clear="etcd"), 0),
        (_header(cluster_id=0), 5),  # a cluster ID unknown to the sender is not compared
        (_header(suffix="other"), MisroutedRequest),
        (_header(cluster_id=CLUSTER_ID + 1), ForeignCluster),
    ],
    ids=["none", "here", "no-process", "no-etcd", "no-cluster-id", "misrouted", "foreign"],
)
def test_check_proxy_header(header: pb.Header | None, result: int | type[Exception]) -> None:
    etcd = new_cluster()
    etcd.member(LOCAL, LOCAL_ENDPOINT)  # the keyspace learns its cluster ID
    if isinstance(result, int):
        assert check_proxy_header(etcd.ks, LOCAL, header) == result
    else:
        with pytest.raises(result):
            check_proxy_header(etcd.ks, LOCAL, header)
    assert MisroutedRequest.grpc_code == "UNAVAILABLE" and ForeignCluster.grpc_code == "FAILED_PRECONDITION"


@pytest.mark.parametrize(
    ("n", "size", "batches"),
    [(0, 0, [0]), (0, 3, [0]), (5, 0, [5]), (5, -1, [5]), (5, 2, [2, 2, 1]), (4, 2, [2, 2]), (3, 10, [3])],
)
async def test_apply_in_batches(n: int, size: int, batches: list[int]) -> None:
    sent: list[list[int]] = []

    async def send(changes: Sequence[int]) -> int:
        sent.append(list(changes))
        return len(sent)

    assert await apply_in_batches(list(range(n)), size, send) == len(batches)
    assert [len(b) for b in sent] == batches and [x for b in sent for x in b] == list(range(n))


async def test_apply_in_batches_stops_at_the_first_failure() -> None:
    sent: list[list[int]] = []

    async def send(changes: Sequence[int]) -> None:
        sent.append(list(changes))
        if len(sent) == 2:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        await apply_in_batches(list(range(7)), 2, send)
    assert sent == [[0, 1], [2, 3]]  # the first batch stays applied; nothing after the failure


class _Channel:
    closed = 0

    def __init__(self, target: str, options: Sequence[tuple[str, Any]]) -> None:
        self.target, self.options = target, list(options)

    async def close(self, grace: float | None = None) -> None:
        _Channel.closed += 1


async def test_channel_pool_opens_one_channel_per_endpoint_and_closes_them() -> None:
    pool = ChannelPool([("opt", 1)], _Channel)  # type: ignore[arg-type]
    a = pool.channel("http://a:1")
    assert pool.channel("http://a:1") is a and "http://a:1" in pool and "http://b:2" not in pool
    assert a.target == "a:1" and a.options == [("opt", 1)]  # type: ignore[attr-defined]
    def stub_type(ch: Any) -> tuple[str, Any]:
        return ("stub", ch)

    stub = pool.stub("http://b:2", stub_type)
    assert pool.stub("http://b:2", stub_type) is stub and stub[1] is pool.channel("http://b:2")
    assert pool.stub("http://b:2", lambda ch: ("other", ch)) is not stub  # one stub per type
    assert "http://b:2" in pool
    before = _Channel.closed
    await pool.close()
    assert _Channel.closed == before + 2 and "http://a:1" not in pool
    assert pool.channel("http://a:1") is not a  # a later use opens a new one
    await pool.close()

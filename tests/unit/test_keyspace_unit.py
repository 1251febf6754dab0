"""Pure tests of the keyspace: key layout builders/parsers, value decoders, and applying watch
responses to a mirror (driven with synthetic etcd WatchResponses, checked against a model)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aetcd import rpc
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.allocator.keys import (
    AssignmentKey,
    KeyKind,
    assignment_key,
    check_component,
    item_assignments_prefix,
    items_key,
    key_kind,
    members_key,
    parse_assignment_key,
    parse_item_key,
    parse_member_key,
)
from gazette.broker.keys import broker_decoder
from gazette.consumer.keys import consumer_decoder
from gazette.etcd.keyspace import DecodeError, KeyLayoutError, KeySpace, prefix_end
from gazette.protocol import consumer_pb2
from gazette.protocol import protocol_pb2 as pb

ROOT = "/gazette/cluster"

# Key components: any characters above '#', including '/' (journal names have them) and
# non-ASCII text.
component = st.text(
    alphabet=st.characters(min_codepoint=ord("#") + 1, exclude_categories=["Cs"]),
    min_size=1,
    max_size=12,
)


# -- key layout ---------------------------------------------------------------------------------


def test_layout_matches_gazette() -> None:
    assert items_key(ROOT, "a/journal") == "/gazette/cluster/items/a/journal"
    assert members_key(ROOT, "us-east", "broker-1") == "/gazette/cluster/members/us-east#broker-1"
    assert (
        assignment_key(ROOT, "a/journal", "us-east", "broker-1", 2)
        == "/gazette/cluster/assign/a/journal#us-east#broker-1#2"
    )
    assert item_assignments_prefix(ROOT, "a/journal") == "/gazette/cluster/assign/a/journal#"


@given(name=component)
def test_item_key_round_trip(name: str) -> None:
    key = items_key(ROOT, name)
    assert key_kind(ROOT, key) is KeyKind.ITEM
    assert parse_item_key(ROOT, key) == name


@given(zone=component, suffix=component)
def test_member_key_round_trip(zone: str, suffix: str) -> None:
    key = members_key(ROOT, zone, suffix)
    assert key_kind(ROOT, key) is KeyKind.MEMBER
    assert parse_member_key(ROOT, key) == (zone, suffix)


@given(item=component, zone=component, suffix=component, slot=st.integers(0, 10_000))
def test_assignment_key_round_trip(item: str, zone: str, suffix: str, slot: int) -> None:
    key = assignment_key(ROOT, item, zone, suffix, slot)
    assert key_kind(ROOT, key) is KeyKind.ASSIGNMENT
    assert parse_assignment_key(ROOT, key) == AssignmentKey(item, zone, suffix, slot)
    assert key.startswith(item_assignments_prefix(ROOT, item))


@given(a=st.tuples(component, component, component), b=st.tuples(component, component, component))
def test_assignment_key_order_is_entity_order(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    # '#' sorts below every component character, so keys order like (item, zone, suffix).
    ka, kb = assignment_key(ROOT, *a, 0), assignment_key(ROOT, *b, 0)
    assert (ka < kb) == (a < b)


@pytest.mark.parametrize("bad", ["has space", "has#hash", "tab\there", 'quote"', "bang!"])
def test_invalid_components_are_refused(bad: str) -> None:
    with pytest.raises(KeyLayoutError):
        check_component("thing", bad)
    with pytest.raises(KeyLayoutError):
        items_key(ROOT, bad)
    with pytest.raises(KeyLayoutError):
        members_key(ROOT, "zone", bad)


@pytest.mark.parametrize(
    "key",
    [
        "/gazette/cluster/members/zone-only",
        "/gazette/cluster/members/a#b#c",
        "/gazette/cluster/members/#b",
    ],
)
def test_bad_member_keys(key: str) -> None:
    with pytest.raises(KeyLayoutError):
        parse_member_key(ROOT, key)


@pytest.mark.parametrize(
    "key",
    [
        "/gazette/cluster/assign/item#zone#suffix",
        "/gazette/cluster/assign/item#zone#suffix#x",
        "/gazette/cluster/assign/item#zone#suffix#-1",
        "/gazette/cluster/assign/item#zone#suffix#1#2",
        "/gazette/cluster/items/item#zone#suffix#1",
    ],
)
def test_bad_assignment_keys(key: str) -> None:
    with pytest.raises(KeyLayoutError):
        parse_assignment_key(ROOT, key)


def test_empty_components() -> None:
    # Builders allow empty components (an empty item name yields the items prefix, as in
    # Gazette); parsers refuse them.
    assert items_key(ROOT, "") == ROOT + "/items/"
    with pytest.raises(KeyLayoutError):
        check_component("thing", "")
    with pytest.raises(KeyLayoutError):
        parse_item_key(ROOT, ROOT + "/items/")
    with pytest.raises(KeyLayoutError):
        parse_assignment_key(ROOT, assignment_key(ROOT, "", "z", "s", 0))


def test_key_kind_rejects_other_keys() -> None:
    with pytest.raises(KeyLayoutError):
        key_kind(ROOT, "/gazette/cluster/other/x")
    with pytest.raises(KeyLayoutError):
        key_kind(ROOT, "/gazette/cluster2/items/x")


def test_assignment_slot_must_not_be_negative() -> None:
    with pytest.raises(KeyLayoutError):
        assignment_key(ROOT, "item", "zone", "suffix", -1)


@given(prefix=st.text(max_size=6), key=st.text(max_size=8))
def test_prefix_end_bounds_exactly_the_prefixed_keys(prefix: str, key: str) -> None:
    end = prefix_end(prefix)
    inside = key >= prefix and (end is None or key < end)
    assert inside == key.startswith(prefix)


@pytest.mark.parametrize("root", ["", "/", "/a/", "a//b", "/a/./b", "."])
def test_keyspace_root_must_be_clean(root: str) -> None:
    with pytest.raises(KeyLayoutError):
        KeySpace(root, lambda k, v: v)


# -- decoders -----------------------------------------------------------------------------------


def test_broker_decoder() -> None:
    decode = broker_decoder(ROOT)
    spec = pb.JournalSpec(name="a/journal", replication=3)
    assert decode(items_key(ROOT, "a/journal"), spec.SerializeToString()) == spec
    with pytest.raises(DecodeError, match="differs from key"):
        decode(items_key(ROOT, "other"), spec.SerializeToString())
    with pytest.raises(DecodeError):
        decode(items_key(ROOT, "a/journal"), b"\xff\xff\xff")

    broker = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(id=pb.ProcessSpec.ID(zone="z", suffix="b1"), endpoint="h:1"),
        journal_limit=10,
    )
    assert decode(members_key(ROOT, "z", "b1"), broker.SerializeToString()) == broker
    with pytest.raises(DecodeError, match="differs from key"):
        decode(members_key(ROOT, "z", "b2"), broker.SerializeToString())

    route = pb.Route(members=[pb.ProcessSpec.ID(zone="z", suffix="b1")], primary=0)
    akey = assignment_key(ROOT, "a/journal", "z", "b1", 0)
    assert decode(akey, route.SerializeToString()) == route
    assert decode(akey, b"") is None
    with pytest.raises(KeyLayoutError):
        decode(ROOT + "/unknown/x", b"")


def test_consumer_decoder() -> None:
    decode = consumer_decoder(ROOT)
    shard = consumer_pb2.ShardSpec(id="shard-000")
    assert decode(items_key(ROOT, "shard-000"), shard.SerializeToString()) == shard
    with pytest.raises(DecodeError):
        decode(items_key(ROOT, "shard-001"), shard.SerializeToString())
    consumer = consumer_pb2.ConsumerSpec(
        process_spec=pb.ProcessSpec(id=pb.ProcessSpec.ID(zone="z", suffix="c1"))
    )
    assert decode(members_key(ROOT, "z", "c1"), consumer.SerializeToString()) == consumer
    status = consumer_pb2.ReplicaStatus(code=consumer_pb2.ReplicaStatus.PRIMARY)
    akey = assignment_key(ROOT, "shard-000", "z", "c1", 0)
    assert decode(akey, status.SerializeToString()) == status
    assert decode(akey, b"").code == consumer_pb2.ReplicaStatus.IDLE


# -- applying watch responses -------------------------------------------------------------------


def _decode_text(key: str, raw: bytes) -> str:
    if raw.startswith(b"bad"):
        raise ValueError("bad value")
    return raw.decode()


class EtcdModel:
    """Just enough of etcd's MVCC bookkeeping to produce realistic watch events."""

    def __init__(self) -> None:
        self.revision = 1
        self.live: dict[str, tuple[int, int]] = {}  # key -> (create_revision, version)

    def txn(self, ops: list[tuple[str, bytes | None]]) -> Any:
        """One transaction (distinct keys): a WatchResponse with its events at one revision."""
        self.revision += 1
        response = rpc.WatchResponse()
        response.header.revision = self.revision
        response.header.cluster_id = 7
        for key, value in ops:
            event = response.events.add()
            event.kv.key = key.encode()
            event.kv.mod_revision = self.revision
            if value is None:
                event.type = rpc.Event.DELETE
                del self.live[key]
            else:
                create, version = self.live.get(key, (self.revision, 0))
                self.live[key] = (create, version + 1)
                event.type = rpc.Event.PUT
                event.kv.value = value
                event.kv.create_revision = create
                event.kv.version = version + 1
        return response


KEYS = [f"{ROOT}/k{i}" for i in range(6)]

op_strategy = st.lists(
    st.tuples(
        st.sampled_from(KEYS),
        st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"bad"])),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda op: op[0],
)


@settings(max_examples=150, deadline=None)
@given(txns=st.lists(op_strategy, max_size=25), cuts=st.lists(st.integers(0, 25), max_size=6))
def test_apply_matches_model(txns: list[list[tuple[str, bytes | None]]], cuts: list[int]) -> None:
    etcd = EtcdModel()
    ks = KeySpace(ROOT, _decode_text)
    expected: dict[str, str] = {}  # last good decoded value of each live key
    responses = []
    for ops in txns:
        ops = [(k, v) for k, v in ops if v is not None or k in etcd.live]
        if not ops:
            continue
        responses.append(etcd.txn(ops))
        for key, value in ops:
            if value is None:
                expected.pop(key, None)
            elif not value.startswith(b"bad"):
                expected[key] = value.decode()

    observed: list[int] = []
    ks.observers.append(lambda: observed.append(ks.revision))
    # Apply in arbitrary batches: the result must not depend on how responses were grouped.
    bounds = sorted({0, len(responses), *(c for c in cuts if c <= len(responses))})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        ks.apply(responses[lo:hi])

    assert {kv.key: kv.value for kv in ks.key_values} == expected
    assert [kv.key for kv in ks.key_values] == sorted(expected)
    assert observed == sorted(set(observed))  # one call per batch, revisions increasing
    if responses:
        assert ks.revision == etcd.revision
    for kv in ks.key_values:
        create, version = etcd.live[kv.key]
        assert kv.create_revision == create
        assert ks.search(kv.key) is kv


def test_apply_rejects_revisions_going_backwards() -> None:
    etcd = EtcdModel()
    ks = KeySpace(ROOT, _decode_text)
    first = etcd.txn([(KEYS[0], b"a")])
    ks.apply([first])
    with pytest.raises(Exception, match="do not follow mirror revision"):
        ks.apply([first])


def test_progress_notification_changes_nothing_visible() -> None:
    ks = KeySpace(ROOT, _decode_text)
    calls: list[int] = []
    ks.observers.append(lambda: calls.append(1))
    progress = rpc.WatchResponse()
    progress.header.revision = 50
    ks.apply([progress])
    assert ks.revision == 0 and calls == []


def test_range_and_prefixed() -> None:
    etcd = EtcdModel()
    ks = KeySpace(ROOT, _decode_text)
    keys = [f"{ROOT}/items/a", f"{ROOT}/items/a/b", f"{ROOT}/items/ab", f"{ROOT}/members/z#1"]
    ks.apply([etcd.txn([(k, b"v") for k in keys])])
    assert [kv.key for kv in ks.prefixed(f"{ROOT}/items/a")] == keys[:3]
    assert [kv.key for kv in ks.prefixed(f"{ROOT}/items/a/")] == [keys[1]]
    assert [kv.key for kv in ks.prefixed(f"{ROOT}/members/")] == [keys[3]]
    assert [kv.key for kv in ks.range(f"{ROOT}/items/a/", None)] == keys[1:]
    assert ks.index(f"{ROOT}/items/aa") == (2, False)
    assert ks.search(f"{ROOT}/items/aa") is None


async def test_waiters_wake_after_observers() -> None:
    etcd = EtcdModel()
    ks = KeySpace(ROOT, _decode_text)
    order: list[str] = []
    ks.observers.append(lambda: order.append("observer"))

    async def waiter() -> None:
        await ks.wait_for_revision(3)
        order.append("waiter")

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # let the waiter block
    ks.apply([etcd.txn([(KEYS[0], b"a")])])  # revision 2: not enough
    await asyncio.sleep(0)
    assert order == ["observer"]
    ks.apply([etcd.txn([(KEYS[1], b"b")])])  # revision 3
    await asyncio.wait_for(task, 5)
    assert order == ["observer", "observer", "waiter"]
    with pytest.raises(TimeoutError):
        await ks.wait_for_revision(4, timeout=0.01)

"""``item_route``'s cache of Routes: after any batch of keyspace changes, every item's Route is
the one built from scratch (property test over random puts and deletes of assignments and
members), and callers own the Route they get."""

from __future__ import annotations

from aetcd import rpc
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.allocator.keys import assignment_key, members_key, parse_assignment_key
from gazette.allocator.specs import attach_endpoints, init_route, item_route
from gazette.broker.keys import broker_decoder
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import protocol_pb2 as pb

ROOT = "/cache"
ITEMS = ["a/one", "a/two", "b"]
MEMBERS = [("z1", "m1"), ("z1", "m2"), ("z2", "m3")]


class Feed:
    def __init__(self) -> None:
        self.ks = KeySpace(ROOT, broker_decoder(ROOT))
        self.revision = 1

    def batch(self, ops: list[tuple[str, bytes | None]]) -> None:
        self.revision += 1
        resp = rpc.WatchResponse()
        resp.header.revision, resp.header.cluster_id = self.revision, 1
        for key, value in ops:
            ev = resp.events.add()
            ev.kv.key = key.encode()
            ev.kv.mod_revision = self.revision
            if value is None:
                ev.type = rpc.Event.DELETE
            else:
                ev.kv.value, ev.kv.create_revision, ev.kv.version = value, self.revision, 1
        self.ks.apply([resp])


def member(zone: str, suffix: str, endpoint: str) -> tuple[str, bytes]:
    spec = pb.BrokerSpec(journal_limit=10)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = endpoint
    return members_key(ROOT, zone, suffix), spec.SerializeToString()


def from_scratch(ks: KeySpace, item: str) -> pb.Route:
    kvs = ks.prefixed(f"{ROOT}/assign/{item}#")
    route = init_route(parse_assignment_key(ROOT, kv.key) for kv in kvs)
    attach_endpoints(ks, route)
    return route


op = st.one_of(
    st.tuples(st.just("assign"), st.sampled_from(ITEMS), st.integers(0, 2), st.integers(0, 2),
              st.booleans()),
    st.tuples(st.just("member"), st.integers(0, 2), st.integers(0, 3), st.booleans(), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(op, min_size=1, max_size=4), max_size=12))
def test_routes_follow_every_batch(batches: list[list[tuple[str, object, int, int, bool]]]) -> None:
    feed = Feed()
    feed.batch([member(z, s, f"http://{s}:0") for z, s in MEMBERS])
    for batch in batches:
        ops: list[tuple[str, bytes | None]] = []
        for kind, a, b, c, put in batch:
            if kind == "assign":
                zone, suffix = MEMBERS[b]
                ops.append((assignment_key(ROOT, str(a), zone, suffix, c), b"" if put else None))
            else:
                zone, suffix = MEMBERS[int(str(a))]
                ops.append(member(zone, suffix, f"http://{suffix}:{b}") if put else
                           (members_key(ROOT, zone, suffix), None))
        feed.batch(list(dict(ops).items()))  # one event per key per revision, as etcd
        for item in ITEMS:
            route, assignments = item_route(feed.ks, item)
            assert route == from_scratch(feed.ks, item)
            assert [kv.key for kv in assignments] == [kv.key for kv in feed.ks.prefixed(f"{ROOT}/assign/{item}#")]


def test_callers_own_their_route() -> None:
    feed = Feed()
    feed.batch([member("z1", "m1", "http://m1:0"), (assignment_key(ROOT, "b", "z1", "m1", 0), b"")])
    first, _ = item_route(feed.ks, "b")
    first.primary = 7
    del first.members[:]
    again, _ = item_route(feed.ks, "b")
    assert again.primary == 0 and len(again.members) == 1 and list(again.endpoints) == ["http://m1:0"]


def test_items_with_one_route_share_it_and_equal_assignment_values_share_one_decode() -> None:
    """A cluster's routes repeat (a few member orderings, whatever the item count): items
    whose routes are equal share one cached Route, and assignments whose values are equal
    bytes share one decoded Route, while every caller still gets a Route of its own."""
    from gazette.allocator import specs

    feed = Feed()
    value = pb.Route(primary=0)
    value.members.add(zone="z1", suffix="m1")
    raw = value.SerializeToString()
    feed.batch([member("z1", "m1", "http://m1:0")]
               + [(assignment_key(ROOT, item, "z1", "m1", 0), raw) for item in ITEMS])
    decoded = [feed.ks.prefixed(f"{ROOT}/assign/{item}#")[0].value for item in ITEMS]
    assert all(d == value for d in decoded) and all(d is decoded[0] for d in decoded)
    routes = [item_route(feed.ks, item)[0] for item in ITEMS]
    assert all(r == routes[0] for r in routes) and routes[0] is not routes[1]
    cache = specs._ROUTE_CACHES[feed.ks]
    cached = [cache._routes[item] for item in ITEMS]
    assert all(c is cached[0] for c in cached)
    # A member's endpoint changes: every route is built again, with the new endpoint.
    feed.batch([member("z1", "m1", "http://m1:1")])
    assert [list(item_route(feed.ks, item)[0].endpoints) for item in ITEMS] == [["http://m1:1"]] * 3

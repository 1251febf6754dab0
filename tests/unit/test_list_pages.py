"""A broker's List answer in pages: ``Broker.list_journals`` builds responses of at most
``page_size`` journals, in name order, the first carrying the status and header; the key
(count, greatest mod revision) covers every page."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aetcd import rpc
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.allocator import item_route
from gazette.allocator.keys import assignment_key, items_key, members_key
from gazette.broker.keys import broker_decoder
from gazette.broker.server import Broker
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb

ROOT = "/pages"


def _keyspace(n: int) -> KeySpace:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    resp = rpc.WatchResponse()
    resp.header.revision, resp.header.cluster_id = 2, 1
    for i in range(n):
        name = f"p/j-{i}"
        for key, value in ((items_key(ROOT, name), pb.JournalSpec(name=name, replication=1).SerializeToString()),
                           (assignment_key(ROOT, name, "z", "b", 0), b"")):
            ev = resp.events.add()
            ev.kv.key, ev.kv.value = key.encode(), value
            ev.kv.mod_revision = ev.kv.create_revision = 2
            ev.kv.version = 1
    ks.apply([resp])
    return ks


def test_pages_of_at_most_page_size() -> None:
    ks = _keyspace(5)
    header = pb.Header()
    header.etcd.revision = 2
    broker = SimpleNamespace(keyspace=ks, resolver=SimpleNamespace(header=lambda: header))
    raw, key = Broker.list_journals(broker, labels.LabelSelector(), None, 2)  # type: ignore[arg-type]
    pages = [pb.ListResponse.FromString(p) for p in raw]
    assert [len(p.journals) for p in pages] == [2, 2, 1]
    assert pages[0].status == pb.OK and pages[0].header.etcd.revision == 2
    assert all(not p.HasField("header") for p in pages[1:])
    assert [j.spec.name for p in pages for j in p.journals] == [f"p/j-{i}" for i in range(5)]
    assert all(j.route.primary == 0 for p in pages for j in p.journals)
    assert key == (5, 2)

    none, key = Broker.list_journals(broker, labels.LabelSelector.parse("name=nope"), None, 2)  # type: ignore[arg-type]
    empty = pb.ListResponse.FromString(none[0])
    assert len(none) == 1 and not empty.journals and empty.status == pb.OK and key == (0, -1)


journal = st.fixed_dictionaries({
    "replication": st.integers(0, 3),
    "labels": st.lists(st.tuples(st.sampled_from(["app", "zone", "x.y/z"]), st.text("abc-", max_size=4)),
                       max_size=3),
    "members": st.lists(st.sampled_from([("za", "b1"), ("zb", "b2"), ("za", "b3")]), max_size=3, unique=True),
    "revision": st.integers(2, 1 << 40),
})


@settings(max_examples=60, deadline=None)
@given(st.lists(journal, max_size=8), st.integers(1, 4))
def test_pages_built_from_bytes_are_what_protobuf_builds(journals: list[dict[str, Any]], page_size: int) -> None:
    """Each page, built from the specs' raw bytes and the routes' cached serialization, is
    byte for byte the ListResponse protobuf builds by copying each spec and route."""
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    resp = rpc.WatchResponse()
    resp.header.revision, resp.header.cluster_id = 1 << 41, 1
    for zone, suffix in [("za", "b1"), ("zb", "b2"), ("za", "b3")]:
        spec = pb.BrokerSpec(journal_limit=10)
        spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
        spec.process_spec.endpoint = f"http://{suffix}:8080"
        ev = resp.events.add()
        ev.kv.key, ev.kv.value = members_key(ROOT, zone, suffix).encode(), spec.SerializeToString()
        ev.kv.mod_revision = ev.kv.create_revision = ev.kv.version = 1
    for i, j in enumerate(journals):
        name = f"p/j-{i}"
        spec = pb.JournalSpec(name=name, replication=j["replication"])
        for k, v in j["labels"]:
            spec.labels.labels.add(name=k, value=v)
        ev = resp.events.add()
        ev.kv.key, ev.kv.value = items_key(ROOT, name).encode(), spec.SerializeToString()
        ev.kv.mod_revision, ev.kv.create_revision, ev.kv.version = j["revision"], j["revision"] // 2, 1
        for slot, (zone, suffix) in enumerate(j["members"]):
            ev = resp.events.add()
            ev.kv.key, ev.kv.value = assignment_key(ROOT, name, zone, suffix, slot).encode(), b""
            ev.kv.mod_revision = ev.kv.create_revision = ev.kv.version = 1
    ks.apply([resp])
    header = pb.Header()
    header.etcd.revision = 7
    broker = SimpleNamespace(keyspace=ks, resolver=SimpleNamespace(header=lambda: header))
    raw, key = Broker.list_journals(broker, labels.LabelSelector(), None, page_size)  # type: ignore[arg-type]

    expected = [pb.ListResponse(status=pb.OK, header=header)]
    for i in range(len(journals)):
        if len(expected[-1].journals) == page_size:
            expected.append(pb.ListResponse())
        kv = ks.search(items_key(ROOT, f"p/j-{i}"))
        assert kv is not None
        e = expected[-1].journals.add(mod_revision=kv.mod_revision, create_revision=kv.create_revision)
        e.spec.CopyFrom(kv.value)
        e.route.CopyFrom(item_route(ks, f"p/j-{i}")[0])
    assert raw == [page.SerializeToString() for page in expected]
    assert key == (len(journals), max((j["revision"] for j in journals), default=-1))

"""A broker's List answer in pages: ``Broker.list_journals`` builds responses of at most
``page_size`` journals, in name order, the first carrying the status and header; the key
(count, greatest mod revision) covers every page."""

from __future__ import annotations

from types import SimpleNamespace

from aetcd import rpc

from gazette.allocator.keys import assignment_key, items_key
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
    pages, key = Broker.list_journals(broker, labels.LabelSelector(), None, 2)  # type: ignore[arg-type]
    assert [len(p.journals) for p in pages] == [2, 2, 1]
    assert pages[0].status == pb.OK and pages[0].header.etcd.revision == 2
    assert all(not p.HasField("header") for p in pages[1:])
    assert [j.spec.name for p in pages for j in p.journals] == [f"p/j-{i}" for i in range(5)]
    assert all(j.route.primary == 0 for p in pages for j in p.journals)
    assert key == (5, 2)

    none, key = Broker.list_journals(broker, labels.LabelSelector.parse("name=nope"), None, 2)  # type: ignore[arg-type]
    assert len(none) == 1 and not none[0].journals and none[0].status == pb.OK and key == (0, -1)

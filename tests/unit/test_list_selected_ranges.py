"""Listing answered from the key ranges a selector names (its name, id or prefix includes)
equals the scan of every item, for random names and selectors."""

from __future__ import annotations

from consumer_cluster import MemoryEtcd
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.allocator.keys import items_key
from gazette.broker.keys import broker_decoder
from gazette.consumer.keys import consumer_decoder
from gazette.etcd.keyspace import KeySpace
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import labels
from gazette.protocol import protocol_pb2 as pb
from gazette.server import cluster

ROOT = "/gazette/test"
SEGMENTS = ["a", "ab", "b", "a-b"]
names = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map("/".join)
values = st.one_of(names, names.map(lambda n: n.rsplit("/", 1)[0] + "/" if "/" in n else n + "/"), st.just(""))
sel_label = st.tuples(st.sampled_from(["name", "prefix", "name:prefix", "prefix:prefix", "app", "id", "id:prefix"]),
                      values)


def _scan(ks: KeySpace, spec_type: type, selector: labels.LabelSelector, labels_of: cluster.LabelsOf) -> list[str]:
    out = []
    for kv in ks.prefixed(f"{ROOT}/items/"):
        if isinstance(kv.value, spec_type):
            name = kv.key[len(f"{ROOT}/items/"):]
            if selector.matches(labels_of(labels.LabelSet.from_proto(kv.value.labels), name)):
                out.append(kv.key)
    return out


@settings(max_examples=300, deadline=None)
@given(st.sets(names, min_size=1, max_size=12), st.lists(sel_label, max_size=3), st.lists(sel_label, max_size=1))
def test_journals_listed_from_ranges_equal_a_scan(items: set[str], include: list[tuple[str, str]],
                                                  exclude: list[tuple[str, str]]) -> None:
    ks = KeySpace(ROOT, broker_decoder(ROOT))
    ops = []
    for name in items:
        spec = pb.JournalSpec(name=name, replication=1)
        spec.labels.labels.add(name="app", value=name.split("/")[0])
        ops.append((items_key(ROOT, name), spec.SerializeToString()))
    MemoryEtcd(ks).write(ops)
    inc = [(n, v) for n, v in include if not n.startswith("id")]
    selector = labels.LabelSelector(labels.LabelSet(inc), labels.LabelSet([(n, v) for n, v in exclude if not n.startswith("id") and v]))
    got = [item.kv.key for item in cluster.list_items(ks, pb.JournalSpec, selector, None, labels.with_meta_labels)]
    assert got == _scan(ks, pb.JournalSpec, selector, labels.with_meta_labels)


@settings(max_examples=200, deadline=None)
@given(st.sets(names.map(lambda n: n.replace("/", "-")), min_size=1, max_size=12), st.lists(sel_label, max_size=3))
def test_shards_listed_from_ranges_equal_a_scan(items: set[str], include: list[tuple[str, str]]) -> None:
    ks = KeySpace(ROOT, consumer_decoder(ROOT))
    ops = []
    for shard in items:
        spec = pc.ShardSpec(id=shard)
        spec.sources.add(journal="src/j")
        spec.labels.labels.add(name="app", value=shard[:1])
        ops.append((items_key(ROOT, shard), spec.SerializeToString()))
    MemoryEtcd(ks).write(ops)
    inc = [(n.replace("/", "-"), v.replace("/", "-")) for n, v in include if n.startswith(("id", "app"))]
    selector = labels.LabelSelector(labels.LabelSet(inc), labels.LabelSet())
    got = [item.kv.key for item in cluster.list_items(ks, pc.ShardSpec, selector, None, labels.with_shard_meta_labels)]
    assert got == _scan(ks, pc.ShardSpec, selector, labels.with_shard_meta_labels)


def test_a_name_include_narrows_to_its_keys() -> None:
    sel = labels.LabelSelector(labels.LabelSet([("name", "a/b"), ("name", "c")]), labels.LabelSet())
    assert cluster.selected_ranges(sel, journals=True) == [("a/b", "a/b\0"), ("c", "c\0")]
    sel = labels.LabelSelector(labels.LabelSet([("prefix", "a/")]), labels.LabelSet())
    assert cluster.selected_ranges(sel, journals=True) == [("a/", None)]
    assert cluster.selected_ranges(labels.LabelSelector(labels.LabelSet([("app", "x")]), labels.LabelSet()),
                                   journals=True) is None

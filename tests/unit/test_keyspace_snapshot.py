"""The keyspace's chunked snapshot against a sorted dict: random batches of puts and deletes,
with chunks small enough to split and empty often; every earlier snapshot unchanged."""

from __future__ import annotations

import bisect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.etcd import keyspace
from gazette.etcd.keyspace import KeyValue, _Snapshot

KEYS = [f"k{i:03d}" for i in range(60)]


def _kv(key: str, value: int) -> KeyValue:
    return KeyValue(key=key, value=value, raw=b"", create_revision=1, mod_revision=value, version=1, lease=0)


def _step(entry: KeyValue | None, key: str, events: list[Any]) -> KeyValue | None:
    for op in events:  # each op: an int to put, or None to delete
        entry = None if op is None else _kv(key, op)
    return entry


batch = st.dictionaries(st.sampled_from(KEYS), st.lists(st.one_of(st.none(), st.integers(1, 99)), min_size=1,
                                                         max_size=3), min_size=1, max_size=25)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyspace, "_CHUNK", 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(batch, min_size=1, max_size=15), st.sampled_from(KEYS), st.sampled_from([*KEYS, None]))
def test_snapshot_matches_a_sorted_dict(batches: list[dict[str, list[Any]]], start: str, end: str | None) -> None:
    model: dict[str, int] = {}
    snap = _Snapshot.of([])
    history: list[tuple[_Snapshot, dict[str, int]]] = []
    for b in batches:
        groups = sorted(b.items())
        snap = snap.updated(groups, _step)
        for key, ops in groups:
            if ops[-1] is None:
                model.pop(key, None)
            else:
                model[key] = ops[-1]
        history.append((snap, dict(model)))
        ordered = sorted(model)
        assert [kv.key for kv in snap.all()] == ordered
        assert [kv.value for kv in snap.all()] == [model[k] for k in ordered]
        assert snap.size == len(model)
        assert all(len(keys) <= 2 * keyspace._CHUNK for keys, _ in snap.chunks)
        for key in KEYS:
            found = snap.search(key)
            assert (found.value if found else None) == model.get(key)
            assert snap.index(key) == (bisect.bisect_left(ordered, key), key in model)
        lo = bisect.bisect_left(ordered, start)
        hi = len(ordered) if end is None else max(lo, bisect.bisect_left(ordered, end))
        assert [kv.key for kv in snap.range(start, end)] == ordered[lo:hi]
    for old, expected in history:  # snapshots are never mutated by later updates
        assert {kv.key: kv.value for kv in old.all()} == expected
    assert [kv.key for kv in _Snapshot.of(snap.all()).all()] == sorted(model)

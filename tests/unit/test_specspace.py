"""gazette.specspace: coercions name what is wrong; label algebra hoists losslessly."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette import specspace as ss

_names = st.sampled_from(["app", "env", "region", "tier"])
_values = st.sampled_from(["a", "b", "c"])


@st.composite
def _labels(draw: st.DrawFn) -> ss.Labels:
    groups = draw(st.dictionaries(_names, st.lists(_values, min_size=1, max_size=2, unique=True).map(sorted)))
    return [(n, v) for n in sorted(groups) for v in groups[n]]


@given(st.lists(_labels(), min_size=1, max_size=5))
def test_hoisting_common_labels_is_lossless(items: list[ss.Labels]) -> None:
    common = functools.reduce(ss.intersect_labels, items)
    for item in items:
        rest = ss.subtract_labels(item, common)
        assert ss.union_labels(rest, common) == item
        # What was hoisted is not repeated below it.
        assert not {n for n, _ in rest} & {n for n, _ in common}


@given(_labels(), _labels())
def test_union_keeps_the_childs_names(child: ss.Labels, parent: ss.Labels) -> None:
    out = ss.union_labels(child, parent)
    child_names = {n for n, _ in child}
    assert [lb for lb in out if lb[0] in child_names] == child
    assert [lb for lb in out if lb[0] not in child_names] == [lb for lb in parent if lb[0] not in child_names]


@given(st.one_of(st.integers(), st.booleans(), st.lists(st.integers()), st.none()))
def test_as_str_refuses_non_strings_naming_the_field(v: object) -> None:
    with pytest.raises(ss.SpecSpaceError) as info:
        ss.as_str(v if v is not None else 1, "node 'a/'", "fragment.stores[0]")
    assert info.value.where == "node 'a/'" and info.value.field == "fragment.stores[0]"


def test_checked_map_refuses_unknown_keys() -> None:
    assert ss.checked_map({"name": "x"}, "spec", ("name",)) == {"name": "x"}
    with pytest.raises(ss.SpecSpaceError, match="bogus"):
        ss.checked_map({"name": "x", "bogus": 1}, "spec", ("name",))
    with pytest.raises(ss.SpecSpaceError):
        ss.checked_map(["not", "a", "map"], "spec", ("name",))


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=5))
def test_dump_then_load_reads_strings_back_as_strings(doc: dict[str, str]) -> None:
    # Strings that YAML would otherwise read as numbers, booleans or null ("1.50", "yes",
    # "~") are written quoted, so each reads back as the same text.
    assert ss.load_document(ss.dump({"doc": doc})) == {"doc": doc}

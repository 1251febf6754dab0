"""``gazctl shards prune``'s decision: which fragments any hints still need (Gazette's
``overlapsAnySegment`` and ``foldHintsIntoSegments``), across forked logs."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from gazette.cli.gazctl.shards.prune import fold_hints, overlaps
from gazette.protocol import protocol_pb2 as pb
from gazette.recoverylog import FnodeSegments, FSMHints, Segment


def seg(log: str, first_seq: int, last_seq: int, first: int, last: int) -> Segment:
    return Segment(author=7, first_seq_no=first_seq, first_offset=first, first_checksum=0,
                   last_seq_no=last_seq, last_offset=last, log=log)


def frag(begin: int, end: int) -> pb.Fragment:
    return pb.Fragment(journal="l", begin=begin, end=end)


def test_forked_hints_keep_the_parent_log_segments_and_the_tail_is_open() -> None:
    # fnode 1 lives in the parent log's [100, 200); fnode 5 spans the fork into the child.
    hints = FSMHints(log="child", live_nodes=[
        FnodeSegments(1, [seg("parent", 1, 2, 100, 200)]),
        FnodeSegments(5, [seg("parent", 5, 6, 400, 500), seg("child", 7, 9, 0, 300)]),
    ])
    sets: dict[str, list[Segment]] = defaultdict(list)
    fold_hints(hints, sets)
    assert [(s.first_offset, s.last_offset) for s in sets["parent"]] == [(100, 200), (400, 500)]
    assert [(s.first_offset, s.last_offset) for s in sets["child"]] == [(0, 0)]  # open-ended
    parent = sets["parent"]
    assert not overlaps(parent, frag(0, 100))  # before the first segment: prunable
    assert overlaps(parent, frag(150, 160)) and overlaps(parent, frag(199, 300))
    assert not overlaps(parent, frag(200, 400))  # between segments: prunable
    assert overlaps(parent, frag(450, 9000))
    assert not overlaps(parent, frag(500, 600))
    assert overlaps(sets["child"], frag(10_000, 20_000))  # everything after the last segment


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200)), min_size=1, max_size=6),
       st.integers(0, 1200), st.integers(1, 300))
def test_overlap_is_byte_intersection(spans: list[tuple[int, int]], begin: int, length: int) -> None:
    segs = [seg("l", i + 1, i + 1, first, first + n) for i, (first, n) in enumerate(spans)]
    want = any(max(s.first_offset, begin) < min(s.last_offset, begin + length) for s in segs)
    assert overlaps(segs, frag(begin, begin + length)) == want

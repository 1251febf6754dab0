"""Segments: the parts of a log that hold one author's consecutive operations.

A ``Segment`` says "author A wrote ops ``first_seq_no..last_seq_no``, beginning at or after
``first_offset`` of ``log`` (and ending at ``last_offset``, when known; 0 means unknown)". A
``SegmentSet`` is an ordered, non-overlapping set of them, merging segments that overlap or
abut under the same author and log, and refusing segments that contradict each other (as
Gazette's ``SegmentSet.Add``): this is what lets hints name exactly which parts of a log, and
of which forked logs, a player must read.

Invariants:

* A set is ordered by ``first_seq_no``; neighbours never overlap, and two adjacent neighbours
  differ in author or log (else they would have merged).
* Within one log, offsets are monotonic with sequence numbers; ``first_checksum`` of two
  segments beginning at the same sequence number agree.
* A segment whose ``last_offset`` is unknown is followed only by segments of the same log.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from gazette.recoverylog.errors import HintsError

__all__ = ["Segment", "SegmentSet"]


@dataclass(slots=True)
class Segment:
    author: int
    first_seq_no: int
    first_offset: int
    first_checksum: int
    last_seq_no: int
    last_offset: int
    log: str

    def validate(self) -> None:
        if self.author == 0:
            raise HintsError(f"segment {self}: author is zero")
        if self.first_seq_no <= 0:
            raise HintsError(f"segment {self}: first_seq_no <= 0")
        if self.first_offset < 0:
            raise HintsError(f"segment {self}: first_offset < 0")
        if self.last_seq_no < self.first_seq_no:
            raise HintsError(f"segment {self}: last_seq_no < first_seq_no")
        if self.last_offset != 0 and self.last_offset <= self.first_offset:
            raise HintsError(f"segment {self}: last_offset <= first_offset")
        if not self.log:
            raise HintsError(f"segment {self}: log is empty")


class _NotReducible(Exception):
    pass


def _nonzero_less(a: int, b: int) -> bool:
    return a != 0 and a < b


def _reduce(a: Segment, b: Segment) -> Segment:
    """The union of two segments; ``_NotReducible`` if they are disjoint, ``HintsError`` if
    they contradict each other."""
    if a.first_seq_no > b.first_seq_no or (a.first_seq_no == b.first_seq_no and a.last_seq_no < b.last_seq_no):
        a, b = b, a
    same_log = a.log == b.log
    if a.first_seq_no < b.first_seq_no and same_log and a.first_offset > b.first_offset:
        raise HintsError(f"expected monotonic first_offset: {a} vs {b}")
    if a.first_seq_no < b.first_seq_no and a.last_offset == 0 and b.last_offset != 0:
        raise HintsError(f"expected preceding segment to also include last_offset: {a} vs {b}")
    if a.last_offset == 0 and not same_log:
        raise HintsError(f"a segment cannot change log where the preceding last_offset is zero: {a} vs {b}")
    if same_log and ((a.last_seq_no <= b.last_seq_no and _nonzero_less(b.last_offset, a.last_offset))
                     or (a.last_seq_no >= b.last_seq_no and _nonzero_less(a.last_offset, b.last_offset))):
        raise HintsError(f"expected monotonic last_offset: {a} vs {b}")
    if a.first_seq_no == b.first_seq_no and a.first_checksum != b.first_checksum:
        raise HintsError(f"expected first_checksum equality: {a} vs {b}")
    if a.last_seq_no + 1 < b.first_seq_no:
        raise _NotReducible
    if a.last_seq_no + 1 == b.first_seq_no and (a.author != b.author or not same_log):
        raise _NotReducible
    if a.author != b.author:
        raise HintsError(f"expected segment author equality: {a} vs {b}")
    if not same_log:
        raise HintsError(f"expected segment log equality: {a} vs {b}")
    out = replace(a)
    if a.first_seq_no == b.first_seq_no and a.first_offset < b.first_offset:
        out.first_offset = b.first_offset
    if a.last_seq_no == b.last_seq_no and a.last_offset == 0:
        out.last_offset = b.last_offset
    if a.last_seq_no < b.last_seq_no:
        out.last_seq_no, out.last_offset = b.last_seq_no, b.last_offset
    return out


class SegmentSet(list[Segment]):
    """Ordered, non-overlapping segments (see the module docstring)."""

    def add(self, segment: Segment) -> None:
        segment.validate()
        segment = replace(segment)
        begin = bisect.bisect_left([s.first_seq_no for s in self], segment.first_seq_no)
        if begin > 0:
            try:
                segment, begin = _reduce(self[begin - 1], segment), begin - 1
            except _NotReducible:
                pass
        end = begin
        while end < len(self):
            try:
                segment = _reduce(self[end], segment)
            except _NotReducible:
                break
            end += 1
        self[begin:end] = [segment]

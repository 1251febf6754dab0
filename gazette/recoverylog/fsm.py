"""The recovery log's state machine (Gazette's ``recoverylog.FSM``): which files exist, under
which paths, and which log segments hold their operations.

Applying an op checks, in order: that its author is the author of the next hinted segment (if
hints remain), that its sequence number is the next one, that its checksum chains from the
previous op; then it creates, links, unlinks, writes or sets a property. A file (``fnode``) is
named by the sequence number of the op that created it. ``build_hints`` turns the live files
into ``FSMHints``; an FSM built from them (``FSM.from_hints``) replays only those segments,
skipping every op of a file that is dead by the time the hints were taken.

Invariants:

* ``apply`` changes nothing when it raises, except ``FnodeNotTracked``: the op was consistent
  and the sequence advanced, but it concerns a file the hints say is dead, so the player
  skips its effect on disk. Every file created within the hinted segments that the hints do
  not list is such a file.
* ``links`` indexes exactly the paths of ``live_nodes``; a node with no path left is dead.
* Hints are a function of the applied ops: two FSMs that applied the same ops (from the same
  hints) build the same hints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gazette.protocol import recoverylog_pb2 as rl
from gazette.recoverylog.errors import (
    ChecksumMismatch,
    ExpectedHintedFnode,
    FnodeNotTracked,
    HintsError,
    LinkExists,
    NoSuchLink,
    NotHintedAuthor,
    PropertyExists,
    WrongSeqNo,
)
from gazette.recoverylog.hints import FnodeSegments, FSMHints
from gazette.recoverylog.ops import extend_checksum
from gazette.recoverylog.segment import Segment, SegmentSet

__all__ = ["FSM", "Node"]


@dataclass(slots=True)
class Node:
    """A live file: its current paths and the segments holding its ops."""

    links: set[str] = field(default_factory=set)
    segments: list[Segment] = field(default_factory=list)


class FSM:
    def __init__(self, log: str) -> None:
        if not log:
            raise HintsError("hints name no log")
        self.next_seq_no = 1
        self.next_checksum = 0
        self.last_log = log
        self.properties: dict[str, str] = {}
        self.live_nodes: dict[int, Node] = {}
        self.links: dict[str, int] = {}
        self._hinted_segments: list[Segment] = []
        self._hinted_fnodes: list[int] = []

    @classmethod
    def from_hints(cls, hints: FSMHints) -> FSM:
        fsm = cls(hints.log)
        fnodes, segments = live_log_segments(hints)
        fsm._hinted_fnodes = fnodes
        if segments:
            fsm.next_seq_no, fsm.next_checksum = segments[0].first_seq_no, segments[0].first_checksum
            fsm._hinted_segments = list(segments)
        fsm.properties = dict(hints.properties)
        return fsm

    @property
    def hinted_segments(self) -> list[Segment]:
        """Segments still to read (the first is the one being read)."""
        return self._hinted_segments

    def has_remaining_hints(self) -> bool:
        return bool(self._hinted_segments or self._hinted_fnodes)

    def apply(self, op: rl.RecordedOp, message: bytes | memoryview) -> None:
        """Applies ``op`` (whose message bytes are ``message``); see the module docstring."""
        if self._hinted_segments and self._hinted_segments[0].author != op.author:
            raise NotHintedAuthor(f"op {op.seq_no} by author {op.author:08x} is not of the hinted "
                                  f"author {self._hinted_segments[0].author:08x}")
        if op.seq_no != self.next_seq_no:
            raise WrongSeqNo(f"op has seq_no {op.seq_no}, expected {self.next_seq_no}")
        if op.checksum != self.next_checksum:
            raise ChecksumMismatch(f"op {op.seq_no} has checksum {op.checksum:08x}, "
                                   f"expected {self.next_checksum:08x}")
        not_tracked: FnodeNotTracked | None = None
        if op.HasField("create"):
            not_tracked = self._create(op)
        elif self._hinted_fnodes and self._hinted_fnodes[0] == op.seq_no:
            raise ExpectedHintedFnode(f"op {op.seq_no} is not the create the hints expect")
        elif op.HasField("link"):
            not_tracked = self._link(op)
        elif op.HasField("unlink"):
            not_tracked = self._unlink(op)
        elif op.HasField("write"):
            not_tracked = self._write(op)
        elif op.HasField("property"):
            self._property(op.property)
        self.next_seq_no += 1
        self.next_checksum = extend_checksum(self.next_checksum, message)
        self.last_log = op.log
        if self._hinted_segments and self._hinted_segments[0].last_seq_no < self.next_seq_no:
            del self._hinted_segments[0]
            if self._hinted_segments:
                self.next_seq_no = self._hinted_segments[0].first_seq_no
                self.next_checksum = self._hinted_segments[0].first_checksum
        if not_tracked is not None:
            raise not_tracked

    def _create(self, op: rl.RecordedOp) -> FnodeNotTracked | None:
        path = op.create.path
        if path in self.links:
            raise LinkExists(f"create of {path}: the path exists")
        if path in self.properties:
            raise PropertyExists(f"create of {path}: a property has that path")
        fnode = op.seq_no
        if self._hinted_fnodes and self._hinted_fnodes[0] == fnode:
            del self._hinted_fnodes[0]
        elif self._hinted_fnodes or self._hinted_segments:
            # Within the hinted segments, a file the hints do not list was dead when they were
            # taken, even once every hinted file has been created: a segment of a live file can
            # span its creation (one author's consecutive ops), while the op that killed it lies
            # in no hinted segment. Gazette's FSM tracks such a file once the hinted fnodes run
            # out, and then fails on a later link to its path (LinkExists).
            return FnodeNotTracked(f"fnode {fnode} ({path}) is dead in the hints")
        node = Node(links={path})
        self._extend(node, op)
        self.live_nodes[fnode] = node
        self.links[path] = fnode
        return None

    def _link(self, op: rl.RecordedOp) -> FnodeNotTracked | None:
        path, fnode = op.link.path, op.link.fnode
        if path in self.links:
            raise LinkExists(f"link of {path}: the path exists")
        if path in self.properties:
            raise PropertyExists(f"link of {path}: a property has that path")
        node = self.live_nodes.get(fnode)
        if node is None:
            return FnodeNotTracked(f"link of untracked fnode {fnode}")
        node.links.add(path)
        self.links[path] = fnode
        self._extend(node, op)
        return None

    def _unlink(self, op: rl.RecordedOp) -> FnodeNotTracked | None:
        path, fnode = op.unlink.path, op.unlink.fnode
        node = self.live_nodes.get(fnode)
        if node is None:
            return FnodeNotTracked(f"unlink of untracked fnode {fnode}")
        if path not in node.links:
            raise NoSuchLink(f"unlink of {path}: fnode {fnode} has no such link")
        del self.links[path]
        node.links.discard(path)
        self._extend(node, op)
        if not node.links:
            del self.live_nodes[fnode]
        return None

    def _write(self, op: rl.RecordedOp) -> FnodeNotTracked | None:
        node = self.live_nodes.get(op.write.fnode)
        if node is None:
            return FnodeNotTracked(f"write of untracked fnode {op.write.fnode}")
        self._extend(node, op)
        return None

    def _property(self, prop: rl.Property) -> None:
        if prop.path in self.links:
            raise LinkExists(f"property {prop.path}: a file has that path")
        self.properties[prop.path] = prop.content

    @staticmethod
    def _extend(node: Node, op: rl.RecordedOp) -> None:
        segs = node.segments
        if segs and segs[-1].author == op.author and segs[-1].log == op.log:
            segs[-1].last_seq_no = op.seq_no
            segs[-1].last_offset = op.last_offset
            return
        segs.append(Segment(author=op.author, first_seq_no=op.seq_no, first_offset=op.first_offset,
                            first_checksum=op.checksum, last_seq_no=op.seq_no,
                            last_offset=op.last_offset, log=op.log))

    def build_hints(self, log: str | None = None) -> FSMHints:
        """Hints from which an FSM rebuilds this state (segments of ``log`` elide their log)."""
        log = log or self.last_log
        nodes = []
        for fnode in sorted(self.live_nodes):
            segs = [replace(s, log="" if s.log == log else s.log) for s in self.live_nodes[fnode].segments]
            nodes.append(FnodeSegments(fnode, segs))
        return FSMHints(log=log, live_nodes=nodes, properties=dict(sorted(self.properties.items())))


def live_log_segments(hints: FSMHints) -> tuple[list[int], SegmentSet]:
    """The hinted fnodes in order, and the set of segments that hold all their ops."""
    fnodes: list[int] = []
    segments = SegmentSet()
    for node in hints.live_nodes:
        if not node.segments or node.segments[0].first_seq_no != node.fnode:
            raise HintsError(f"fnode {node.fnode}: its first segment must begin at its create")
        if fnodes and fnodes[-1] >= node.fnode:
            raise HintsError(f"fnodes are not in increasing order: {fnodes[-1]} then {node.fnode}")
        fnodes.append(node.fnode)
        for seg in node.segments:
            segments.add(replace(seg, log=seg.log or hints.log))
    if segments and segments[-1].log != hints.log:
        raise HintsError(f"hints name log {hints.log} but the last segment is of {segments[-1].log}")
    return fnodes, segments

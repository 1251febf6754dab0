"""``FSMHints``: what a player needs to rebuild a store, kept in etcd as JSON.

Hints name the log, every live file (fnode) with the log segments holding its operations, and
the properties. They are stored under the shard's ``hint_prefix``: ``{prefix}/{shard}.primary``
written by the primary as it records, and ``.backup.0..N-1`` rotated in on each recovery, so a
bad primary hint can be skipped. The JSON is Gazette's (``encoding/json`` of the Go struct:
snake_case names, zero values omitted), so Go and Python consumers read each other's hints;
binary (protobuf) hints are read too, as Gazette does for values not starting with ``{``.

Invariants:

* ``from_json(to_json(h)) == h`` and ``from_proto(to_proto(h)) == h``.
* A segment whose ``log`` is empty belongs to ``FSMHints.log``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gazette.protocol import recoverylog_pb2 as rl
from gazette.recoverylog.errors import HintsError
from gazette.recoverylog.segment import Segment

__all__ = ["FSMHints", "FnodeSegments", "hint_keys"]

_SEGMENT_FIELDS = ("author", "first_seq_no", "first_offset", "first_checksum", "last_seq_no",
                   "last_offset", "log")


@dataclass(slots=True)
class FnodeSegments:
    fnode: int
    segments: list[Segment] = field(default_factory=list)


@dataclass(slots=True)
class FSMHints:
    log: str
    live_nodes: list[FnodeSegments] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)

    # -- JSON (Gazette's encoding/json form) ---------------------------------------------

    def to_json(self) -> bytes:
        def seg(s: Segment) -> dict[str, Any]:
            return {k: getattr(s, k) for k in _SEGMENT_FIELDS if getattr(s, k)}
        doc: dict[str, Any] = {}
        if self.log:
            doc["log"] = self.log
        doc["live_nodes"] = [{**({"fnode": n.fnode} if n.fnode else {}),
                              "segments": [seg(s) for s in n.segments]} for n in self.live_nodes]
        doc["properties"] = [{"path": p, "content": c} if c else {"path": p}
                             for p, c in self.properties.items()]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> FSMHints:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise TypeError("hints are not a JSON object")
            nodes = [FnodeSegments(int(n.get("fnode", 0)), [
                Segment(author=int(s.get("author", 0)), first_seq_no=int(s.get("first_seq_no", 0)),
                        first_offset=int(s.get("first_offset", 0)),
                        first_checksum=int(s.get("first_checksum", 0)),
                        last_seq_no=int(s.get("last_seq_no", 0)), last_offset=int(s.get("last_offset", 0)),
                        log=str(s.get("log", "")))
                for s in (n.get("segments") or [])]) for n in (doc.get("live_nodes") or [])]
            props = {str(p["path"]): str(p.get("content", "")) for p in (doc.get("properties") or [])}
            return cls(log=str(doc.get("log", "")), live_nodes=nodes, properties=props)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise HintsError(f"hints do not decode: {err}") from None

    @classmethod
    def decode(cls, value: bytes) -> FSMHints:
        """From an etcd value: JSON, or protobuf when it does not begin with ``{``."""
        if value[:1] == b"{":
            return cls.from_json(value)
        msg = rl.FSMHints()
        try:
            msg.ParseFromString(value)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError
            raise HintsError(f"hints do not decode: {err}") from None
        return cls.from_proto(msg)

    # -- protobuf ---------------------------------------------------------------------------

    def to_proto(self) -> rl.FSMHints:
        msg = rl.FSMHints(log=self.log)
        for n in self.live_nodes:
            fs = msg.live_nodes.add(fnode=n.fnode)
            for s in n.segments:
                fs.segments.add(**{k: getattr(s, k) for k in _SEGMENT_FIELDS})
        for p, c in self.properties.items():
            msg.properties.add(path=p, content=c)
        return msg

    @classmethod
    def from_proto(cls, msg: rl.FSMHints) -> FSMHints:
        return cls(log=msg.log,
                   live_nodes=[FnodeSegments(n.fnode, [Segment(**{k: getattr(s, k) for k in _SEGMENT_FIELDS})
                                                       for s in n.segments]) for n in msg.live_nodes],
                   properties={p.path: p.content for p in msg.properties})


def hint_keys(hint_prefix: str, shard: str, backups: int) -> tuple[str, list[str]]:
    """(primary key, backup keys) of a shard's hints (Gazette's ``HintPrimaryKey`` and
    ``HintBackupKeys``)."""
    base = f"{hint_prefix}/{shard}"
    return f"{base}.primary", [f"{base}.backup.{i}" for i in range(backups)]

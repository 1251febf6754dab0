"""Journals with known messages, written through the client, for the Spark tests."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gazette.client.sync import SyncJournalClient
from gazette.message.uuid import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, build_uuid
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.cluster import Cluster
from gazette.testing.eventually import eventually_sync

__all__ = ["ACK_TXN", "CONTINUE_TXN", "OUTSIDE_TXN", "Msg", "apply_journal", "append_lines",
           "doc_lines", "wait_persisted"]

Msg = tuple[bytes, int, int, dict[str, Any]]  # producer, clock, flags, fields


def apply_journal(client: SyncJournalClient, name: str, *, codec: int = pb.NONE,
                  store: str = "file:///", content_type: str = "application/x-ndjson",
                  length: int = 16 << 10) -> None:
    spec = pb.JournalSpec(name=name, replication=1)
    spec.labels.labels.add(name="app.gazette.dev/message-type", value="test.Doc")
    spec.labels.labels.add(name="content-type", value=content_type)
    spec.fragment.length = length
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.stores.append(store)
    spec.fragment.refresh_interval.CopyFrom(Duration(seconds=1))
    req = pb.ApplyRequest()
    req.changes.add(upsert=spec)
    client.apply(req)


def doc_lines(msgs: Iterable[Msg]) -> list[bytes]:
    out = []
    for producer, clock, flags, fields in msgs:
        doc = {"UUID": str(build_uuid(producer, clock, flags)), **fields}
        out.append(json.dumps(doc).encode() + b"\n")
    return out


def append_lines(client: SyncJournalClient, journal: str, lines: Sequence[bytes],
                 per_append: int = 50) -> None:
    """Appends whole lines, ``per_append`` to an append (fragments roll between appends)."""
    for i in range(0, len(lines), per_append):
        client.append(journal, b"".join(lines[i: i + per_append]))


def wait_persisted(client: SyncJournalClient, journal: str, at_least: int = 2) -> None:
    """Until ``at_least`` fragments of ``journal`` are persisted to its store."""
    def persisted() -> bool | None:
        frags = client.list_fragments(journal).fragments
        return sum(1 for f in frags if f.spec.backing_store) >= at_least or None

    eventually_sync(persisted, f"{at_least} fragments of {journal} persisted", 30.0)


def cluster_root(cluster: Cluster) -> str:
    return os.fspath(cluster.file_root)

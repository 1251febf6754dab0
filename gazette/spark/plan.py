"""Planning a read: which journals match, and which byte ranges of them each task reads.

Runs on the driver. The brokers are asked twice per journal: ``List`` (specs by selector, for
names and content-types) and ``ListFragments`` (with signed URLs), and no content is read.

Invariants:

* A journal's content is planned as *segments*, each within one fragment: persisted fragments
  carry a signed URL that a task reads straight from the store (a presigned S3 GET, or a file
  below ``file_root``); content not yet persisted, and ``file://`` fragments when no
  ``file_root`` is given, are read from the brokers. Overlapping fragments (a compaction beside
  its sources) are de-overlapped greedily: each byte is planned exactly once.
* Segments start and end on fragment boundaries (or a requested offset), which are append
  boundaries; appends hold whole messages, so every segment begins and ends on a message
  boundary.
* Consecutive segments of a journal are grouped into slices of about ``partition_bytes`` (by
  default sized from the total so that every core has work); a slice is one Spark task.
  Committed mode plans one slice per journal range, because the Sequencer must see a
  journal's messages in order.
* Fragments persisted before ``begin_mod_time`` are skipped; content not yet persisted is
  always newer, so it is kept.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, TypeVar

import grpc

from gazette.client.errors import TransportError
from gazette.client.journal_client import JournalClient
from gazette.client.listing import list_journals
from gazette.message.framing import CONTENT_TYPE
from gazette.protocol import protocol_pb2 as pb
from gazette.spark.errors import BrokerUnreachableError
from gazette.spark.options import Mode, SourceOptions

__all__ = ["JournalInfo", "JournalSlice", "Segment", "balance", "list_matching", "plan_journal", "segments_of",
           "run_planning"]

T = TypeVar("T")

AUTO_MIN_PARTITION: Final = 4 << 20
AUTO_MAX_PARTITION: Final = 64 << 20


@dataclass(frozen=True, slots=True)
class Segment:
    """Journal bytes ``[begin, end)`` within one fragment."""

    begin: int
    end: int
    fragment_begin: int
    fragment_end: int
    codec: int
    #: The fragment's signed URL, or "" to read these bytes from the brokers.
    url: str = ""


@dataclass(frozen=True, slots=True)
class JournalInfo:
    name: str
    content_type: str


@dataclass(frozen=True)
class JournalSlice:
    """What one task reads: ``[begin, end)`` of one journal, as segments."""

    journal: str
    content_type: str
    begin: int
    end: int
    segments: tuple[Segment, ...]
    #: Committed mode: the Sequencer's checkpoint to resume from, as
    #: ``[[producer hex, last_ack, begin], ...]`` (producer states of this journal).
    producers: tuple[tuple[str, int, int], ...] = field(default=())

    @property
    def size(self) -> int:
        return self.end - self.begin


def run_planning(broker: str, work: Callable[[JournalClient], Awaitable[T]]) -> T:
    """Run ``work`` with a client of ``broker`` on a private event loop (the planner is
    synchronous, as Spark calls it); unreachable brokers become a clear error."""

    async def main() -> T:
        client = JournalClient(broker)
        try:
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except TransportError as err:
        if err.code is not grpc.StatusCode.UNAVAILABLE:
            raise
        raise BrokerUnreachableError(
            f"cannot reach a Gazette broker at {broker!r} (option 'broker'): {err}") from None
    except OSError as err:
        raise BrokerUnreachableError(
            f"cannot reach a Gazette broker at {broker!r} (option 'broker'): {err}") from None


async def list_matching(client: JournalClient, selector: str) -> list[JournalInfo]:
    """Journals matching ``selector``, by name."""
    resp = await list_journals(client, selector)
    out = []
    for j in resp.journals:
        ct = next((lb.value for lb in j.spec.labels.labels if lb.name == CONTENT_TYPE), "")
        out.append(JournalInfo(j.spec.name, ct))
    out.sort(key=lambda j: j.name)
    return out


def segments_of(fragments: Iterable[pb.FragmentsResponse._Fragment], begin: int, end: int,
              begin_mod_time: int, file_root: str | None) -> list[Segment]:
    ordered = sorted(fragments, key=lambda f: (f.spec.begin, -f.spec.end))
    out: list[Segment] = []
    covered = begin
    for f in ordered:
        spec = f.spec
        if spec.end <= covered or spec.begin >= end:
            continue
        if begin_mod_time and spec.mod_time and spec.mod_time < begin_mod_time:
            continue
        url = f.signed_url
        if url.startswith("file://") and file_root is None:
            url = ""  # Not reachable from here without the brokers' file root.
        if not spec.backing_store:
            url = ""
        # A gap before |start| (fragments removed by retention, or skipped by
        # begin_mod_time) is not read: there is nothing to read there.
        start = max(spec.begin, covered)
        stop = min(spec.end, end)
        out.append(Segment(start, stop, spec.begin, spec.end, int(spec.compression_codec), url))
        covered = stop
    return out


def _group(journal: JournalInfo, segments: list[Segment], target: int,
           producers: tuple[tuple[str, int, int], ...] = ()) -> list[JournalSlice]:
    slices: list[JournalSlice] = []
    run: list[Segment] = []
    size = 0
    for seg in segments:
        if run and size + seg.end - seg.begin > target:
            slices.append(JournalSlice(journal.name, journal.content_type, run[0].begin,
                                       run[-1].end, tuple(run), producers))
            run, size = [], 0
        run.append(seg)
        size += seg.end - seg.begin
    if run:
        slices.append(JournalSlice(journal.name, journal.content_type, run[0].begin,
                                   run[-1].end, tuple(run), producers))
    return slices


async def plan_journal(client: JournalClient, journal: JournalInfo, opts: SourceOptions,
                       begin: int = 0, end: int | None = None,
                       producers: tuple[tuple[str, int, int], ...] = (),
                       ) -> tuple[int, list[JournalSlice]]:
    """The write head of ``journal`` and the slices covering ``[begin, end)`` of it
    (``end`` defaults to the bound the options set, or the write head)."""
    resp = await client.list_fragments(journal.name, signature_ttl=float(opts.signature_ttl))
    head = max((f.spec.end for f in resp.fragments), default=0)
    stop = opts.end_of(journal.name, head) if end is None else min(end, head)
    if stop <= begin:
        return head, []
    segments = segments_of(resp.fragments, begin, stop, opts.begin_mod_time, opts.file_root)
    if not segments:
        return head, []
    # One slice per journal until balance() splits them.
    return head, _group(journal, segments, 1 << 62, producers)


def balance(slices: list[JournalSlice], opts: SourceOptions) -> list[JournalSlice]:
    """Slices split into tasks of about ``partition_bytes`` (by default, one per core of this
    machine, between 4 and 64 MiB: each task costs Spark a fixed ~0.1 s here, so one wave of
    tasks beats several smaller ones). Committed mode keeps one per journal: the
    Sequencer reads a journal's messages in order."""
    if opts.mode is Mode.COMMITTED:
        return slices
    target = opts.partition_bytes
    if not target:
        total = sum(sl.size for sl in slices)
        target = min(AUTO_MAX_PARTITION, max(AUTO_MIN_PARTITION,
                                             total // (os.cpu_count() or 1) + 1))
    out: list[JournalSlice] = []
    for sl in slices:
        out += _group(JournalInfo(sl.journal, sl.content_type), list(sl.segments), target,
                      sl.producers)
    return out

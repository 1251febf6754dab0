"""Read-committed rows: the Sequencer applied to parsed blocks, without decoding messages.

Runs in Spark's Python workers over one journal, block by block, in order. Each message is
given to :class:`~gazette.message.sequencer.Sequencer` as an envelope whose message names its
row, with its UUID fields computed for the whole block (``uuid_columns``), through the
message layer's replay protocol (``sequence_committed``); what the Sequencer commits becomes
the rows to keep. So committed mode drops exactly what Gazette's
``ReadCommittedIter`` drops: duplicates (clocks at or below the producer's last ACK) and
rolled-back messages, and it holds back what no ACK has committed yet.

Invariants:

* Rows of a block are kept (``retained``) while any open transaction began at or before the
  block's end: a later ACK may commit them. A commit needing a replay (its transaction is
  older than the Sequencer's ring) is replayed from the retained blocks; only a transaction
  begun before this reading started (restored from a checkpoint) is re-read (``reread``).
* ``checkpoint`` gives the read-through offset and producer states in the form the streaming
  offsets carry, from which a new filter emits exactly what this one would have.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from gazette.message.errors import ReplayError
from gazette.message.iterators import sequence_committed
from gazette.message.message import Envelope
from gazette.message.sequencer import ProducerState, Sequencer
from gazette.message.uuid import ProducerID, uuid_columns
from gazette.spark.rows import Parsed, uuid_fields

__all__ = ["CommittedFilter", "ProducerTuple"]

ProducerTuple = tuple[str, int, int]
"""A producer state as streaming offsets carry it: (producer hex, last ACK clock, begin)."""

RING_SIZE: Final = 1 << 16
_OUTSIDE, _CONTINUE, _ACK = 0, 1, 2

Reread = Callable[[int, int], Awaitable[list[tuple[Parsed, npt.NDArray[np.uint8]]]]]
"""Reads ``[begin, end)`` of the journal again, as parsed blocks with their UUID bytes."""


class _RowRef:
    """An envelope's message: its row, and its UUID for the Sequencer's rare reads of it
    (replays, and logging a sequencing anomaly), computed only then."""

    __slots__ = ("i", "raw", "row")

    def __init__(self, row: int, raw: npt.NDArray[np.uint8], i: int) -> None:
        self.row = row
        self.raw = raw
        self.i = i

    @property
    def uuid_int(self) -> int:
        return int.from_bytes(self.raw[self.i].tobytes(), "big")


@dataclass
class _Block:
    first_row: int
    parsed: Parsed
    raw: npt.NDArray[np.uint8]
    #: Re-read for a replay (not part of the in-order reading).
    replayed: bool = False

    @property
    def end(self) -> int:
        return int(self.parsed.ends[-1]) if len(self.parsed) else 0


class CommittedFilter:
    """Which rows of a journal's blocks are committed messages (see the module docstring)."""

    def __init__(self, journal: str, offset: int, producers: tuple[ProducerTuple, ...] = (),
                 reread: Reread | None = None, ring_size: int = RING_SIZE) -> None:
        self.journal = journal
        self._reread = reread
        states = [ProducerState(journal, ProducerID(bytes.fromhex(p)), ack, begin)
                  for p, ack, begin in producers]
        self._seq = Sequencer({journal: offset}, states, ring_size=ring_size)
        self._blocks: list[_Block] = []
        self._rows = 0

    async def feed(self, parsed: Parsed, raw: npt.NDArray[np.uint8]
                   ) -> list[tuple[Parsed, npt.NDArray[np.uint8], npt.NDArray[np.int64]]]:
        """Queue a block's messages; returns each block with the rows committed by it."""
        n = len(parsed)
        block = _Block(self._rows, parsed, raw)
        self._blocks.append(block)
        self._rows += n
        if n == 0:
            return []
        producers, clocks, flags = uuid_fields(raw)
        committed: list[npt.NDArray[np.int64]] = []
        # Producers with a sequence open from earlier blocks: the Sequencer takes their
        # messages up to their first commit point (an ACK, or an OUTSIDE_TXN clobbering it).
        slow = np.zeros(n, dtype=bool)
        for producer in np.unique(producers[clocks != 0]).tolist():
            if self._seq.open_clock(self.journal, producer) != -1:
                continue
            mine = np.flatnonzero((producers == producer) & (clocks != 0))
            points = np.flatnonzero(flags[mine] != _CONTINUE)
            slow[mine if not len(points) else mine[: points[0] + 1]] = True
        if slow.any():
            committed.append(await self._sequence(block, np.flatnonzero(slow), producers))
        rest = np.flatnonzero(~slow)
        fast = self._fast(rest, producers, clocks, flags)
        if fast is None:
            committed.append(await self._sequence(block, rest, producers))
        else:
            done, pending = fast
            committed.append(done + block.first_row)
            if len(pending):
                more = await self._sequence(block, pending, producers)
                assert not len(more), "an open transaction's continuation committed nothing"
        self._seq.offsets[self.journal] = int(parsed.ends[-1])
        result = self._split(np.concatenate(committed))
        self._release(block)
        return result

    def _fast(self, rows: npt.NDArray[np.int64], producers: npt.NDArray[np.uint64],
              clocks: npt.NDArray[np.uint64], flags: npt.NDArray[np.uint16],
              ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
        """Sequence ``rows`` with array operations when they are well-formed: per producer,
        no sequence open, clocks strictly increasing from above its last one, known flags, and
        no OUTSIDE_TXN interrupting a transaction. Returns the committed rows (in block
        order) and the rows left pending (trailing transactions, not yet acknowledged), having
        brought the Sequencer's state up to date; None (nothing changed) when not well-formed.
        """
        if not len(rows):
            return rows, rows
        f = flags[rows]
        if (f > _ACK).any():
            return None
        c = clocks[rows]
        tracked = c != 0
        untracked = rows[~tracked]  # Zero UUIDs: delivered as read.
        rows, c, f = rows[tracked], c[tracked], f[tracked]
        if not len(rows):
            return untracked, rows
        p = producers[rows]
        order = np.argsort(p, kind="stable")  # By producer, journal order within each.
        ps, cs, fs = p[order], c[order], f[order]
        same = ps[1:] == ps[:-1]
        if (same & (cs[1:] <= cs[:-1])).any():
            return None  # Duplicates or clocks going back: the Sequencer's cases.
        if (same & (fs[1:] == _OUTSIDE) & (fs[:-1] == _CONTINUE)).any():
            return None  # An OUTSIDE_TXN clobbering an open transaction.
        starts = np.flatnonzero(np.concatenate([[True], ~same]))
        journal = self.journal
        for g in starts.tolist():
            last = self._seq.open_clock(journal, int(ps[g]))
            if last == -1 or (last is not None and int(cs[g]) <= last):
                return None
        positions = np.arange(len(ps))
        group = np.cumsum(np.concatenate([[0], ~same]))
        # Each group's last commit point (ACK or OUTSIDE_TXN): what follows it stays open.
        points = np.where(fs != _CONTINUE, positions, -1)
        last_point = np.maximum.reduceat(points, starts)
        committed = positions <= last_point[group]
        for g, stop in zip(starts.tolist(), last_point.tolist(), strict=True):
            if stop >= 0:
                self._seq.acknowledge(journal, int(ps[g]), int(cs[stop]))
        done = np.sort(np.concatenate([untracked, rows[order[committed]]]))
        pending = np.sort(rows[order[~committed]])
        return done, pending

    async def _sequence(self, block: _Block, rows: npt.NDArray[np.int64],
                        producers: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Give ``rows`` of ``block`` (in journal order) to the Sequencer; returns the rows
        (all blocks' numbering) it commits."""
        journal, first, raw, p = self.journal, block.first_row, block.raw, block.parsed
        begins, ends = p.begins[rows].tolist(), p.ends[rows].tolist()
        envs = [Envelope(journal, b, e, _RowRef(first + i, raw, i))
                for i, b, e in zip(rows.tolist(), begins, ends, strict=True)]
        cols = uuid_columns(raw[rows].tobytes())
        out = await sequence_committed(self._seq, envs, cols, self._replay)
        return np.fromiter((e.message.row for e in out), dtype=np.int64, count=len(out))

    async def _replay(self, _journal: str, begin: int, end: int) -> list[Envelope]:
        """Envelopes of ``[begin, end)``: from the retained blocks when they reach back that
        far, else re-read (a transaction open at a checkpoint the reading resumed from)."""
        read = [b for b in self._blocks if not b.replayed and len(b.parsed)]
        blocks = read
        if not read or int(read[0].parsed.begins[0]) > begin:
            if self._reread is None:
                raise ReplayError(f"journal {self.journal}: [{begin}, {end}) must be re-read "
                                  "to commit a transaction begun before this read")
            blocks = []
            for parsed, raw in await self._reread(begin, end):
                blocks.append(_Block(self._rows, parsed, raw, replayed=True))
                self._rows += len(parsed)
            self._blocks.extend(blocks)
        out = []
        for b in blocks:
            p = b.parsed
            lo, hi = np.searchsorted(p.begins, [begin, end])
            for i in range(int(lo), int(hi)):
                if p.ends[i] > end:
                    break
                out.append(Envelope(self.journal, int(p.begins[i]), int(p.ends[i]),
                                    _RowRef(b.first_row + i, b.raw, i)))
        return out

    def _split(self, rows: npt.NDArray[np.int64]
               ) -> list[tuple[Parsed, npt.NDArray[np.uint8], npt.NDArray[np.int64]]]:
        if not len(rows):
            return []
        out = []
        for b in self._blocks:
            lo, hi = b.first_row, b.first_row + len(b.parsed)
            mine = rows[(rows >= lo) & (rows < hi)]
            if len(mine):
                # Committed rows come in delivery order; a block's rows keep journal order.
                out.append((b.parsed, b.raw, np.sort(mine) - lo))
        return out

    def _release(self, current: _Block) -> None:
        """Forget blocks no open transaction can reach back into, and re-read ones."""
        open_begins = [p.begin for p in self._seq.partials.values() if p.begin != -1]
        if not open_begins:
            self._blocks = []
            return
        horizon = min(open_begins)
        self._blocks = [b for b in self._blocks
                        if b is current or (not b.replayed and b.end > horizon)]

    def checkpoint(self) -> tuple[int, tuple[ProducerTuple, ...]]:
        """The read-through offset and producer states to resume from."""
        offsets, states = self._seq.checkpoint()
        return offsets.get(self.journal, 0), tuple(
            (s.producer.hex(), s.last_ack, s.begin) for s in states)

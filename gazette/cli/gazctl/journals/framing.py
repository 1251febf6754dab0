"""Records and mappings of ``gazctl journals append``: splitting framed input into records,
and choosing each record's journal.

Invariants (Gazette's ``journals append``):
- ``lines`` records end with ``\\n``; ``fixed`` records are whole fixed frames (the 8-byte
  header ``66 33 93 36`` + little-endian length, then the payload). The delimiter or
  header is kept in the appended record. Input ending inside a record is an error
  (``unexpected EOF``); a lone trailing newline after fixed frames is tolerated.
- With ``modulo``, ``rendezvous`` and ``direct`` each record is preceded by its key,
  written with the same framing: a ``lines`` key is its line with trailing ``\\r``/``\\n``
  trimmed (then base64-decoded under ``--base64``), a ``fixed`` key is its frame payload.
  ``random`` reads no keys. A key left at end of input without a record is dropped.
- Journals are chosen by ``gazette.message.mapping`` over the current listing of the
  selector (so the Go and Python publishers agree on where a key goes); ``direct`` keys
  are journal names, which must be in the current listing.
- ``RecordMapper.feed`` groups records by journal keeping their input order, and when a
  record cannot be keyed or mapped it returns the groups mapped before it along with the
  error, so records preceding a bad one are still appended.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from gazette.errors import GazetteError
from gazette.message.errors import MappingError
from gazette.message.framing import FIXED_FRAME_HEADER_LENGTH, FIXED_FRAME_WORD
from gazette.message.mapping import modulo_mapping, random_mapping, rendezvous_mapping
from gazette.protocol import protocol_pb2 as pb

FRAMINGS: Final = ("none", "lines", "fixed")
MAPPINGS: Final = ("random", "modulo", "rendezvous", "direct")

PartitionsFunc = Callable[[], pb.ListResponse]
Router = Callable[[bytes | None], str]


class RecordError(GazetteError):
    """Input that is not a whole record (or key) of the framing."""


class Splitter(Protocol):
    def split(self, buf: bytes) -> tuple[list[bytes], int, RecordError | None]:
        """Whole records at the start of ``buf`` (delimiters kept), the bytes they span, and
        the error at that point if the bytes there can never start a record."""
        ...

    def end_error(self, rest: bytes) -> RecordError | None:
        """The error of input ending with ``rest`` (bytes after the last whole record)."""
        ...

    def key(self, record: bytes) -> bytes:
        """The partition key written as ``record``."""
        ...


class LineSplitter:
    def split(self, buf: bytes) -> tuple[list[bytes], int, RecordError | None]:
        end = buf.rfind(b"\n") + 1
        if end == 0:
            return [], 0, None
        # split(b"\n"), not splitlines(): a record may hold a lone "\r" or other separators.
        parts = buf[:end - 1].split(b"\n")
        return [p + b"\n" for p in parts], end, None

    def end_error(self, rest: bytes) -> RecordError | None:
        if rest:
            return RecordError("unexpected EOF (the input's last line has no newline)")
        return None

    def key(self, record: bytes) -> bytes:
        return record.rstrip(b"\r\n")


class Base64LineSplitter(LineSplitter):
    def key(self, record: bytes) -> bytes:
        try:
            return base64.b64decode(record.rstrip(b"\r\n"), validate=True)
        except binascii.Error as err:
            raise RecordError(f"illegal base64 data: {err}") from None


class FixedSplitter:
    def split(self, buf: bytes) -> tuple[list[bytes], int, RecordError | None]:
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos + FIXED_FRAME_HEADER_LENGTH <= n:
            if buf[pos:pos + 4] != FIXED_FRAME_WORD:
                return out, pos, RecordError("detected de-synchronization (no fixed-frame "
                                             "header where a record begins)")
            size = FIXED_FRAME_HEADER_LENGTH + int.from_bytes(buf[pos + 4:pos + 8], "little")
            if pos + size > n:
                break
            out.append(buf[pos:pos + size])
            pos += size
        return out, pos, None

    def end_error(self, rest: bytes) -> RecordError | None:
        # Gazette tolerates exactly one trailing newline (left by line-oriented tools).
        if rest and rest != b"\n":
            return RecordError("unexpected EOF (the input ends inside a fixed frame)")
        return None

    def key(self, record: bytes) -> bytes:
        return record[FIXED_FRAME_HEADER_LENGTH:]


def splitter(framing: str, use_base64: bool) -> Splitter:
    if framing == "lines":
        return Base64LineSplitter() if use_base64 else LineSplitter()
    if framing == "fixed":
        return FixedSplitter()
    raise ValueError(f"no record splitter for --framing {framing!r}")


def check_flags(framing: str, mapping: str, use_base64: bool) -> str | None:
    """Gazette's refusals of flag combinations (as its wording), or None when usable."""
    if framing == "none" and mapping != "random":
        return "'none' --framing may only be used with 'random' --mapping"
    if use_base64 and (framing != "lines" or mapping == "random"):
        return "--base64 requires --framing 'lines' and not --mapping 'random'"
    return None


def _identity(key: bytes) -> bytes:
    return key


def router(mapping: str, partitions: PartitionsFunc) -> Router:
    """The journal of each record's key (None for ``random``), over the current listing.

    Raises ``MappingError`` when the listing is empty or a ``direct`` name is not in it.
    """
    if mapping == "random":
        rand = random_mapping(partitions)
        return lambda _key: rand(None)[0]
    if mapping in ("modulo", "rendezvous"):
        build = modulo_mapping if mapping == "modulo" else rendezvous_mapping
        keyed = build(_identity, partitions)

        def by_key(key: bytes | None) -> str:
            return keyed(key or b"")[0]

        return by_key
    if mapping == "direct":
        seen: list[pb.ListResponse | None] = [None]
        names: set[str] = set()

        def direct(key: bytes | None) -> str:
            listing = partitions()
            if listing is not seen[0]:
                names.clear()
                names.update(j.spec.name for j in listing.journals)
                seen[0] = listing
            name = (key or b"").decode(errors="replace")
            if name not in names:
                raise MappingError(f"journal {name!r} not found")
            return name

        return direct
    raise ValueError(f"unknown --mapping {mapping!r}")


@dataclass
class Mapped:
    """Records of one input block grouped by journal, in input order within each journal."""

    batches: dict[str, list[bytes]] = field(default_factory=dict)
    records: int = 0
    #: The error that stopped mapping (records after it are not in ``batches``) and what it
    #: was doing ("unpacking partition key", "mapping partition key to journal").
    error: Exception | None = None
    stage: str = ""


class RecordMapper:
    """Maps a stream of records (keys interleaved for keyed mappings) to journals."""

    def __init__(self, split: Splitter, route: Router, keyed: bool,
                 on_mapped: Callable[[str, bytes], None] | None = None) -> None:
        self.split = split
        self.route = route
        self.keyed = keyed
        self.on_mapped = on_mapped
        self.pending_key: bytes | None = None  # A key awaiting its record.

    def feed(self, records: list[bytes]) -> Mapped:
        out = Mapped()
        key: bytes | None = self.pending_key
        for rec in records:
            if self.keyed and key is None:
                try:
                    key = self.split.key(rec)
                except RecordError as err:
                    out.error, out.stage = err, "unpacking partition key"
                    break
                continue
            try:
                journal = self.route(key)
            except MappingError as err:
                out.error, out.stage = err, "mapping partition key to journal"
                key = None
                break
            if self.on_mapped is not None:
                self.on_mapped(journal, key or b"")
            out.batches.setdefault(journal, []).append(rec)
            out.records += 1
            key = None
        self.pending_key = key
        return out

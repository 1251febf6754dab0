"""Fragments: content-addressed spans ``[begin, end)`` of a journal, and sets covering offsets.

Invariants:

* A :class:`Fragment` is immutable and mirrors ``protocol.Fragment`` field for field; ``sum``
  is the 20-byte SHA1 digest of its content, except that an empty fragment always has the
  all-zero sum (not SHA1 of the empty string), as in Gazette.
* A fragment's file name is ``%016x-%016x-%040x`` of begin, end and sum plus the codec's
  extension, so lexical order of names is offset order. Its path in a store is
  ``journal/path_postfix/name`` (without the postfix component when it is empty).
* The wire form of the sum is ``SHA1Sum{part1, part2, part3}``: the digest's bytes 0..8 and
  8..16 as big-endian uint64 and bytes 16..20 as a big-endian uint32.
* A fragment may carry a local ``file`` (its uncompressed content, readable by ``pread``);
  ``file`` takes no part in equality, hashing or the wire form.
* A :class:`CoverSet` holds fragments of one journal ordered by begin *and* by end, none fully
  covered by another: it maps each offset to the covering fragment having the most content
  after it, and prefers one large fragment over several small ones spanning the same bytes.
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Iterable, Iterator
from typing import Final, Protocol, overload

from gazette.fragment.codecs import Codec, codec_for_extension, extension
from gazette.fragment.errors import CodecError, ContentNameError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "CoverSet",
    "File",
    "Fragment",
    "ZERO_SUM",
    "parse_content_name",
    "set_sum",
    "sum_from_proto",
    "sum_to_proto",
]

ZERO_SUM = bytes(20)
"""The sum of every empty fragment."""

_SUM_PARTS = struct.Struct(">QQI")
_HEX = re.compile(r"[0-9a-fA-F]+")


def sum_to_proto(digest: bytes) -> pb.SHA1Sum:
    """The wire ``SHA1Sum`` of a 20-byte SHA1 digest."""
    if len(digest) != 20:
        raise ValueError(f"a SHA1 digest has 20 bytes, not {len(digest)}")
    p1, p2, p3 = _SUM_PARTS.unpack(digest)
    return pb.SHA1Sum(part1=p1, part2=p2, part3=p3)


def set_sum(target: pb.SHA1Sum, digest: bytes) -> None:
    """Sets ``target`` to the wire form of a 20-byte SHA1 digest in place (no new message)."""
    target.part1, target.part2, target.part3 = _SUM_PARTS.unpack(digest)


def sum_from_proto(s: pb.SHA1Sum) -> bytes:
    """The 20-byte digest of a wire ``SHA1Sum``."""
    return _SUM_PARTS.pack(s.part1, s.part2, s.part3)


class File(Protocol):
    """Local, uncompressed content of a fragment; offsets are relative to fragment.begin.

    ``pread`` must be safe to call while the owner keeps appending beyond what was committed.
    """

    def pread(self, offset: int, n: int) -> bytes:
        """Read up to ``n`` bytes at ``offset`` (fewer only at the end of the file)."""
        ...


class Fragment:
    """A span of journal content, as ``protocol.Fragment`` (see the module invariants).

    Immutable: its attributes are ``Final`` (mypy refuses an assignment; the compiled build,
    where this is a native class, raises AttributeError). Equality and hashing are by every
    field but ``file``, as a frozen dataclass's would be; it pickles by its fields.
    """

    # A native class in the compiled build: a commit builds one or two fragments per append
    # and the spool, pipeline and index read their fields, which compiled code then reads
    # from the object's struct (a frozen dataclass's construction went through
    # object.__setattr__ per field: about 0.9 µs, against 0.04 µs built from compiled code).
    __slots__ = ("journal", "begin", "end", "sum", "codec", "backing_store", "mod_time", "path_postfix",
                 "file")

    journal: Final[str]
    begin: Final[int]
    end: Final[int]
    sum: Final[bytes]
    codec: Final[Codec]
    backing_store: Final[str]
    mod_time: Final[int]
    path_postfix: Final[str]
    file: Final[File | None]

    def __init__(self, journal: str, begin: int, end: int, sum: bytes = ZERO_SUM,
                 codec: Codec = pb.CompressionCodec.NONE, backing_store: str = "", mod_time: int = 0,
                 path_postfix: str = "", file: File | None = None) -> None:
        if begin > end:
            raise ValueError(f"expected begin <= end (have {begin}, {end})")
        if len(sum) != 20:
            raise ValueError(f"a fragment sum has 20 bytes, not {len(sum)}")
        self.journal = journal
        self.begin = begin
        self.end = end
        self.sum = sum
        self.codec = codec
        self.backing_store = backing_store
        self.mod_time = mod_time
        self.path_postfix = path_postfix
        self.file = file

    def _key(self) -> tuple[str, int, int, bytes, int, str, int, str]:
        return (self.journal, self.begin, self.end, self.sum, self.codec, self.backing_store,
                self.mod_time, self.path_postfix)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fragment):
            return NotImplemented
        # Offsets first: fragments of one journal that differ mostly differ there.
        return (self.end == other.end and self.begin == other.begin and self.sum == other.sum
                and self.journal == other.journal and self.codec == other.codec
                and self.mod_time == other.mod_time and self.backing_store == other.backing_store
                and self.path_postfix == other.path_postfix)

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Fragment(journal={self.journal!r}, begin={self.begin!r}, end={self.end!r}, "
                f"sum={self.sum!r}, codec={self.codec!r}, backing_store={self.backing_store!r}, "
                f"mod_time={self.mod_time!r}, path_postfix={self.path_postfix!r})")

    def __reduce__(self) -> tuple[type[Fragment], tuple[object, ...]]:
        return (Fragment, (*self._key(), self.file))

    @property
    def content_length(self) -> int:
        return self.end - self.begin

    def content_name(self) -> str:
        """Content-addressed base name: ``{begin:016x}-{end:016x}-{sha1 hex}{ext}``."""
        return f"{self.begin:016x}-{self.end:016x}-{self.sum.hex()}{extension(self.codec)}"

    def content_path(self) -> str:
        """Path of the fragment relative to its store: ``journal/[postfix/]name``."""
        parts = [self.journal, self.path_postfix, self.content_name()]
        return "/".join(p.strip("/") for p in parts if p)

    def with_file(self, file: File | None) -> Fragment:
        return Fragment(self.journal, self.begin, self.end, self.sum, self.codec,
                        self.backing_store, self.mod_time, self.path_postfix, file)

    def to_proto(self) -> pb.Fragment:
        return pb.Fragment(
            journal=self.journal,
            begin=self.begin,
            end=self.end,
            sum=sum_to_proto(self.sum),
            compression_codec=self.codec,
            backing_store=self.backing_store,
            mod_time=self.mod_time,
            path_postfix=self.path_postfix,
        )

    @classmethod
    def from_proto(cls, m: pb.Fragment, file: File | None = None) -> Fragment:
        return cls(
            journal=m.journal,
            begin=m.begin,
            end=m.end,
            sum=sum_from_proto(m.sum),
            codec=m.compression_codec,
            backing_store=m.backing_store,
            mod_time=m.mod_time,
            path_postfix=m.path_postfix,
            file=file,
        )


def parse_content_name(journal: str, name: str) -> Fragment:
    """Parse a fragment from its path relative to the journal's directory in a store.

    ``name`` is a content name, optionally below path-postfix directories, e.g.
    ``a=1/b=2/00000000499602d2-7fffffffffffffff-0102...1314.gz``. A name without extension
    is a GZIP_OFFLOAD_DECOMPRESSION fragment, as Gazette writes them.
    """
    postfix, _, base = name.rpartition("/")
    if postfix.startswith("/") or ".." in postfix.split("/"):
        raise ContentNameError(f"invalid path postfix {postfix!r} of {name!r}")
    dot = base.find(".")
    stem, ext = (base, "") if dot < 0 else (base[:dot], base[dot:])
    fields = stem.split("-")
    if len(fields) != 3:
        raise ContentNameError(f"wrong fragment name format: {name!r}")
    for label, value in zip(("begin", "end", "sum"), fields, strict=True):
        if not _HEX.fullmatch(value):
            raise ContentNameError(f"{label} of {name!r} is not hexadecimal: {value!r}")
    begin, end, digest = int(fields[0], 16), int(fields[1], 16), bytes.fromhex(fields[2])
    if len(digest) != 20:
        raise ContentNameError(f"invalid SHA1 sum length of {name!r}: {fields[2]!r}")
    if begin >= 1 << 63 or end >= 1 << 63:
        raise ContentNameError(f"offset of {name!r} overflows int64")
    if begin > end:
        raise ContentNameError(f"expected begin <= end in {name!r}")
    try:
        codec = codec_for_extension(ext)
    except CodecError as err:
        raise ContentNameError(f"{name!r}: {err}") from err
    return Fragment(journal, begin, end, digest, codec, path_postfix=postfix)


class CoverSet:
    """Fragments of one journal covering offsets (see the module invariants).

    Mutated in place by :meth:`add`; iterate it, index it, or :meth:`copy` it.
    """

    __slots__ = ("_f",)

    def __init__(self, fragments: Iterable[Fragment] = ()) -> None:
        self._f: list[Fragment] = []
        for f in fragments:
            self.add(f)

    def __len__(self) -> int:
        return len(self._f)

    def __iter__(self) -> Iterator[Fragment]:
        return iter(self._f)

    @overload
    def __getitem__(self, i: int) -> Fragment: ...
    @overload
    def __getitem__(self, i: slice) -> list[Fragment]: ...
    def __getitem__(self, i: int | slice) -> Fragment | list[Fragment]:
        return self._f[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CoverSet):
            return self._f == other._f
        if isinstance(other, list):
            return self._f == other
        return NotImplemented

    # Unhashable (mutable): defining __eq__ without __hash__ makes it so, compiled or not.

    def __repr__(self) -> str:
        return f"CoverSet({self._f!r})"

    def copy(self) -> CoverSet:
        out = CoverSet()
        out._f = list(self._f)
        return out

    @property
    def begin_offset(self) -> int:
        return self._f[0].begin if self._f else 0

    @property
    def end_offset(self) -> int:
        return self._f[-1].end if self._f else 0

    def add(self, fragment: Fragment) -> bool:
        """Add ``fragment``; True iff it now covers a span (it was not already covered).

        Empty fragments are ignored. A fragment replaces every entry it fully covers; an exact
        duplicate span replaces its equal; one covered by a larger entry is refused.
        """
        s = self._f
        n = len(s)
        if n and fragment.journal != s[0].journal:
            raise ValueError(
                f"fragment of journal {fragment.journal!r} added to a set of {s[0].journal!r}"
            )
        if fragment.begin == fragment.end:
            return False
        if n == 0:
            s.append(fragment)
            return True
        last = s[-1]
        if last.end < fragment.end and last.begin < fragment.begin:
            s.append(fragment)  # Fast path: the common case of a next, later fragment.
            return True
        if last.begin == fragment.begin and last.end <= fragment.end:
            # Fast path: a spool's commit extending the last entry. Every earlier entry begins
            # and ends before the last one does, so none covers the fragment or is covered.
            s[-1] = fragment
            return True
        # (Gazette also fast-paths a fragment replacing the last entry whatever its begin, but
        # that way misses earlier entries the fragment covers too; the general path does not.)

        # First entry whose end is beyond fragment.begin.
        lo = bisect.bisect_right(s, fragment.begin, key=_end_of)
        while lo != n:
            e = s[lo]
            if (e.begin <= fragment.begin and e.end > fragment.end) or (
                e.begin < fragment.begin and e.end >= fragment.end
            ):
                return False  # Strictly covered by a larger entry.
            if e.begin >= fragment.begin:
                break
            lo += 1
        hi = lo
        while hi != n and s[hi].end <= fragment.end:
            hi += 1
        s[lo:hi] = [fragment]
        return True

    def longest_overlapping(self, offset: int) -> tuple[int, bool]:
        """Index of the covering fragment with most content after ``offset``, and whether
        one covers it at all; if none does, the index of the next fragment (maybe len(self))."""
        s = self._f
        ind = bisect.bisect_right(s, offset, key=_end_of)
        found = ind < len(s) and s[ind].begin <= offset
        while ind + 1 < len(s) and s[ind + 1].begin <= offset:
            ind += 1
        return ind, found

    def difference(self, other: CoverSet) -> CoverSet:
        """Fragments of self covering some offset that ``other`` does not cover."""
        out = CoverSet()
        b = other._f
        base = 0  # Fragments of |b| before |base| end before anything still to be examined.
        for a in self._f:
            ind, _ = other.longest_overlapping(a.begin)
            base = max(base, ind)
            ind = base
            # Let a run of contiguous or overlapping fragments of |b| jointly cover |a|.
            while ind + 1 < len(b) and b[ind].end < a.end and b[ind + 1].begin <= b[ind].end:
                ind += 1
            if ind >= len(b) or a.begin < b[base].begin or a.end > b[ind].end:
                out._f.append(a)
        return out


def _end_of(f: Fragment) -> int:
    return f.end

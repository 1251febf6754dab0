"""Compression codecs of fragment files, byte-compatible with Gazette's.

Invariants:

* Every codec is streamed: a :class:`Compressor` takes chunks and ``finish()`` returns the
  tail; a :class:`Decompressor` takes arbitrary slices of the compressed stream and returns
  whatever content they complete. Neither ever holds a whole fragment, so a large fragment is
  never resident twice.
* All work happens in C (zlib, cramjam's snappy, zstandard); Python only touches chunks, or for
  framed snappy the 4-byte frame headers.
* ``GZIP`` output may be read back whether it has one member (ours) or many (Gazette's
  multi-member writer emits one per compression batch). ``GZIP_OFFLOAD_DECOMPRESSION`` is plain
  gzip whose decompression Gazette leaves to the store's HTTP ``Content-Encoding``; we always
  decompress it ourselves when we read it.
* What a few compressed bytes may expand to in one call is bounded: deflate by its format
  (~1032:1), snappy by its 64 KiB frames, zstd by :meth:`LimitedDecompressor.decompress_limited`
  (a zstd block is at most 128 KiB of content, but an RLE block of it is 4 bytes).
* File extensions are Gazette's: ``.raw``, ``.gz``, ``.zst``, ``.sz`` and, for
  ``GZIP_OFFLOAD_DECOMPRESSION``, *no* extension (``.gzod`` is accepted when parsing, as are
  the long forms ``.gzip``, ``.zstandard`` and ``.snappy``).
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol, TypeAlias, runtime_checkable

import cramjam

from gazette.fragment.errors import CodecError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "Codec",
    "Compressor",
    "Decompressor",
    "LimitedDecompressor",
    "codec_for_extension",
    "compress",
    "decompress",
    "extension",
    "new_compressor",
    "new_decompressor",
]

Codec: TypeAlias = pb.CompressionCodec.ValueType

NONE: Codec = pb.CompressionCodec.NONE
GZIP: Codec = pb.CompressionCodec.GZIP
ZSTANDARD: Codec = pb.CompressionCodec.ZSTANDARD
SNAPPY: Codec = pb.CompressionCodec.SNAPPY
GZIP_OFFLOAD_DECOMPRESSION: Codec = pb.CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION

Bytes = bytes | bytearray | memoryview

_EXTENSIONS: dict[Codec, str] = {
    NONE: ".raw",
    GZIP: ".gz",
    ZSTANDARD: ".zst",
    SNAPPY: ".sz",
    GZIP_OFFLOAD_DECOMPRESSION: "",
}

_FROM_EXTENSION: dict[str, Codec] = {
    ".raw": NONE,
    ".gz": GZIP,
    ".gzip": GZIP,
    ".zst": ZSTANDARD,
    ".zstandard": ZSTANDARD,
    ".sz": SNAPPY,
    ".snappy": SNAPPY,
    "": GZIP_OFFLOAD_DECOMPRESSION,
    ".gzod": GZIP_OFFLOAD_DECOMPRESSION,
}


def extension(codec: Codec) -> str:
    """The file extension (with its dot, or empty) Gazette gives fragments of ``codec``."""
    try:
        return _EXTENSIONS[codec]
    except KeyError:
        raise CodecError(f"invalid CompressionCodec {codec!r}") from None


def codec_for_extension(ext: str) -> Codec:
    """The codec of a fragment file extension (case-insensitive, including its dot)."""
    try:
        return _FROM_EXTENSION[ext.lower()]
    except KeyError:
        raise CodecError(f"unrecognized compression extension: {ext!r}") from None


class Compressor(Protocol):
    """Streaming compressor: feed chunks, then ``finish()`` exactly once."""

    def compress(self, data: Bytes) -> bytes:
        """Compress a chunk, returning whatever compressed output is ready."""
        ...

    def finish(self) -> bytes:
        """Flush and terminate the stream, returning the remaining output."""
        ...


class Decompressor(Protocol):
    """Streaming decompressor: feed slices of the compressed stream, then ``finish()``."""

    def decompress(self, data: Bytes) -> bytes:
        """Decompress a slice, returning the content it completes."""
        ...

    def finish(self) -> bytes:
        """Check the stream ended cleanly (raising CodecError if truncated)."""
        ...


@runtime_checkable
class LimitedDecompressor(Decompressor, Protocol):
    """A decompressor that can bound what one call returns (ZSTANDARD's: a zstd block of a
    few bytes expands to 128 KiB, so bounding the input fed cannot bound the output)."""

    def decompress_limited(self, data: Bytes, limit: int) -> bytes:
        """Queue ``data``; decompress queued input until the output reaches ``limit`` (0: no
        limit), returning at most ``limit`` plus 128 KiB, ``b""`` when more input is needed."""
        ...


class _Identity:
    def compress(self, data: Bytes) -> bytes:
        return bytes(data)

    def decompress(self, data: Bytes) -> bytes:
        return bytes(data)

    def finish(self) -> bytes:
        return b""


class _GzipCompressor:
    def __init__(self) -> None:
        # wbits 16+15: a gzip member (header and CRC32 trailer) rather than a zlib stream.
        self._z = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 31)

    def compress(self, data: Bytes) -> bytes:
        return self._z.compress(data)

    def finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


class _GzipDecompressor:
    """Reads concatenated gzip members (RFC 1952 allows, Gazette writes them)."""

    def __init__(self) -> None:
        self._z: Any = None  # zlib's Decompress type is not public.

    def decompress(self, data: Bytes) -> bytes:
        out: list[bytes] = []
        buf: Bytes = data
        try:
            while buf:
                if self._z is None:
                    self._z = zlib.decompressobj(31)
                out.append(self._z.decompress(buf))
                if self._z.eof:
                    buf = self._z.unused_data  # Start of the next member, if any.
                    self._z = None
                else:
                    buf = b""
        except zlib.error as err:
            raise CodecError(f"corrupt gzip stream: {err}") from err
        return b"".join(out)

    def finish(self) -> bytes:
        if self._z is not None:
            raise CodecError("truncated gzip stream (member not terminated)")
        return b""


# A framed snappy stream starts with this stream-identifier chunk.
_SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


class _SnappyCompressor:
    def __init__(self) -> None:
        self._c = cramjam.snappy.Compressor()

    def compress(self, data: Bytes) -> bytes:
        # cramjam takes bytes only: a view costs one copy, small next to the compression.
        self._c.compress(data if isinstance(data, bytes) else bytes(data))
        return bytes(self._c.flush())

    def finish(self) -> bytes:
        return bytes(self._c.finish())


class _SnappyDecompressor:
    """Framed snappy, decoded whole frames at a time.

    cramjam's framed decoder wants a complete stream, so complete frames are handed to it
    (behind a stream identifier), and an incomplete trailing frame is held until the rest
    arrives. Frames are at most 64 KiB of content, so the Python work is per frame, and the
    decoder verifies each frame's CRC.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._started = False

    def decompress(self, data: Bytes) -> bytes:
        buf = self._buf
        buf += data
        pos, n = 0, len(buf)
        while pos + 4 <= n:
            length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if pos + 4 + length > n:
                break
            pos += 4 + length
        if pos == 0:
            return b""
        frames = bytes(buf[:pos])
        del buf[:pos]
        if not self._started:
            if not frames.startswith(_SNAPPY_STREAM_ID):
                raise CodecError("snappy stream does not begin with a stream identifier")
            self._started = True
        else:
            frames = _SNAPPY_STREAM_ID + frames
        try:
            return bytes(cramjam.snappy.decompress(frames))
        except Exception as err:  # cramjam raises plain errors for corrupt frames.
            raise CodecError(f"corrupt snappy stream: {err}") from err

    def finish(self) -> bytes:
        if self._buf:
            raise CodecError(f"truncated snappy stream ({len(self._buf)} trailing bytes)")
        return b""


class _ZstdCompressor:
    def __init__(self) -> None:
        import zstandard  # Imported lazily: only journals using ZSTANDARD need it.

        self._c = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()

    def compress(self, data: Bytes) -> bytes:
        return self._c.compress(data)

    def finish(self) -> bytes:
        return self._c.flush()


class _ZstdDecompressor:
    """Reads one or more concatenated zstd frames (skippable frames included), a block at a time.

    The compressed stream is walked unit by unit (frame header, block, checksum, skippable
    frame; RFC 8878 §3.1) and fed to zstd no further than the end of the current unit, so one
    feed completes at most one block, which is at most 128 KiB of content whatever its
    compressed size (an RLE block is 4 bytes). :meth:`decompress_limited` stops feeding once its
    output reaches the limit and keeps the rest of the input queued: a few stored bytes can no
    longer expand to megabytes at once. Input is queued as ``(bytes, offset)``: cutting a unit
    is a view, not a copy of the rest (tiny blocks cost linear time). :meth:`decompress` (no
    limit: the client's reader) feeds whole slices as they come, a fifth faster on highly
    compressible content; one decompressor is used one way or the other, not both.
    """

    _MAGIC = 0xFD2FB528

    def __init__(self) -> None:
        import zstandard

        self._zstd = zstandard
        self._d: Any = None
        self._buf = b""
        self._pos = 0
        self._left = 0  # bytes of the current unit not yet fed
        self._next = "frame"  # what the next unit is: "frame", "block" or "checksum"
        self._checksum = False
        self._walking: bool | None = None  # limited (walks units) or not; None: not yet used

    def _unit(self) -> int | None:
        """The length of the unit starting at the queue's head (advancing the walk), or None
        while its header is incomplete."""
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if self._next == "block":
            if have < 3:
                return None
            hdr = int.from_bytes(buf[pos : pos + 3], "little")
            kind, size = (hdr >> 1) & 3, hdr >> 3
            if hdr & 1:
                self._next = "checksum" if self._checksum else "frame"
            return 3 + (1 if kind == 1 else size)
        if self._next == "checksum":
            self._next = "frame"
            return 4
        if have < 4:
            return None
        magic = int.from_bytes(buf[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame: magic, size, data
            if have < 8:
                return None
            return 8 + int.from_bytes(buf[pos + 4 : pos + 8], "little")
        if magic != self._MAGIC:
            return have  # not zstd: zstd itself reports the error
        if have < 5:
            return None
        desc = buf[pos + 4]
        fcs_flag, single = desc >> 6, desc >> 5 & 1
        fcs = (1 if single else 0, 2, 4, 8)[fcs_flag]
        self._checksum = bool(desc & 4)
        self._next = "block"
        return 5 + (0 if single else 1) + (0, 1, 2, 4)[desc & 3] + fcs

    def _feed(self, piece: memoryview) -> bytes:
        out: list[bytes] = []
        buf: Bytes = piece
        while buf:
            if self._d is None:
                self._d = self._zstd.ZstdDecompressor().decompressobj()
            out.append(self._d.decompress(buf))
            if self._d.eof:
                buf = self._d.unused_data
                self._d = None
            else:
                buf = b""
        return b"".join(out)

    def decompress_limited(self, data: Bytes, limit: int) -> bytes:
        """Queue ``data`` and decompress queued input until the output reaches ``limit`` bytes
        (0: no limit); returns at most ``limit`` plus one block (128 KiB) of content, ``b""``
        once the queue holds no complete block."""
        if self._walking is False:
            raise CodecError("decompress_limited after decompress on one zstd decompressor")
        self._walking = True
        if data:
            self._buf = self._buf[self._pos :] + bytes(data) if self._pos < len(self._buf) else bytes(data)
            self._pos = 0
        out: list[bytes] = []
        n = 0
        view = memoryview(self._buf)
        try:
            while not limit or n < limit:
                if not self._left:
                    unit = self._unit()
                    if unit is None:
                        break
                    self._left = unit
                take = min(self._left, len(self._buf) - self._pos)
                if not take:
                    break
                piece = view[self._pos : self._pos + take]
                self._pos += take
                self._left -= take
                got = self._feed(piece)
                n += len(got)
                out.append(got)
        except self._zstd.ZstdError as err:
            raise CodecError(f"corrupt zstd stream: {err}") from err
        return b"".join(out)

    def decompress(self, data: Bytes) -> bytes:
        if self._walking:
            return self.decompress_limited(data, 0)
        self._walking = False
        try:
            return self._feed(memoryview(data))
        except self._zstd.ZstdError as err:
            raise CodecError(f"corrupt zstd stream: {err}") from err

    def finish(self) -> bytes:
        if self._walking is False:
            if self._d is not None:  # the last frame has not ended
                raise CodecError("truncated zstd stream (frame not terminated)")
            return b""
        if self._left or self._pos < len(self._buf) or self._next != "frame" or self._d is not None:
            raise CodecError("truncated zstd stream (frame not terminated)")
        return b""


def new_compressor(codec: Codec) -> Compressor:
    """A streaming compressor writing fragment content as Gazette does for ``codec``."""
    if codec == NONE:
        return _Identity()
    if codec in (GZIP, GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipCompressor()
    if codec == SNAPPY:
        return _SnappyCompressor()
    if codec == ZSTANDARD:
        return _ZstdCompressor()
    raise CodecError(f"unsupported codec {codec!r}")


def new_decompressor(codec: Codec) -> Decompressor:
    """A streaming decompressor of a fragment file compressed with ``codec``."""
    if codec == NONE:
        return _Identity()
    if codec in (GZIP, GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipDecompressor()
    if codec == SNAPPY:
        return _SnappyDecompressor()
    if codec == ZSTANDARD:
        return _ZstdDecompressor()
    raise CodecError(f"unsupported codec {codec!r}")


def compress(codec: Codec, data: Bytes) -> bytes:
    """Compress a whole buffer (convenience for small content and tests)."""
    c = new_compressor(codec)
    return c.compress(data) + c.finish()


def decompress(codec: Codec, data: Bytes) -> bytes:
    """Decompress a whole buffer (convenience for small content and tests)."""
    d = new_decompressor(codec)
    return d.decompress(data) + d.finish()

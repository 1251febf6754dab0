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
* File extensions are Gazette's: ``.raw``, ``.gz``, ``.zst``, ``.sz`` and, for
  ``GZIP_OFFLOAD_DECOMPRESSION``, *no* extension (``.gzod`` is accepted when parsing, as are
  the long forms ``.gzip``, ``.zstandard`` and ``.snappy``).
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol, TypeAlias

import cramjam

from gazette.fragment.errors import CodecError
from gazette.protocol import protocol_pb2 as pb

__all__ = [
    "Codec",
    "Compressor",
    "Decompressor",
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
    """Reads one or more concatenated zstd frames."""

    def __init__(self) -> None:
        import zstandard

        self._zstd = zstandard
        self._d: Any = None
        self._mid_frame = False

    def decompress(self, data: Bytes) -> bytes:
        out: list[bytes] = []
        buf = bytes(data)
        try:
            while buf:
                if self._d is None:
                    self._d = self._zstd.ZstdDecompressor().decompressobj()
                out.append(self._d.decompress(buf))
                if self._d.eof:
                    buf = self._d.unused_data
                    self._d = None
                    self._mid_frame = False
                else:
                    buf = b""
                    self._mid_frame = True
        except self._zstd.ZstdError as err:
            raise CodecError(f"corrupt zstd stream: {err}") from err
        return b"".join(out)

    def finish(self) -> bytes:
        if self._mid_frame:
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

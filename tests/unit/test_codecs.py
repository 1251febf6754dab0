"""Codecs: streaming round trips, Gazette's extensions, multi-member/multi-frame streams."""

from __future__ import annotations

import gzip
import os

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.fragment import codecs
from gazette.fragment.codecs import Codec
from gazette.fragment.errors import CodecError
from gazette.protocol import protocol_pb2 as pb

CC = pb.CompressionCodec
ALL = [CC.NONE, CC.GZIP, CC.ZSTANDARD, CC.SNAPPY, CC.GZIP_OFFLOAD_DECOMPRESSION]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from(ALL),
    data=st.one_of(
        st.binary(max_size=2000),
        st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=50), st.integers(1, 3000)),
    ),
    in_cuts=st.lists(st.integers(0, 1 << 20), max_size=6),
    out_cuts=st.lists(st.integers(0, 1 << 20), max_size=6),
)
def test_streaming_round_trip(
    codec: Codec, data: bytes, in_cuts: list[int], out_cuts: list[int]
) -> None:
    c = codecs.new_compressor(codec)
    compressed = b"".join(c.compress(chunk) for chunk in _split(data, in_cuts)) + c.finish()

    d = codecs.new_decompressor(codec)
    # Any slicing of the compressed stream decodes to the same content.
    out = b"".join(d.decompress(chunk) for chunk in _split(compressed, out_cuts)) + d.finish()
    assert out == data


def test_large_incompressible_round_trip() -> None:
    data = os.urandom(3 << 20)
    for codec in ALL:
        c = codecs.new_compressor(codec)
        parts = [
            c.compress(memoryview(data)[i : i + (1 << 20)]) for i in range(0, len(data), 1 << 20)
        ]
        blob = b"".join(parts) + c.finish()
        assert codecs.decompress(codec, blob) == data, codec


def test_extensions_match_gazette() -> None:
    assert codecs.extension(CC.NONE) == ".raw"
    assert codecs.extension(CC.GZIP) == ".gz"
    assert codecs.extension(CC.ZSTANDARD) == ".zst"
    assert codecs.extension(CC.SNAPPY) == ".sz"
    assert codecs.extension(CC.GZIP_OFFLOAD_DECOMPRESSION) == ""
    for codec in ALL:
        assert codecs.codec_for_extension(codecs.extension(codec)) == codec
    assert codecs.codec_for_extension(".GZIP") == CC.GZIP
    assert codecs.codec_for_extension(".snappy") == CC.SNAPPY
    assert codecs.codec_for_extension(".zstandard") == CC.ZSTANDARD
    assert codecs.codec_for_extension(".gzod") == CC.GZIP_OFFLOAD_DECOMPRESSION
    with pytest.raises(CodecError, match="unrecognized compression extension"):
        codecs.codec_for_extension(".lz4")
    with pytest.raises(CodecError):
        codecs.extension(CC.INVALID)
    with pytest.raises(CodecError):
        codecs.new_compressor(CC.INVALID)


def test_gzip_reads_concatenated_members() -> None:
    # Gazette's GZIP writer emits one member per compression batch.
    blob = gzip.compress(b"first write ") + gzip.compress(b"second ") + gzip.compress(b"final")
    d = codecs.new_decompressor(CC.GZIP)
    out = b"".join(d.decompress(blob[i : i + 7]) for i in range(0, len(blob), 7)) + d.finish()
    assert out == b"first write second final"


def test_zstd_reads_concatenated_frames() -> None:
    blob = zstandard.ZstdCompressor().compress(b"hello ") + zstandard.ZstdCompressor().compress(
        b"world"
    )
    assert codecs.decompress(CC.ZSTANDARD, blob) == b"hello world"


def test_snappy_is_a_framed_stream() -> None:
    blob = codecs.compress(CC.SNAPPY, b"some content" * 100)
    assert blob.startswith(b"\xff\x06\x00\x00sNaPpY")


@pytest.mark.parametrize("codec", [CC.GZIP, CC.ZSTANDARD, CC.SNAPPY])
def test_truncated_stream_is_an_error(codec: Codec) -> None:
    blob = codecs.compress(codec, os.urandom(1000) * 3)
    d = codecs.new_decompressor(codec)
    d.decompress(blob[:-5])
    with pytest.raises(CodecError, match="truncated"):
        d.finish()


@pytest.mark.parametrize("codec", [CC.GZIP, CC.ZSTANDARD, CC.SNAPPY])
def test_corrupt_stream_is_an_error(codec: Codec) -> None:
    blob = bytearray(codecs.compress(codec, b"0123456789" * 1000))
    blob[len(blob) // 2] ^= 0xFF
    blob[len(blob) // 2 + 1] ^= 0xFF
    with pytest.raises(CodecError):
        codecs.decompress(codec, bytes(blob))


def test_snappy_requires_stream_identifier() -> None:
    blob = codecs.compress(CC.SNAPPY, b"abc" * 100)
    with pytest.raises(CodecError, match="stream identifier"):
        codecs.decompress(CC.SNAPPY, blob[10:])


_ZSTD_PARTS = st.lists(
    st.one_of(
        st.tuples(st.just("frame"), st.sampled_from(["zeros", "random", "text"]),
                  st.integers(0, 400_000), st.booleans(), st.booleans(), st.integers(-1, 19)),
        st.tuples(st.just("skip"), st.binary(max_size=40)),
    ),
    min_size=1, max_size=4,
)


def _zstd_part(part: tuple[object, ...]) -> tuple[bytes, bytes]:
    if part[0] == "skip":
        data = bytes(part[1])  # type: ignore[arg-type]
        return (0x184D2A5A).to_bytes(4, "little") + len(data).to_bytes(4, "little") + data, b""
    _, kind, n, checksum, size, level = part
    assert isinstance(n, int) and isinstance(level, int)
    content = {"zeros": bytes(n), "random": os.urandom(n), "text": b"%d lines\n" * (n // 8)}[kind]  # type: ignore[index]
    c = zstandard.ZstdCompressor(level=level, write_checksum=bool(checksum), write_content_size=bool(size))
    return c.compress(content), content


@given(parts=_ZSTD_PARTS, cuts=st.lists(st.integers(0, 1 << 20), max_size=12),
       limit=st.sampled_from([0, 1, 4096, 131072]))
@settings(max_examples=40, deadline=None)
def test_zstd_limited_output_is_bounded_and_exact(parts: list[tuple[object, ...]], cuts: list[int], limit: int) -> None:
    # Frames of any shape (checksum or not, content size or not, skippable frames between),
    # fed in arbitrary slices: the content is exact, and no call returns more than its limit
    # plus one block (a zstd block is at most 128 KiB of content; zeros are 4-byte RLE blocks).
    pairs = [_zstd_part(p) for p in parts]
    blob, content = b"".join(b for b, _ in pairs), b"".join(c for _, c in pairs)
    d = codecs.new_decompressor(CC.ZSTANDARD)
    assert isinstance(d, codecs.LimitedDecompressor)
    got = []
    for piece in _split(blob, cuts):
        out = d.decompress_limited(piece, limit)
        while out:
            assert not limit or len(out) <= limit + (128 << 10)
            got.append(out)
            out = d.decompress_limited(b"", limit)
    assert d.finish() == b""
    assert b"".join(got) == content


def test_zstd_truncated_anywhere_is_an_error() -> None:
    blob = zstandard.ZstdCompressor(write_checksum=True).compress(bytes(300_000))
    for cut in range(1, len(blob)):
        d = codecs.new_decompressor(CC.ZSTANDARD)
        d.decompress(blob[:cut])
        with pytest.raises(CodecError, match="truncated"):
            d.finish()


def test_zstd_decompressor_is_used_limited_or_not_but_not_both() -> None:
    blob = codecs.compress(CC.ZSTANDARD, bytes(1000))
    d = codecs.new_decompressor(CC.ZSTANDARD)
    assert isinstance(d, codecs.LimitedDecompressor)
    assert d.decompress(blob[:10]) == b""
    with pytest.raises(CodecError, match="after decompress"):
        d.decompress_limited(blob[10:], 100)
    d = codecs.new_decompressor(CC.ZSTANDARD)
    assert isinstance(d, codecs.LimitedDecompressor)
    out = d.decompress_limited(blob[:10], 100)
    out += d.decompress(blob[10:])  # unlimited from then on, still walking its units
    assert out == bytes(1000) and d.finish() == b""

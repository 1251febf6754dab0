"""Read streams whose client does not read hold one response's worth of memory, not more.

Each stalled reader is a ``serve_read`` of a persisted fragment advanced to its first content
response, which the test keeps (as the transport would, unable to send it) and then stops
pulling: the server's flow control stops a read exactly there. ``tracemalloc`` measures what the
readers hold together. Stores were read 1 MiB at a time, and the store's generator and the read
loop each kept the chunk: a stalled reader held 1.3 MiB (issue 27: 200 readers, +251 MiB).
"""

from __future__ import annotations

import gc
import gzip
import io
import os
import tracemalloc
from collections.abc import AsyncGenerator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gazette.broker.index import Index
from gazette.broker.read import CHUNK_SIZE, serve_read
from gazette.fragment import CoverSet, Fragment, codecs
from gazette.fragment.stores import Stores
from gazette.fragment.stores.base import MIN_FEED, read_stored
from gazette.protocol import protocol_pb2 as pb

JOURNAL = "a/journal"
READERS = 40
LENGTH = 3 << 20


def persisted(root: Path, codec: int) -> tuple[Fragment, bytes]:
    content = os.urandom(LENGTH // 2) * 2 if codec == pb.NONE else (b"0123456789abcdef" * (LENGTH // 16))
    frag = Fragment(JOURNAL, 0, len(content), codec=codec, backing_store="file:///", mod_time=1)  # type: ignore[arg-type]
    path = root / frag.content_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if codec == pb.NONE else gzip.compress(content, 1))
    return frag, content


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP])
async def test_stalled_readers_hold_one_response_each(tmp_path: Path, codec: int) -> None:
    frag, content = persisted(tmp_path, codec)
    index = Index()
    index.replace_remote(CoverSet([frag]))
    replica = SimpleNamespace(index=index, stores=Stores(file_root=str(tmp_path)))
    header = pb.Header()

    async def stall() -> tuple[AsyncGenerator[pb.ReadResponse, None], pb.ReadResponse]:
        reader = serve_read(replica, pb.ReadRequest(journal=JOURNAL), header)  # type: ignore[arg-type]
        meta = await reader.__anext__()
        assert meta.status == pb.OK and meta.fragment.end == len(content)
        first = await reader.__anext__()  # the response the transport cannot send
        assert first.offset == 0 and first.content == content[: len(first.content)]
        return reader, first

    await stall()  # warm up: imports, codec tables, the store
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        stalled = [await stall() for _ in range(READERS)]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_reader = held / READERS
    # One response of at most CHUNK_SIZE (128 KiB) and the reader's small state (compressed
    # content: an item a little over CHUNK_SIZE may be kept while responses are cut from it);
    # before: 1.3 MiB, and 3 MiB for this compressed fragment.
    bound = CHUNK_SIZE + (64 << 10) if codec == pb.NONE else 2 * CHUNK_SIZE + (64 << 10)
    assert per_reader < bound, f"{per_reader / 1024:.0f} KiB per stalled reader"
    assert all(len(first.content) <= CHUNK_SIZE for _, first in stalled)

    # And each still reads on to the fragment's end when its client does.
    reader, first = stalled[0]
    got = [first.content]
    async for resp in reader:
        got.append(resp.content)
    assert b"".join(got) == content
    for reader, _ in stalled[1:]:
        await reader.aclose()


CONTENTS = {
    "random": lambda: os.urandom(900_000),
    "text": lambda: b"".join(b"%d,some message text %d\n" % (i, i * 7919 % 1000) for i in range(40_000)),
    "zeros": lambda: bytes(1_500_000),
}


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION])
@pytest.mark.parametrize("kind", sorted(CONTENTS))
@pytest.mark.parametrize("begin", [0, 200_001])
async def test_bounded_read_stored_yields_the_content_in_bounded_items(codec: int, kind: str, begin: int) -> None:
    content = CONTENTS[kind]()
    stored = io.BytesIO(codecs.compress(codec, content))  # type: ignore[arg-type]
    frag = Fragment(JOURNAL, 0, len(content), codec=codec)  # type: ignore[arg-type]
    items = [item async for item in read_stored(frag, begin, 0, lambda: stored.read(CHUNK_SIZE), CHUNK_SIZE)]
    assert b"".join(items) == content[begin:]
    if codec == pb.ZSTANDARD:
        # A zstd block of zeros is a few bytes (here 256 bytes hold the whole 1.5 MB): the
        # decompressor is given the limit, and overshoots it by at most one block (128 KiB).
        assert max(len(i) for i in items) <= CHUNK_SIZE + (128 << 10)
    # Content of a steady ratio: an item overshoots only while the feed adapts to it, and at
    # most by what MIN_FEED bytes expand to (deflate: 1032:1). (A fragment crafted to change
    # its ratio abruptly can still make one item that feed's times its new ratio.)
    assert max(len(i) for i in items) <= 2 * CHUNK_SIZE + 1032 * MIN_FEED

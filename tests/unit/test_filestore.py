"""FileStore: persist / list / open round trips per codec, atomicity, listing, path safety."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from gazette.broker.spool import Spool, SpoolFile, SpoolSnapshot
from gazette.fragment import (
    CoverSet,
    Fragment,
    StoreAuthError,
    StoreError,
    StorePathError,
    UnsupportedStoreError,
    codecs,
    parse_content_name,
)
from gazette.fragment.codecs import Codec
from gazette.fragment.stores import FileStore, Stores, store_for_url, walk_all_stores
from gazette.protocol import protocol_pb2 as pb

CC = pb.CompressionCodec
ALL = [CC.NONE, CC.GZIP, CC.ZSTANDARD, CC.SNAPPY, CC.GZIP_OFFLOAD_DECOMPRESSION]


def make_snapshot(journal: str, begin: int, data: bytes, codec: Codec = CC.NONE) -> SpoolSnapshot:
    done: list[SpoolSnapshot] = []
    spool = Spool(journal, on_complete=done.append)
    spool.must_apply(
        pb.ReplicateRequest(proposal=Fragment(journal, begin, begin, codec=codec).to_proto())
    )
    for i in range(0, len(data), 1 << 16):
        spool.apply(pb.ReplicateRequest(content=data[i : i + (1 << 16)], content_delta=i))
    spool.must_apply(pb.ReplicateRequest(proposal=spool.next()))
    end = begin + len(data)
    spool.must_apply(
        pb.ReplicateRequest(proposal=Fragment(journal, end, end, codec=codec).to_proto())
    )
    return done[0]


async def read(store: FileStore, f: Fragment, offset: int | None = None) -> bytes:
    gen = store.open(f, offset)
    async with contextlib.aclosing(gen):
        return b"".join([chunk async for chunk in gen])


@pytest.mark.parametrize("codec", ALL)
async def test_persist_list_open_round_trip(tmp_path: Path, codec: Codec) -> None:
    store = FileStore("file:///", str(tmp_path))
    data = os.urandom(1000) * 2500  # 2.5 MB, several read chunks.
    snap = make_snapshot("a/journal", 1000, data, codec)

    stored = await store.persist(snap)
    assert stored == Fragment(
        "a/journal", 1000, 1000 + len(data), hashlib.sha1(data).digest(), codec,
        "file:///", stored.mod_time,
    )  # fmt: skip
    assert stored.mod_time > 0 and stored.file is None

    # The file is named by the SHA1 of its decompressed content.
    path = tmp_path / "a/journal" / stored.content_name()
    raw = path.read_bytes()
    content = codecs.decompress(codec, raw)
    assert content == data
    name = parse_content_name("a/journal", path.name)
    assert name.sum == hashlib.sha1(content).digest()
    assert (
        path.name.split("-")[2].removesuffix(codecs.extension(codec))
        == hashlib.sha1(content).hexdigest()
    )

    assert await store.list("a/journal") == [stored]
    assert await store.exists(stored)
    assert await read(store, stored) == data
    assert await read(store, stored, 1000 + 1_234_567) == data[1_234_567:]
    assert await read(store, stored, 1000 + len(data)) == b""
    with pytest.raises(StoreError, match="outside"):
        await read(store, stored, 999)

    # Persisting again is a no-op.
    assert await store.persist(snap) == stored
    assert store.sign_url(stored, 60) == "file:///a/journal/" + stored.content_name()

    await store.remove(stored)
    assert await store.list("a/journal") == []
    with pytest.raises(StoreError):
        await store.remove(stored)
    with pytest.raises(StoreError, match="not in"):
        await read(store, stored)


async def test_listing_order_postfix_and_strays(tmp_path: Path) -> None:
    store = FileStore("file:///base/", str(tmp_path))
    (tmp_path / "base").mkdir()
    stored = []
    for begin, data in [(300, b"ccc"), (0, b"a" * 100), (100, b"b" * 200)]:
        stored.append(await store.persist(make_snapshot("j/one", begin, data), "date=2024-01-01"))
    assert (tmp_path / "base/j/one/date=2024-01-01").is_dir()

    # Strays: an in-flight upload, an unparseable file, another journal's fragment.
    jdir = tmp_path / "base/j/one"
    (jdir / (".partial-" + stored[0].content_name() + "123")).write_bytes(b"junk")
    (jdir / "README").write_text("not a fragment")
    await store.persist(make_snapshot("j/other", 0, b"zz"))

    listed = await store.list("j/one")
    assert [(f.begin, f.end) for f in listed] == [(0, 100), (100, 300), (300, 303)]
    assert all(f.path_postfix == "date=2024-01-01" for f in listed)
    assert await read(store, listed[1]) == b"b" * 200

    stores = Stores(str(tmp_path))
    assert stores.get("file:///base/") is stores.get("file:///base/")
    cover = await walk_all_stores("j/one", ["file:///base/"], stores)
    assert isinstance(cover, CoverSet) and [(f.begin, f.end) for f in cover] == [
        (0, 100), (100, 300), (300, 303),
    ]  # fmt: skip
    assert await store.list("j/missing") == []


async def test_put_refuses_missing_base_directory(tmp_path: Path) -> None:
    store = FileStore("file:///nonexistent/", str(tmp_path))
    with pytest.raises(StoreAuthError, match="invalid file store directory"):
        await store.persist(make_snapshot("a/journal", 0, b"data"))


async def test_failed_write_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore("file:///", str(tmp_path))
    snap = make_snapshot("a/journal", 0, b"data" * 1000)

    def failing_pread(self: SpoolFile, offset: int, n: int) -> bytes:
        raise OSError(5, "Input/output error")

    def failing_copy(*args: object) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(SpoolFile, "pread", failing_pread)
    monkeypatch.setattr(os, "copy_file_range", failing_copy, raising=False)
    monkeypatch.setattr(SpoolFile, "link", lambda self, path, length: False)  # the copying path
    with pytest.raises(OSError, match="Input/output"):
        await store.persist(snap)
    assert list((tmp_path / "a/journal").iterdir()) == []
    assert await store.list("a/journal") == []


async def test_persist_without_kernel_copy_falls_back_to_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An uncompressed spool is copied within the kernel; where that is refused (another
    # filesystem, an old kernel) it is copied through reads and writes, with the same result.
    content = bytes(range(256)) * 5000
    calls: list[int] = []

    def refusing_copy(*args: object) -> int:
        calls.append(1)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refusing_copy, raising=False)
    monkeypatch.setattr(SpoolFile, "link", lambda self, path, length: False)  # the copying path
    store = FileStore("file:///", str(tmp_path))
    frag = await store.persist(make_snapshot("a/journal", 0, content))
    assert calls
    [path] = list((tmp_path / "a/journal").iterdir())
    assert path.read_bytes() == content
    assert frag.end == len(content)


async def test_uncompressed_spool_is_persisted_by_linking_its_file(tmp_path: Path) -> None:
    # The persisted fragment is the spool's own file (one inode, no copy), cut to the fragment:
    # bytes of an append that was rolled back past its end are not part of it.
    journal = "a/journal"
    done: list[SpoolSnapshot] = []
    spool = Spool(journal, directory=str(tmp_path), on_complete=done.append)
    spool.must_apply(pb.ReplicateRequest(proposal=Fragment(journal, 0, 0).to_proto()))
    spool.apply(pb.ReplicateRequest(content=b"kept" * 1000, content_delta=0))
    spool.must_apply(pb.ReplicateRequest(proposal=spool.next()))
    committed = spool.fragment
    spool.apply(pb.ReplicateRequest(content=b"rolled back" * 100, content_delta=0))
    spool.must_apply(pb.ReplicateRequest(proposal=committed.to_proto()))  # the rollback
    spool.must_apply(pb.ReplicateRequest(proposal=Fragment(journal, 4000, 4000).to_proto()))
    [snap] = done
    assert os.fstat(snap.file.fileno()).st_size > 4000

    store = FileStore("file:///", str(tmp_path / "root"))
    (tmp_path / "root").mkdir()
    frag = await store.persist(snap)
    [path] = list((tmp_path / "root" / journal).iterdir())
    assert os.stat(path).st_ino == os.fstat(snap.file.fileno()).st_ino
    assert path.read_bytes() == b"kept" * 1000
    assert hashlib.sha1(path.read_bytes()).hexdigest() == frag.sum.hex()
    assert await read(store, frag, 100) == (b"kept" * 1000)[100:]
    assert await store.persist(snap) == frag  # again: found, not linked twice


def on_another_file_system(directory: str, than: Path) -> bool:
    return os.path.isdir(directory) and os.stat(directory).st_dev != os.stat(than).st_dev


async def test_spool_that_cannot_be_linked_is_copied(tmp_path: Path) -> None:
    # A spool on another file system than the store (EXDEV), or a compressed codec: the store
    # writes a copy instead.
    shm = "/dev/shm"
    if not on_another_file_system(shm, tmp_path):
        pytest.skip("needs a second file system")
    with tempfile.TemporaryDirectory(dir=shm) as other:
        done: list[SpoolSnapshot] = []
        spool = Spool("a/journal", directory=other, on_complete=done.append)
        spool.must_apply(pb.ReplicateRequest(proposal=Fragment("a/journal", 0, 0).to_proto()))
        spool.apply(pb.ReplicateRequest(content=b"abc" * 1000, content_delta=0))
        spool.must_apply(pb.ReplicateRequest(proposal=spool.next()))
        spool.must_apply(pb.ReplicateRequest(proposal=Fragment("a/journal", 3000, 3000).to_proto()))
        [snap] = done
        store = FileStore("file:///", str(tmp_path))
        await store.persist(snap)
        zipped = make_snapshot("b/journal", 0, b"abc" * 1000, CC.GZIP)
        await store.persist(zipped)
        for name, s in (("a/journal", snap), ("b/journal", zipped)):
            [path] = list((tmp_path / name).iterdir())
            assert os.stat(path).st_ino != os.fstat(s.file.fileno()).st_ino
        [path] = list((tmp_path / "a/journal").iterdir())
        assert path.read_bytes() == b"abc" * 1000
        snap.file.close()


def test_path_traversal_is_refused(tmp_path: Path) -> None:
    store = FileStore("file:///", str(tmp_path / "root"))
    for bad in ["../etc/passwd", "a/../../x", "a/\x00"]:
        with pytest.raises(StorePathError):
            store._fs_path(bad)
    assert store._fs_path("/a/b") == str(tmp_path / "root/a/b")
    with pytest.raises(StoreError, match="escapes"):
        FileStore("file:///../", str(tmp_path / "root"))._fragment_path(Fragment("j", 0, 1))


def test_url_handling(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedStoreError, match="gopher"):
        store_for_url("gopher://x/", str(tmp_path))
    with pytest.raises(StoreError, match="unknown argument"):
        FileStore("file:///?invalid=param", str(tmp_path))
    with pytest.raises(StoreError, match="file root"):
        store_for_url("file:///", None)
    # Gazette's rewriter: the first occurrence of |find| in the content path is replaced.
    f = Fragment("foo/bar/v1/part-000", 0, 1)
    # Argument names match case-insensitively, as Gazette's decoder matches them.
    for query in ["find=bar/v1/&replace=old/", "Find=bar/v1/&REPLACE=old/"]:
        store = FileStore(f"file:///?{query}", str(tmp_path))
        assert store.sign_url(f, 60) == "file:///foo/old/part-000/" + f.content_name()


async def test_health_check(tmp_path: Path) -> None:
    await FileStore("file:///", str(tmp_path)).health_check()
    assert (tmp_path / ".test/health-check").read_bytes() == b"health-check\n"
    with pytest.raises(StoreAuthError):
        await FileStore("file:///missing/", str(tmp_path)).health_check()


async def test_delete_probe(tmp_path: Path) -> None:
    store = FileStore("file:///base/", str(tmp_path))
    with pytest.raises(StoreAuthError, match="invalid file store directory"):
        await store.check_delete("probe/")
    (tmp_path / "base").mkdir()
    await store.check_delete("probe/")
    assert list((tmp_path / "base/probe").iterdir()) == []

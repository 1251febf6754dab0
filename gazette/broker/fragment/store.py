"""Fragment stores: where completed fragments are persisted, listed, read and removed.

A store is named by a URL (a journal's ``fragment.stores`` entry, e.g. ``file:///``,
``s3://bucket/prefix/``). A fragment lives in it at ``{url path}{content_path}``, i.e.
``{prefix}{journal}/[{postfix}/]{content_name}``, optionally rewritten by the URL's ``find`` and
``replace`` arguments (the first occurrence of ``find`` in the content path is replaced), as in
Gazette.

Invariants:

* Stored content is the fragment compressed under its codec; :meth:`FragmentStore.open`
  decompresses it (GZIP_OFFLOAD_DECOMPRESSION included) and checks its length.
* Persisting is idempotent: a fragment already present is left alone (names are content
  addressed, so an existing name has the same content).
* :class:`FileStore` writes under a ``.partial-`` name in the target directory and renames it into
  place, so a listed fragment is always complete; listings skip dot-files and names that do not
  parse, and come back in offset order. Every path is checked to stay under the file root.
* ``s3://`` URLs resolve to :class:`~gazette.broker.fragment.s3store.S3Store`, imported on first
  use so that the base install (without boto3, the ``s3`` extra) works for ``file://`` stores;
  without boto3 an ``s3://`` store is an :class:`UnsupportedStoreError` naming the extra.
* ``sign_url`` of a file store is ``file://{path}`` (the path below the file root), as Gazette's:
  readers sharing the file root (e.g. a NAS mount) may read it directly.
* Blocking file work runs in worker threads (``asyncio.to_thread``); nothing here blocks the
  event loop for more than a chunk.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import IO, Protocol
from urllib.parse import parse_qs, urlsplit

from gazette.broker.fragment.codecs import new_decompressor
from gazette.broker.fragment.errors import (
    ContentNameError,
    StoreAuthError,
    StoreError,
    StorePathError,
    UnsupportedStoreError,
)
from gazette.broker.fragment.fragment import CoverSet, Fragment, parse_content_name
from gazette.broker.fragment.spool import SpoolSnapshot

__all__ = [
    "FileStore",
    "FragmentStore",
    "StoreFactory",
    "Stores",
    "register_store",
    "store_for_url",
    "walk_all_stores",
]

log = logging.getLogger(__name__)

OPEN_CHUNK = 1 << 20
HEALTH_CHECK_PATH = ".test/health-check"
_HEALTH_CHECK_CONTENT = b"health-check\n"


class FragmentStore(Protocol):
    """A fragment store (see the module docstring)."""

    @property
    def url(self) -> str:
        """The store's URL, which persisted fragments carry as their ``backing_store``."""
        ...

    async def list(self, journal: str) -> list[Fragment]:
        """Fragments of ``journal`` in the store, in offset order, with ``mod_time`` set."""
        ...

    async def exists(self, fragment: Fragment) -> bool:
        """Whether ``fragment`` (at its path postfix) is present."""
        ...

    def open(self, fragment: Fragment, offset: int | None = None) -> AsyncGenerator[bytes, None]:
        """Decompressed content of ``fragment`` from journal ``offset`` (default: its begin).

        An async generator: iterate it to the end, or close it (``contextlib.aclosing``).
        """
        ...

    async def persist(self, snapshot: SpoolSnapshot, path_postfix: str = "") -> Fragment:
        """Store a completed spool unless present; returns the stored fragment (with
        ``backing_store``, ``path_postfix`` and ``mod_time`` set)."""
        ...

    async def remove(self, fragment: Fragment) -> None:
        """Delete ``fragment`` from the store."""
        ...

    def sign_url(self, fragment: Fragment, ttl: float) -> str | None:
        """A URL from which a reader may GET the stored fragment for ``ttl`` seconds."""
        ...

    async def health_check(self) -> None:
        """Raise StoreError unless the store can be written, read and listed."""
        ...


StoreFactory = Callable[[str, "str | None"], FragmentStore]
"""Builds a store from its URL and the broker's file root."""

_FACTORIES: dict[str, StoreFactory] = {}


def register_store(scheme: str, factory: StoreFactory) -> None:
    """Make ``scheme://`` URLs resolve to stores built by ``factory``."""
    _FACTORIES[scheme] = factory


def store_for_url(url: str, file_root: str | None = None) -> FragmentStore:
    """Build the store of a fragment store URL (``file_root`` roots ``file://`` stores)."""
    scheme = urlsplit(url).scheme
    try:
        factory = _FACTORIES[scheme]
    except KeyError:
        raise UnsupportedStoreError(
            f"unsupported fragment store scheme {scheme!r} (of {url!r})"
        ) from None
    return factory(url, file_root)


class Stores:
    """Builds each store once per URL, for a broker with a given file root."""

    def __init__(self, file_root: str | None = None) -> None:
        self.file_root = file_root
        self._stores: dict[str, FragmentStore] = {}

    def get(self, url: str) -> FragmentStore:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = store_for_url(url, self.file_root)
        return store

    def sign_url(self, fragment: Fragment, ttl: float) -> str | None:
        """Index signer: sign through the fragment's backing store."""
        return self.get(fragment.backing_store).sign_url(fragment, ttl)


async def walk_all_stores(journal: str, urls: Iterable[str], stores: Stores) -> CoverSet:
    """The cover set of every fragment of ``journal`` listed in any of ``urls``."""
    out = CoverSet()
    for url in urls:
        for f in await stores.get(url).list(journal):
            out.add(f)
    return out


def _rewriter(url: str) -> tuple[str, str, str]:
    """``(prefix, find, replace)`` of a store URL, refusing unknown query arguments."""
    parts = urlsplit(url)
    # Gazette's URL argument decoder matches names case-insensitively.
    args = {k.lower(): v for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(args) - {"find", "replace"}
    if unknown:
        raise StoreError(f"unknown argument(s) {sorted(unknown)} of fragment store {url!r}")
    find = args.get("find", [""])[0]
    replace = args.get("replace", [""])[0]
    return parts.path, find, replace



async def read_stored(
    fragment: Fragment, begin: int, pos: int, read_raw: Callable[[], bytes]
) -> AsyncGenerator[bytes, None]:
    """Decompressed content of a stored fragment from journal offset ``begin``.

    ``read_raw`` returns the stored (compressed) bytes in order, ``b""`` at their end, from
    journal offset ``pos`` on (``fragment.begin``, or beyond it for a ranged read of
    uncompressed content); it runs in a worker thread together with the decompression. Raises
    StoreError unless the content ends exactly at ``fragment.end``.
    """
    decompressor = new_decompressor(fragment.codec)

    def step() -> bytes | None:
        raw = read_raw()
        return decompressor.decompress(raw) if raw else None

    while True:
        data = await asyncio.to_thread(step)
        if data is None:
            pos += len(decompressor.finish())
            break
        start = pos
        pos += len(data)
        if pos > fragment.end:
            break
        if pos <= begin or not data:
            continue
        yield data if start >= begin else data[begin - start :]
    if pos != fragment.end:
        raise StoreError(
            f"stored fragment {fragment.content_path()} holds "
            f"{'more than ' if pos > fragment.end else ''}{pos - fragment.begin} bytes, "
            f"expected {fragment.content_length}"
        )


class FileStore:
    """A ``file://`` store: fragments are files under the broker's ``--broker.file-root``."""

    def __init__(self, url: str, file_root: str | None) -> None:
        if file_root is None:
            raise StoreError(f"fragment store {url!r} needs a configured file root")
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise StoreError(f"not a file:// fragment store URL: {url!r}")
        if parts.netloc:
            raise StoreError(f"file:// store URL {url!r} must not name a host")
        self._url = url
        self._root = os.path.abspath(file_root)
        self._prefix, self._find, self._replace = _rewriter(url)

    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"FileStore({self._url!r}, root={self._root!r})"

    def _rewrite(self, path: str) -> str:
        if self._find:
            path = path.replace(self._find, self._replace, 1)
        return self._prefix + path

    def _fs_path(self, store_path: str) -> str:
        """Absolute file path of a store path, refusing any escape from the root."""
        rel = store_path.lstrip("/")
        if any(part == ".." for part in rel.split("/")) or "\x00" in rel:
            raise StorePathError(f"path {store_path!r} escapes the file store root")
        path = os.path.normpath(os.path.join(self._root, rel))
        if os.path.commonpath([self._root, path]) != self._root:
            raise StorePathError(f"path {store_path!r} escapes the file store root")
        return path

    def _fragment_path(self, fragment: Fragment) -> str:
        return self._fs_path(self._rewrite(fragment.content_path()))

    # -- Listing.

    async def list(self, journal: str) -> list[Fragment]:
        return await asyncio.to_thread(self._list_sync, journal)

    def _list_sync(self, journal: str) -> builtins.list[Fragment]:
        directory = self._fs_path(self._rewrite(journal + "/"))
        out: builtins.list[Fragment] = []
        for dirpath, dirnames, filenames in os.walk(directory):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue  # In-flight ".partial-" uploads and other hidden files.
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, directory).replace(os.sep, "/")
                try:
                    f = parse_content_name(journal, rel)
                    mtime = os.stat(full).st_mtime
                except ContentNameError as err:
                    log.warning("skipping stray file %r of journal %s: %s", rel, journal, err)
                    continue
                except FileNotFoundError:
                    continue  # Removed while listing.
                out.append(_persisted(f, self._url, mtime))
        out.sort(key=lambda f: (f.begin, f.end))
        return out

    async def exists(self, fragment: Fragment) -> bool:
        return await asyncio.to_thread(os.path.exists, self._fragment_path(fragment))

    # -- Reading.

    async def open(
        self, fragment: Fragment, offset: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        begin = fragment.begin if offset is None else offset
        if not fragment.begin <= begin <= fragment.end:
            raise StoreError(f"offset {begin} is outside of fragment {fragment}")
        path = self._fragment_path(fragment)
        try:
            fh = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError as err:
            raise StoreError(f"fragment {fragment.content_path()} is not in {self._url}") from err
        try:
            async for data in read_stored(fragment, begin, fragment.begin, lambda: fh.read(OPEN_CHUNK)):
                yield data
        finally:
            fh.close()

    def sign_url(self, fragment: Fragment, ttl: float) -> str | None:
        return "file://" + self._rewrite(fragment.content_path())

    # -- Writing.

    async def persist(self, snapshot: SpoolSnapshot, path_postfix: str = "") -> Fragment:
        return await asyncio.to_thread(self._persist_sync, snapshot, path_postfix)

    def _persist_sync(self, snapshot: SpoolSnapshot, path_postfix: str) -> Fragment:
        f = snapshot.fragment
        target = Fragment(f.journal, f.begin, f.end, f.sum, f.codec, self._url, 0, path_postfix)
        path = self._fragment_path(target)
        try:
            return _persisted(target, self._url, os.stat(path).st_mtime)
        except FileNotFoundError:
            pass
        self._put(path, snapshot.write_compressed)
        return _persisted(target, self._url, os.stat(path).st_mtime)

    def _put(self, path: str, write: Callable[[IO[bytes]], object]) -> None:
        base = self._fs_path(self._prefix)
        if not os.path.isdir(base):
            raise StoreAuthError(f"invalid file store directory {base!r} (of {self._url!r})")
        directory, name = os.path.split(path)
        try:
            os.makedirs(directory, mode=0o750, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                prefix=".partial-" + name, dir=directory, delete=False
            ) as out:
                tmp = out.name
                try:
                    write(out)
                except BaseException:
                    out.close()
                    os.unlink(tmp)
                    raise
            try:
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except PermissionError as err:
            raise StoreAuthError(f"writing {path!r}: {err}") from err

    async def remove(self, fragment: Fragment) -> None:
        path = self._fragment_path(fragment)
        try:
            await asyncio.to_thread(os.remove, path)
        except FileNotFoundError as err:
            raise StoreError(f"fragment {fragment.content_path()} is not in {self._url}") from err

    async def health_check(self) -> None:
        await asyncio.to_thread(self._health_check_sync)

    def _health_check_sync(self) -> None:
        path = self._fs_path(self._prefix + HEALTH_CHECK_PATH)
        self._put(path, lambda out: out.write(_HEALTH_CHECK_CONTENT))
        with open(path, "rb") as fh:
            if fh.read() != _HEALTH_CHECK_CONTENT:
                raise StoreError(f"health check of {self._url!r} read back other content")


    async def check_delete(self, prefix: str = "") -> None:
        """Gazette's delete probe: write a file under ``prefix`` and remove it."""

        def probe() -> None:
            path = self._fs_path(self._prefix + prefix + ".gazette-delete-probe")
            self._put(path, lambda out: out.write(b"gazette-delete-probe\n"))
            try:
                os.remove(path)
            except PermissionError as err:
                raise StoreAuthError(f"removing {path!r}: {err}") from err

        await asyncio.to_thread(probe)


def _persisted(f: Fragment, url: str, mtime: float) -> Fragment:
    return Fragment(f.journal, f.begin, f.end, f.sum, f.codec, url, int(mtime), f.path_postfix)


def _s3_store(url: str, file_root: str | None) -> FragmentStore:
    """Builds an S3Store, importing boto3 only when an ``s3://`` store is first used."""
    try:
        from gazette.broker.fragment.s3store import S3Store
    except ImportError as err:
        raise UnsupportedStoreError(
            f"s3:// fragment stores need boto3, which is not installed ({err}); "
            f"install the 's3' extra: pip install 'gazette[s3]' (store {url!r})"
        ) from err
    return S3Store(url, file_root)


register_store("file", FileStore)
register_store("s3", _s3_store)

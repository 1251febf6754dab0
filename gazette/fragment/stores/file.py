"""The ``file://`` fragment store: fragments are files under a broker's ``--broker.file-root``.

Invariants:

* A fragment is written under a ``.partial-`` name in its target directory and renamed into
  place, or, where the content offers it (a completed uncompressed spool on the same file
  system), its file is linked into place whole, so a listed fragment is always complete;
  listings skip dot-files and names that do not parse, and come back in offset order. Every path is checked to stay under the file root.
* ``sign_url`` is ``file://{path}`` (the path below the file root), as Gazette's: readers sharing
  the file root (e.g. a NAS mount) may read it directly.
* Blocking file work runs in worker threads (``asyncio.to_thread``).
* Errors name paths relative to the file root, never the root itself (they reach clients, e.g.
  through FragmentStoreHealth): OS errors of writes, probes and checks become StoreErrors so.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncGenerator, Callable
from typing import IO
from urllib.parse import urlsplit

from gazette.fragment.errors import (
    ContentNameError,
    StoreAuthError,
    StoreError,
    StorePathError,
)
from gazette.fragment.fragment import Fragment, parse_content_name
from gazette.fragment.stores.base import (
    HEALTH_CHECK_CONTENT,
    HEALTH_CHECK_PATH,
    OPEN_CHUNK,
    Content,
    open_offset,
    persisted,
    read_stored,
    rewriter,
)

__all__ = ["FileStore"]

log = logging.getLogger(__name__)


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
        self._prefix, self._find, self._replace = rewriter(url)

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

    def _rel(self, path: str) -> str:
        """``path`` as the store names it: relative to the file root."""
        return os.path.relpath(path, self._root).replace(os.sep, "/")

    def _os_error(self, what: str, path: str, err: OSError) -> StoreError:
        """A StoreError for ``err`` naming ``path`` relative to the root (an OSError's own
        text holds the absolute path)."""
        cls = StoreAuthError if isinstance(err, PermissionError) else StoreError
        return cls(f"{what} {self._rel(path)!r} of {self._url}: {err.strerror or type(err).__name__}")

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
                out.append(persisted(f, self._url, mtime))
        out.sort(key=lambda f: (f.begin, f.end))
        return out

    async def exists(self, fragment: Fragment) -> bool:
        return await asyncio.to_thread(os.path.exists, self._fragment_path(fragment))

    # -- Reading.

    async def open(
        self, fragment: Fragment, offset: int | None = None, chunk: int = OPEN_CHUNK
    ) -> AsyncGenerator[bytes, None]:
        begin = open_offset(fragment, offset)
        path = self._fragment_path(fragment)
        try:
            fh = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError as err:
            raise StoreError(f"fragment {fragment.content_path()} is not in {self._url}") from err
        try:
            async for data in read_stored(fragment, begin, fragment.begin, lambda: fh.read(chunk), chunk):
                yield data
        finally:
            fh.close()

    def sign_url(self, fragment: Fragment, ttl: float) -> str | None:
        return "file://" + self._rewrite(fragment.content_path())

    # -- Writing.

    async def persist(self, content: Content, path_postfix: str = "") -> Fragment:
        return await asyncio.to_thread(self._persist_sync, content, path_postfix)

    def _persist_sync(self, content: Content, path_postfix: str) -> Fragment:
        f = content.fragment
        target = Fragment(f.journal, f.begin, f.end, f.sum, f.codec, self._url, 0, path_postfix)
        path = self._fragment_path(target)
        try:
            return persisted(target, self._url, os.stat(path).st_mtime)
        except FileNotFoundError:
            pass
        if not self._link(path, content):
            self._put(path, content.write_compressed)
        return persisted(target, self._url, os.stat(path).st_mtime)

    def _link(self, path: str, content: Content) -> bool:
        """Persists ``content`` by naming its file ``path`` where it offers to (the broker's
        completed spool, uncompressed, on this file system): no copy, and no second set of
        page-cache pages for the same bytes. The name appears complete, as a rename's would."""
        link = getattr(content, "link_to", None)
        if link is None:
            return False
        self._check_base()
        try:
            os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
            linked: bool = link(path)
        except FileExistsError:
            return True  # persisted meanwhile: fragments are named by their content
        except OSError as err:
            raise self._os_error("writing", path, err) from err
        return linked

    def _check_base(self) -> None:
        base = self._fs_path(self._prefix)
        if not os.path.isdir(base):
            raise StoreAuthError(f"invalid file store directory {self._rel(base)!r} (of {self._url!r})")

    def _put(self, path: str, write: Callable[[IO[bytes]], object]) -> None:
        self._check_base()
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
        except OSError as err:
            if isinstance(err, PermissionError) or err.filename is not None:
                raise self._os_error("writing", path, err) from err  # its text holds the path
            raise  # e.g. reading the content: not the store's

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
        self._put(path, lambda out: out.write(HEALTH_CHECK_CONTENT))
        try:
            with open(path, "rb") as fh:
                if fh.read() != HEALTH_CHECK_CONTENT:
                    raise StoreError(f"health check of {self._url!r} read back other content")
        except OSError as err:
            raise self._os_error("reading", path, err) from err


    async def check_delete(self, prefix: str = "") -> None:
        """Gazette's delete probe: write a file under ``prefix`` and remove it."""

        def probe() -> None:
            path = self._fs_path(self._prefix + prefix + ".gazette-delete-probe")
            self._put(path, lambda out: out.write(b"gazette-delete-probe\n"))
            try:
                os.remove(path)
            except OSError as err:
                raise self._os_error("removing", path, err) from err

        await asyncio.to_thread(probe)

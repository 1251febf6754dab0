"""Fragment stores: the protocol every backend implements, the URL registry, and helpers.

A store is named by a URL (a journal's ``fragment.stores`` entry, e.g. ``file:///``,
``s3://bucket/prefix/``). A fragment lives in it at ``{url path}{content_path}``, i.e.
``{prefix}{journal}/[{postfix}/]{content_name}``, optionally rewritten by the URL's ``find`` and
``replace`` arguments (the first occurrence of ``find`` in the content path is replaced), as in
Gazette. Backends: ``gazette.fragment.stores.file`` (``file://``), ``gazette.fragment.stores.s3`` (``s3://``).

Invariants:

* Stored content is the fragment compressed under its codec; :meth:`FragmentStore.open`
  decompresses it (GZIP_OFFLOAD_DECOMPRESSION included, through :func:`read_stored`) and checks
  its length.
* Persisting is idempotent: a fragment already present is left alone (names are content
  addressed, so an existing name has the same content). What is persisted is any
  :class:`Content` (the broker's spool snapshots are one): stores know nothing of spools.
* The registry maps a URL scheme to a factory; a backend with optional dependencies is
  registered by ``"module:attr"`` and imported on first use (``s3://`` needs boto3, the ``s3``
  extra); a missing dependency is an :class:`UnsupportedStoreError` naming the extra.
* Blocking work runs in worker threads (``asyncio.to_thread``); nothing here blocks the event
  loop for more than a chunk.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from typing import IO, Protocol
from urllib.parse import parse_qs, urlsplit

from gazette.fragment.codecs import NONE, LimitedDecompressor, new_decompressor
from gazette.fragment.errors import StoreError, UnsupportedStoreError
from gazette.fragment.fragment import CoverSet, Fragment

__all__ = [
    "HEALTH_CHECK_CONTENT",
    "HEALTH_CHECK_PATH",
    "OPEN_CHUNK",
    "Content",
    "FragmentStore",
    "StoreFactory",
    "Stores",
    "open_offset",
    "persisted",
    "read_stored",
    "register_store",
    "rewriter",
    "store_for_url",
    "walk_all_stores",
]


class Content(Protocol):
    """A completed fragment's content, ready to persist (the broker's ``SpoolSnapshot``)."""

    @property
    def fragment(self) -> Fragment:
        """The fragment the content is (journal, offsets, sum, codec)."""
        ...

    def write_compressed(self, out: IO[bytes]) -> int:
        """Writes the content compressed under ``fragment.codec`` to ``out``; returns bytes written."""
        ...

    def iter_compressed(self) -> Iterator[bytes]:
        """The content compressed under ``fragment.codec``, in chunks."""
        ...

    # Optional capability (the broker's spool has it): ``link_to(path) -> bool`` gives the
    # content, already stored as ``path`` wants it, that name without copying it (a local
    # store on the same file system); False where it cannot, and the store writes it instead.


OPEN_CHUNK = 1 << 20
HEALTH_CHECK_PATH = ".test/health-check"
HEALTH_CHECK_CONTENT = b"health-check\n"


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

    def open(self, fragment: Fragment, offset: int | None = None,
             chunk: int = OPEN_CHUNK) -> AsyncGenerator[bytes, None]:
        """Decompressed content of ``fragment`` from journal ``offset`` (default: its begin),
        read ``chunk`` stored bytes at a time, in items of about ``chunk`` bytes (see
        :func:`read_stored`'s ``bounded``).

        An async generator: iterate it to the end, or close it (``contextlib.aclosing``).
        """
        ...

    async def persist(self, content: Content, path_postfix: str = "") -> Fragment:
        """Store completed ``content`` unless present; returns the stored fragment (with
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

_FACTORIES: dict[str, StoreFactory | str] = {}
_EXTRAS: dict[str, str] = {}


def register_store(scheme: str, factory: StoreFactory | str, extra: str = "") -> None:
    """Make ``scheme://`` URLs resolve to stores built by ``factory``: a callable, or a
    ``"module:attr"`` imported on first use (``extra`` names the install extra it needs)."""
    _FACTORIES[scheme] = factory
    _EXTRAS[scheme] = extra


def _resolve(scheme: str, url: str) -> StoreFactory:
    factory = _FACTORIES[scheme]
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        try:
            # Resolved on every build (sys.modules caches the import): a store is built once
            # per URL, and an import that failed may succeed once its extra is installed.
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        except ImportError as err:
            extra = _EXTRAS.get(scheme, "")
            hint = f"; install the {extra!r} extra: pip install 'gazette[{extra}]'" if extra else ""
            raise UnsupportedStoreError(
                f"{scheme}:// fragment stores need a dependency which is not installed "
                f"({err}){hint} (store {url!r})"
            ) from err
    return factory


def store_for_url(url: str, file_root: str | None = None) -> FragmentStore:
    """Build the store of a fragment store URL (``file_root`` roots ``file://`` stores)."""
    scheme = urlsplit(url).scheme
    if scheme not in _FACTORIES:
        raise UnsupportedStoreError(
            f"unsupported fragment store scheme {scheme!r} (of {url!r})"
        ) from None
    return _resolve(scheme, url)(url, file_root)


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


def rewriter(url: str) -> tuple[str, str, str]:
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



MIN_FEED = 256
"""Stored bytes first fed to a decompressor by a bounded :func:`read_stored` (deflate expands
at most ~1032:1: a quarter MiB at worst), doubled while the output stays small."""


async def read_stored(
    fragment: Fragment, begin: int, pos: int, read_raw: Callable[[], bytes],
    bounded: int = 0,
) -> AsyncGenerator[bytes, None]:
    """Decompressed content of a stored fragment from journal offset ``begin``.

    ``read_raw`` returns the stored (compressed) bytes in order, ``b""`` at their end, from
    journal offset ``pos`` on (``fragment.begin``, or beyond it for a ranged read of
    uncompressed content); it runs in a worker thread together with the decompression. Raises
    StoreError unless the content ends exactly at ``fragment.end``.

    With ``bounded``, compressed content is fed to the decompressor in pieces sized so that
    each item is about ``bounded`` bytes (highly compressible content would otherwise turn one
    read into megabytes): the piece starts at ``MIN_FEED`` bytes, halves (by the observed
    ratio) after an item over ``bounded`` and doubles after one under half of it (up to
    ``bounded``). This bounds items of content whose compression ratio is steady; content
    crafted to turn abruptly from incompressible to highly compressible can still make one item
    the feed's size times the new ratio (deflate: at most 1032:1). A decompressor taking an
    output limit (zstd, whose 4-byte blocks expand to 128 KiB) is given ``bounded`` instead:
    each item is at most ``bounded`` plus one zstd block, the rest of the input stays queued.
    """
    decompressor = new_decompressor(fragment.codec)
    limited = decompressor if bounded and isinstance(decompressor, LimitedDecompressor) else None
    pending = memoryview(b"")
    feed = MIN_FEED if bounded and fragment.codec != NONE else 0

    def step() -> bytes | None:
        nonlocal pending, feed
        if limited is not None:
            out = limited.decompress_limited(b"", bounded)  # what is queued first
            while not out:
                raw = read_raw()
                if not raw:
                    return None
                out = limited.decompress_limited(raw, bounded)
            return out
        if not feed:
            raw = read_raw()
            return decompressor.decompress(raw) if raw else None
        if not pending:
            raw = read_raw()
            if not raw:
                return None
            pending = memoryview(raw)
        piece, pending = pending[:feed], pending[feed:]
        out = decompressor.decompress(piece)
        if len(out) > bounded:
            feed = max(MIN_FEED // 4, feed * bounded // len(out))
        elif len(out) < bounded // 2:
            feed = min(feed * 2, bounded)
        return out

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
        out = data if start >= begin else data[begin - start :]
        # Held by the consumer alone while it waits (e.g. on a reader that does not read):
        # a suspended generator keeping its last chunk too would double what a stream holds.
        del data
        yield out
        del out
    if pos != fragment.end:
        raise StoreError(
            f"stored fragment {fragment.content_path()} holds "
            f"{'more than ' if pos > fragment.end else ''}{pos - fragment.begin} bytes, "
            f"expected {fragment.content_length}"
        )


def open_offset(fragment: Fragment, offset: int | None) -> int:
    """The journal offset an ``open`` starts at (default: the fragment's begin), checked to
    lie within the fragment."""
    begin = fragment.begin if offset is None else offset
    if not fragment.begin <= begin <= fragment.end:
        raise StoreError(f"offset {begin} is outside of fragment {fragment}")
    return begin


def persisted(f: Fragment, url: str, mtime: float) -> Fragment:
    """``f`` as stored in ``url`` at ``mtime``."""
    return Fragment(f.journal, f.begin, f.end, f.sum, f.codec, url, int(mtime), f.path_postfix)

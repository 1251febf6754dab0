"""KeySpace: a decoded, in-memory mirror of one etcd key prefix, kept current by a watch.

Brokers and consumers read their journals, shards, members and assignments from a KeySpace
rooted at their etcd prefix. This module is generic: the key layout they share is
``gazette.allocator.keys``, and each decodes its values beside its own code
(``gazette.broker.keys``, ``gazette.consumer.keys``).

Invariants of a KeySpace:

* `key_values` is sorted by key and holds exactly the keys under `{root}/` whose values the
  decoder accepted, as of `revision`. The entries live in a snapshot of sorted chunks that is
  never mutated: an update builds a new snapshot sharing every chunk it did not touch, so a
  change costs O(changes * chunk + n / chunk), not O(n), and what `range` / `prefixed` returned
  to a reader (a list of its own) stays a consistent view.
* `revision` is the load revision, or else the greatest ModRevision applied since: it moves only
  when the mirrored keys change, so two mirrors of one root hold the same keys and values if and
  only if their revisions are equal (watch progress notifications advance where a re-established
  watch resumes, but not `revision`).
* Updates are applied in revision order, all events of one etcd revision (one transaction) at
  once; watch responses arriving within `apply_delay` of each other are applied as one batch.
  After each applied batch, the `observers` run synchronously, in registration order, before any
  waiter of `wait_for_revision` / `update_signal` wakes. While they run, `changed` holds the
  keys the batch touched (put or deleted), or None after a load (everything may have changed):
  an observer can then work in proportion to the change, not to the keyspace.
* A value that fails to decode is logged and not applied: a new key stays absent, an existing
  key keeps its last good value. A later, valid write repairs it. The mirror never crashes on
  bad data.
* `watch()` survives etcd restarts and unavailability (retry with capped backoff, resuming
  after the last revision seen) and compaction of the history it needs (it re-loads the whole
  prefix at a current revision, then continues).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import aetcd
import grpc

from gazette.etcd.errors import EtcdError
from gazette.protocol import protocol_pb2 as pb
from gazette.tasks import cancel_and_wait

__all__ = [
    "KeySpaceError",
    "KeyLayoutError",
    "DecodeError",
    "KeyValue",
    "EtcdHeader",
    "KeySpace",
    "Decoder",
    "Observer",
    "prefix_end",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Errors


class KeySpaceError(EtcdError):
    """Base of keyspace errors; raised as-is when a mirror cannot stay consistent with etcd."""


class KeyLayoutError(KeySpaceError, ValueError):
    """A key or key component does not follow Gazette's key layout."""


class DecodeError(KeySpaceError, ValueError):
    """A value does not decode into what its key says it is (logged and skipped by a KeySpace)."""


# ----------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One mirrored etcd key: its decoded value, raw bytes and etcd metadata."""

    key: str
    value: Any
    raw: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class EtcdHeader:
    """The etcd response header of a mirror (as carried in Gazette's protocol Header.Etcd)."""

    cluster_id: int = 0
    member_id: int = 0
    revision: int = 0
    raft_term: int = 0

    def to_proto(self) -> pb.Header.Etcd:
        return pb.Header.Etcd(
            cluster_id=self.cluster_id,
            member_id=self.member_id,
            revision=self.revision,
            raft_term=self.raft_term,
        )


Decoder = Callable[[str, bytes], Any]
"""Decodes (key, raw value) into a value; any exception means "cannot decode"."""

Observer = Callable[[], None]
"""Called with no arguments after each applied update."""


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string having `prefix`, or None if unbounded."""
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < 0x10FFFF:
            chars[-1] = chr(last + 1)
            return "".join(chars)
        chars.pop()
    return None


def _bytes_prefix_end(prefix: bytes) -> bytes:
    # etcd's convention: increment the last byte below 0xff, dropping any 0xff tail;
    # b"\0" means "to the end of the keyspace".
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\0"
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


# ----------------------------------------------------------------------------------------------
# The mirror

# gRPC status codes after which a watch or load is retried: etcd down, restarting, or without a
# leader (etcd answers UNAVAILABLE "no leader" under the require-leader watch option).
_RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
    }
)
_REQUIRE_LEADER = ("hasleader", "true")


class _WatchCompacted(Exception):
    def __init__(self, compact_revision: int) -> None:
        super().__init__(
            f"watched revision was compacted (etcd compact revision {compact_revision})"
        )
        self.compact_revision = compact_revision


class _StreamEnded(Exception):
    pass


def _is_compaction(err: grpc.aio.AioRpcError) -> bool:
    return err.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (err.details() or "")


def _backoff(attempt: int) -> float:
    return float(min(0.05 * (2**attempt), 2.0))


_CHUNK = 256  # entries per chunk of a snapshot: a change copies one chunk and the chunk index


class _Snapshot:
    """An immutable sorted sequence of KeyValues in chunks of about `_CHUNK` entries.

    `updated` returns a new snapshot that shares every chunk its changes did not touch; the
    chunks' lists are never mutated once built (only copies are)."""

    __slots__ = ("chunks", "firsts", "size")

    def __init__(self, chunks: list[tuple[list[str], list[KeyValue]]], firsts: list[str], size: int) -> None:
        self.chunks, self.firsts, self.size = chunks, firsts, size  # no chunk is empty

    @classmethod
    def of(cls, kvs: list[KeyValue]) -> _Snapshot:
        keys = [kv.key for kv in kvs]
        chunks = [(keys[i:i + _CHUNK], kvs[i:i + _CHUNK]) for i in range(0, len(kvs), _CHUNK)]
        return cls(chunks, [c[0][0] for c in chunks], len(kvs))

    def _chunk_of(self, key: str) -> int:
        return max(0, bisect.bisect_right(self.firsts, key) - 1)

    def index(self, key: str) -> tuple[int, bool]:
        if not self.chunks:
            return 0, False
        ci = self._chunk_of(key)
        keys = self.chunks[ci][0]
        i = bisect.bisect_left(keys, key)
        return sum(len(c[0]) for c in self.chunks[:ci]) + i, i < len(keys) and keys[i] == key

    def search(self, key: str) -> KeyValue | None:
        if not self.chunks:
            return None
        keys, kvs = self.chunks[self._chunk_of(key)]
        i = bisect.bisect_left(keys, key)
        return kvs[i] if i < len(keys) and keys[i] == key else None

    def range(self, start: str, end: str | None) -> list[KeyValue]:
        out: list[KeyValue] = []
        ci = self._chunk_of(start) if self.chunks else 0
        lo = -1
        while ci < len(self.chunks):
            keys, kvs = self.chunks[ci]
            if lo < 0:
                lo = bisect.bisect_left(keys, start)
            hi = len(keys) if end is None else bisect.bisect_left(keys, end, lo)
            out += kvs[lo:hi]
            if hi < len(keys):
                break
            ci, lo = ci + 1, 0
        return out

    def all(self) -> list[KeyValue]:
        out: list[KeyValue] = []
        for _, kvs in self.chunks:
            out += kvs
        return out

    def updated(self, groups: list[tuple[str, list[Any]]],
                step: Callable[[KeyValue | None, str, list[Any]], KeyValue | None]) -> _Snapshot:
        """A snapshot with `step(entry or None, key, events)` applied to each group's key
        (groups sorted by key); `step` returns the key's new entry, or None to remove it."""
        chunks = self.chunks or [([], [])]
        by_chunk: dict[int, list[tuple[str, list[Any]]]] = {}
        for group in groups:
            by_chunk.setdefault(max(0, bisect.bisect_right(self.firsts, group[0]) - 1), []).append(group)
        # Splice the rebuilt chunks in, chunk index and all, with C-level slices: the Python
        # work is proportional to the chunks touched, not to the chunk count.
        out_chunks: list[tuple[list[str], list[KeyValue]]] = []
        out_firsts: list[str] = []
        size, done = self.size, 0
        for ci in sorted(by_chunk):
            keys, kvs = list(chunks[ci][0]), list(chunks[ci][1])
            size -= len(keys)
            for key, events in by_chunk[ci]:
                i = bisect.bisect_left(keys, key)
                found = i < len(keys) and keys[i] == key
                entry = step(kvs[i] if found else None, key, events)
                if entry is None:
                    if found:
                        del keys[i], kvs[i]
                elif found:
                    kvs[i] = entry
                else:
                    keys.insert(i, key)
                    kvs.insert(i, entry)
            size += len(keys)
            out_chunks += chunks[done:ci]
            out_firsts += self.firsts[done:ci]
            step_ = _CHUNK if len(keys) > 2 * _CHUNK else max(1, len(keys))
            for j in range(0, len(keys), step_):
                out_chunks.append((keys[j:j + step_], kvs[j:j + step_]))
                out_firsts.append(keys[j])
            done = ci + 1
        if self.chunks:
            out_chunks += chunks[done:]
            out_firsts += self.firsts[done:]
        return _Snapshot(out_chunks, out_firsts, size)


class KeySpace:
    """A decoded mirror of the etcd keys under `{root}/`.

    `root` must be a clean path (no trailing slash, no empty or dot segments), e.g.
    "/gazette/cluster". `decode(key, raw)` turns a value into what `KeyValue.value` holds.
    """

    def __init__(
        self,
        root: str,
        decode: Decoder,
        *,
        apply_delay: float = 0.03,
        page_size: int = 1000,
    ) -> None:
        if not root or root in ("/", ".") or posixpath.normpath(root) != root:
            raise KeyLayoutError(f"keyspace root {root!r} must be a clean path other than '/'")
        self.root = root
        self.observers: list[Observer] = []
        self._decode = decode
        self._apply_delay = apply_delay
        self._page_size = page_size
        self._prefix = root + "/"
        self._prefix_bytes = self._prefix.encode()
        self._range_end = _bytes_prefix_end(self._prefix_bytes)
        self._snap = _Snapshot([], [], 0)
        self._changed: frozenset[str] | None = None
        self._header = EtcdHeader()
        self._resume_revision = 1
        self._updated = asyncio.Event()
        self._watch_established = False

    # -- reading ----------------------------------------------------------------------------

    @property
    def key_values(self) -> list[KeyValue]:
        """All mirrored entries, sorted by key (a list of the caller's own: O(n))."""
        return self._snap.all()

    @property
    def changed(self) -> frozenset[str] | None:
        """The keys the last applied batch put or deleted; None after a load (see the module
        docstring). Meant for observers, while they run."""
        return self._changed

    @property
    def header(self) -> EtcdHeader:
        return self._header

    @property
    def revision(self) -> int:
        return self._header.revision

    def __len__(self) -> int:
        return self._snap.size

    def index(self, key: str) -> tuple[int, bool]:
        """The position of `key` in `key_values` (or where it would go) and whether it is there."""
        return self._snap.index(key)

    def search(self, key: str) -> KeyValue | None:
        return self._snap.search(key)

    def range(self, start: str, end: str | None) -> Sequence[KeyValue]:
        """Entries with keys in [start, end); end None means "to the last key"."""
        return self._snap.range(start, end)

    def prefixed(self, prefix: str) -> Sequence[KeyValue]:
        """Entries whose keys start with `prefix`, in key order."""
        return self.range(prefix, prefix_end(prefix))

    # -- waiting ----------------------------------------------------------------------------

    def update_signal(self) -> asyncio.Event:
        """An event set at the next update. Take it before inspecting state, then wait on it,
        so that an update landing in between is not missed."""
        return self._updated

    # A `timeout` argument (rather than only asyncio.timeout at the call site) is part of the
    # interface other components were promised; it is applied with asyncio.timeout.
    async def wait_for_update(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Waits for the next applied update; raises TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            await self._updated.wait()

    async def wait_for_revision(
        self, revision: int, timeout: float | None = None  # noqa: ASYNC109
    ) -> None:
        """Waits until `self.revision >= revision`; raises TimeoutError after `timeout` seconds.

        `revision` only advances on changes under the root, so wait for revisions produced by
        writes under it (e.g. the header revision of one's own transaction there).
        """
        async with asyncio.timeout(timeout):
            while self._header.revision < revision:
                await self._updated.wait()

    # -- loading ----------------------------------------------------------------------------

    async def load(self, client: aetcd.Client, revision: int = 0) -> None:
        """Replaces the mirror with the keys under the root at `revision` (0: the current one).

        Ranges are paged; every page is read at the one revision of the first, so the result
        is a consistent snapshot. Raises grpc.aio.AioRpcError from etcd (OUT_OF_RANGE if
        `revision` is compacted).
        """
        await client.connect()
        kvstub = client.kvstub
        start = self._prefix_bytes
        kvs: list[KeyValue] = []
        first: Any = None
        while True:
            request = aetcd.rpc.RangeRequest(
                key=start, range_end=self._range_end, revision=revision, limit=self._page_size
            )
            response = await kvstub.Range(request, metadata=client.metadata)
            if first is None:
                first = response.header
                self._check_cluster(first.cluster_id)
                if revision == 0:
                    revision = first.revision
            for raw in response.kvs:
                entry = self._decode_kv(raw, "load")
                if entry is not None:
                    kvs.append(entry)
            if not response.more or not response.kvs:
                break
            start = response.kvs[-1].key + b"\0"

        # The header records the revision the snapshot is *of*, not etcd's revision at the
        # time it answered (which may be later): that is the mirror's effective revision.
        self._install(
            _Snapshot.of(kvs),
            EtcdHeader(first.cluster_id, first.member_id, revision, first.raft_term),
            None,
        )
        self._resume_revision = revision + 1

    # -- watching ---------------------------------------------------------------------------

    async def watch(self, client: aetcd.Client) -> NoReturn:
        """Keeps the mirror current until cancelled; loads first if never loaded.

        Transient etcd failures are retried forever with capped backoff. Raises KeySpaceError
        on inconsistencies that retrying cannot fix (another etcd cluster, out-of-order
        revisions), grpc.aio.AioRpcError on non-transient etcd errors, and whatever an observer
        raises.
        """
        attempt = 0
        need_load = self._header.revision == 0
        while True:
            self._watch_established = False
            try:
                if need_load:
                    await self.load(client)
                    need_load = False
                await self._watch_stream(client)
            except _WatchCompacted as err:
                log.warning(
                    "keyspace %s fell behind etcd compaction (resume revision %d): %s; "
                    "re-loading",
                    self.root, self._resume_revision, err,
                )
                need_load = True
                attempt = 0
                continue
            except _StreamEnded as err:
                log.warning("keyspace %s watch ended (%s); re-establishing", self.root, err)
            except grpc.aio.AioRpcError as err:
                if need_load and _is_compaction(err):
                    continue  # the load's own revision was compacted away meanwhile: load anew
                if err.code() not in _RETRY_CODES:
                    raise
                log.warning(
                    "keyspace %s: etcd unavailable (%s: %s); retrying (attempt %d)",
                    self.root, err.code().name, err.details(), attempt,
                )
            except aetcd.exceptions.ClientError as err:
                log.warning("keyspace %s: etcd client error (%s); retrying", self.root, err)
            if self._watch_established:
                attempt = 0
            # Backoff between attempts bounds the retry rate while etcd is away.
            await asyncio.sleep(_backoff(attempt))
            attempt += 1

    async def _watch_stream(self, client: aetcd.Client) -> NoReturn:
        await client.connect()
        stub = aetcd.rpc.WatchStub(client.channel)
        metadata = tuple(client.metadata or ()) + (_REQUIRE_LEADER,)
        call = stub.Watch(metadata=metadata)
        # Progress notifications keep the resume revision recent on a quiet prefix, so that a
        # re-established watch is not refused for a revision compacted since the last change.
        create = aetcd.rpc.WatchCreateRequest(
            key=self._prefix_bytes,
            range_end=self._range_end,
            start_revision=self._resume_revision,
            progress_notify=True,
        )
        queue: asyncio.Queue[Any] = asyncio.Queue()
        # The reader only receives; this task alone applies, in arrival order, so everything
        # the reader queued before a failure is applied before that failure is raised.
        reader = asyncio.create_task(self._read_stream(call, create, queue))
        try:
            while True:
                batch = [await queue.get()]
                if self._apply_delay > 0 and not isinstance(batch[0], BaseException):
                    # Nagle-like: let closely following responses join this batch, so that
                    # observers run once for a burst of revisions.
                    await asyncio.sleep(self._apply_delay)
                while not queue.empty():
                    batch.append(queue.get_nowait())
                responses: list[Any] = []
                for item in batch:
                    if isinstance(item, BaseException):
                        self._apply_responses(responses)
                        raise item
                    responses.append(item)
                self._apply_responses(responses)
        finally:
            call.cancel()
            await cancel_and_wait(reader)

    async def _read_stream(
        self, call: Any, create: Any, queue: asyncio.Queue[Any]
    ) -> None:
        try:
            await call.write(aetcd.rpc.WatchRequest(create_request=create))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise _StreamEnded("etcd closed the watch stream")
                if response.compact_revision:
                    raise _WatchCompacted(response.compact_revision)
                if response.canceled:
                    raise _StreamEnded(f"etcd cancelled the watch: {response.cancel_reason!r}")
                if response.created:
                    self._watch_established = True
                    continue
                queue.put_nowait(response)
        except Exception as err:  # handed to the applying task, which raises it in order
            queue.put_nowait(err)

    # -- applying ---------------------------------------------------------------------------

    def apply(self, responses: Iterable[Any]) -> None:
        """Applies etcd WatchResponses (with events and/or progress notifications) in order.

        Used by `watch()`; public so tests can drive a mirror without etcd.
        """
        self._apply_responses(list(responses))

    def _apply_responses(self, responses: list[Any]) -> None:
        events: list[Any] = []
        header = self._header
        for response in responses:
            self._check_cluster(response.header.cluster_id)
            if not response.events:
                # A progress notification: etcd has nothing under the root up to its revision.
                self._resume_revision = max(self._resume_revision, response.header.revision + 1)
                continue
            first_rev = response.events[0].kv.mod_revision
            last_rev = response.events[-1].kv.mod_revision
            if first_rev <= header.revision or last_rev < first_rev:
                raise KeySpaceError(
                    f"keyspace {self.root}: watch response revisions [{first_rev}, {last_rev}] "
                    f"do not follow mirror revision {header.revision}"
                )
            header = EtcdHeader(
                response.header.cluster_id or header.cluster_id,
                response.header.member_id,
                last_rev,
                response.header.raft_term,
            )
            self._resume_revision = max(self._resume_revision, last_rev + 1)
            events.extend(response.events)
        if not events:
            return

        # Stable sort on key keeps each key's events in revision order.
        events.sort(key=lambda ev: ev.kv.key)
        groups: list[tuple[str, list[Any]]] = []
        i, n = 0, len(events)
        while i < n:
            raw_key = events[i].kv.key
            j = i + 1
            while j < n and events[j].kv.key == raw_key:
                j += 1
            try:
                groups.append((raw_key.decode(), events[i:j]))
            except UnicodeDecodeError:
                log.error("keyspace %s: skipping non-UTF-8 key %r", self.root, raw_key)
            i = j
        self._install(self._snap.updated(groups, self._apply_events), header,
                      frozenset(key for key, _ in groups))

    def _apply_events(self, entry: KeyValue | None, key: str, events: list[Any]) -> KeyValue | None:
        for event in events:
            entry = self._apply_event(entry, key, event)
        return entry

    def _apply_event(self, entry: KeyValue | None, key: str, event: Any) -> KeyValue | None:
        kv = event.kv
        is_delete = event.type == aetcd.rpc.Event.DELETE
        if entry is None:
            if is_delete:
                # A key whose value never decoded is now deleted: nothing to remove.
                log.debug("keyspace %s: deletion of unmirrored key %s", self.root, key)
                return None
            created = self._decode_kv(kv, "watch", key)
            if created is not None and kv.create_revision != kv.mod_revision:
                # An update of a key we never held, e.g. a bad value later corrected.
                log.info("keyspace %s: %s appears by modification; applied", self.root, key)
            return created
        if entry.mod_revision >= kv.mod_revision:
            log.error(
                "keyspace %s: ignoring replayed event for %s (revision %d, mirror has %d)",
                self.root, key, kv.mod_revision, entry.mod_revision,
            )
            return entry
        if is_delete:
            return None
        updated = self._decode_kv(kv, "watch", key)
        if updated is None:
            return entry  # keep the last good value until a decodable one arrives
        if entry.create_revision != kv.create_revision:
            log.warning(
                "keyspace %s: %s was re-created without an observed deletion; applied",
                self.root, key,
            )
        return updated

    def _decode_kv(self, kv: Any, context: str, key: str | None = None) -> KeyValue | None:
        try:
            if key is None:
                key = kv.key.decode()
            assert key is not None
            value = self._decode(key, kv.value)
        except Exception as err:  # decoders may raise anything; bad data must not stop us
            log.error(
                "keyspace %s: value of %r (revision %d) failed to decode during %s; "
                "skipped: %s",
                self.root, key if key is not None else kv.key, kv.mod_revision, context, err,
            )
            return None
        return KeyValue(
            key=key,
            value=value,
            raw=kv.value,
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease,
        )

    def _check_cluster(self, cluster_id: int) -> None:
        if self._header.cluster_id and cluster_id and cluster_id != self._header.cluster_id:
            raise KeySpaceError(
                f"keyspace {self.root}: etcd cluster ID changed from "
                f"{self._header.cluster_id} to {cluster_id}"
            )

    def _install(self, snap: _Snapshot, header: EtcdHeader, changed: frozenset[str] | None) -> None:
        self._snap = snap
        self._header = header
        self._changed = changed
        try:
            for observer in self.observers:
                observer()
        finally:
            self._changed = None
        signal, self._updated = self._updated, asyncio.Event()
        signal.set()

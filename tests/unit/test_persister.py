"""Persister: immediate and delayed persistence, retries, finish() draining, store fallback."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gazette.broker.index import Index
from gazette.broker.persister import Persister, eval_path_postfix
from gazette.broker.spool import Spool, SpoolSnapshot
from gazette.fragment import Fragment, StoreAuthError, StoreError, TemplateError
from gazette.fragment.stores import FileStore, FragmentStore, Stores
from gazette.protocol import protocol_pb2 as pb

CC = pb.CompressionCodec


def snapshot(
    journal: str, begin: int, data: bytes, primary: bool = True, at: float = 1_700_000_000.0
) -> SpoolSnapshot:
    done: list[SpoolSnapshot] = []
    spool = Spool(journal, on_complete=done.append, clock=lambda: at)
    spool.must_apply(
        pb.ReplicateRequest(proposal=Fragment(journal, begin, begin, codec=CC.GZIP).to_proto())
    )
    spool.apply(pb.ReplicateRequest(content=data))
    spool.must_apply(pb.ReplicateRequest(proposal=spool.next()))
    end = begin + len(data)
    spool.must_apply(
        pb.ReplicateRequest(proposal=Fragment(journal, end, end, codec=CC.GZIP).to_proto()),
        primary=primary,
    )
    return done[0]


def spec(name: str, *stores: str, template: str = "") -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        fragment=pb.JournalSpec.Fragment(stores=list(stores), path_postfix_template=template),
    )


class FlakyStore:
    """Fails the first ``failures`` persists with ``error``, then delegates."""

    def __init__(self, inner: FileStore, failures: int, error: Exception) -> None:
        self.inner, self.failures, self.error = inner, failures, error
        self.attempts = 0
        self.attempted: asyncio.Queue[int] = asyncio.Queue()

    @property
    def url(self) -> str:
        return self.inner.url

    async def persist(self, snapshot: SpoolSnapshot, path_postfix: str = "") -> Fragment:
        self.attempts += 1
        self.attempted.put_nowait(self.attempts)
        if self.attempts <= self.failures:
            raise self.error
        return await self.inner.persist(snapshot, path_postfix)

    async def list(self, journal: str) -> list[Fragment]:
        return await self.inner.list(journal)

    async def exists(self, fragment: Fragment) -> bool:
        return await self.inner.exists(fragment)

    def open(self, fragment: Fragment, offset: int | None = None) -> AsyncGenerator[bytes, None]:
        return self.inner.open(fragment, offset)

    async def remove(self, fragment: Fragment) -> None:
        await self.inner.remove(fragment)

    def sign_url(self, fragment: Fragment, ttl: float) -> str | None:
        return self.inner.sign_url(fragment, ttl)

    async def health_check(self) -> None:
        await self.inner.health_check()


class FixedStores(Stores):
    def __init__(self, stores: dict[str, FragmentStore]) -> None:
        super().__init__(None)
        self.fixed = stores

    def get(self, url: str) -> FragmentStore:
        return self.fixed[url]


async def test_primary_spool_is_persisted_and_indexed(tmp_path: Path) -> None:
    stores = Stores(str(tmp_path))
    index = Index()
    persisted: list[Fragment] = []

    def on_persisted(f: Fragment) -> None:
        persisted.append(f)
        index.add_remote(f)

    p = Persister(stores, lambda j: spec(j, "file:///"), on_persisted=on_persisted)
    snap = snapshot("a/journal", 0, b"some content")
    index.spool_commit(snap.fragment)
    p.spool_complete(snap)
    p.spool_complete(snap)  # The same spool again: found already stored, a no-op.

    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(p.run())
        await asyncio.wait_for(p.persist_all_and_wait(), 10)
        assert p.pending == 0 and p.persisted == 2
        await asyncio.wait_for(p.finish(), 10)
    assert runner.done()

    assert len(persisted) == 2 and persisted[0] == persisted[1]
    f = persisted[0]
    assert f.backing_store == "file:///" and f.sum == hashlib.sha1(b"some content").digest()
    assert (tmp_path / f.content_path()).is_file()
    resp, file = await index.query(pb.ReadRequest(offset=3))
    assert file is None and resp.fragment.backing_store == "file:///"


async def test_replica_spool_waits_then_flushes(tmp_path: Path) -> None:
    clock = [0.0]
    p = Persister(
        Stores(str(tmp_path)), lambda j: spec(j, "file:///"), replica_delay=120.0,
        clock=lambda: clock[0],
    )  # fmt: skip
    p.spool_complete(snapshot("a/journal", 0, b"replica", primary=False))

    async with asyncio.TaskGroup() as tg:
        tg.create_task(p.run())
        for _ in range(5):
            await asyncio.sleep(0)  # Checkpoints: the loop has every chance to (wrongly) persist.
        assert p.pending == 1 and p.persisted == 0
        await asyncio.wait_for(p.persist_all_and_wait(), 10)  # Flushing ignores the delay.
        assert p.pending == 0 and p.persisted == 1
        await p.finish()
    assert len(list((tmp_path / "a/journal").iterdir())) == 1


async def test_failures_are_retried_with_backoff(tmp_path: Path) -> None:
    flaky = FlakyStore(FileStore("file:///", str(tmp_path)), 3, StoreError("temporarily down"))
    p = Persister(
        FixedStores({"file:///": flaky}), lambda j: spec(j, "file:///"), backoff=(0.001, 0.004)
    )
    p.spool_complete(snapshot("a/journal", 0, b"never lost"))
    await asyncio.wait_for(p.persist_all_and_wait(), 10)  # Runs the queue inline.
    assert flaky.attempts == 4 and p.failures == 3 and p.persisted == 1
    assert [f.end for f in await flaky.list("a/journal")] == [10]


async def test_finish_drains_and_falls_back_on_auth_errors(tmp_path: Path) -> None:
    (tmp_path / "second").mkdir()
    denied = FlakyStore(FileStore("file:///", str(tmp_path)), 1000, StoreAuthError("denied"))
    second = FileStore("file:///second/", str(tmp_path))
    p = Persister(
        FixedStores({"file:///": denied, "file:///second/": second}),
        lambda j: spec(j, "file:///", "file:///second/"),
        replica_delay=3600.0,
        backoff=(0.001, 0.002),
    )
    async with asyncio.TaskGroup() as tg:
        tg.create_task(p.run())
        p.spool_complete(snapshot("a/journal", 0, b"primary"))
        p.spool_complete(snapshot("a/journal", 7, b"replica", primary=False))
        # While serving, auth errors are retried against the first store only.
        async with asyncio.timeout(10):
            while await denied.attempted.get() < 2:
                pass
        assert await second.list("a/journal") == []
        await asyncio.wait_for(p.finish(), 10)
    assert [(f.begin, f.end) for f in await second.list("a/journal")] == [(0, 7), (7, 14)]


async def test_removed_journals_and_storeless_journals_are_dropped(tmp_path: Path) -> None:
    specs = {"kept/journal": spec("kept/journal")}
    persisted: list[Fragment] = []
    p = Persister(Stores(str(tmp_path)), specs.get, on_persisted=persisted.append)
    p.spool_complete(snapshot("gone/journal", 0, b"x"))
    p.spool_complete(snapshot("kept/journal", 0, b"y"))
    await asyncio.wait_for(p.finish(), 10)
    assert p.pending == 0 and persisted == []


def test_path_postfix_template() -> None:
    at = datetime(2024, 3, 5, 7, 9, 11, tzinfo=UTC).timestamp()
    snap = snapshot("a/journal", 0, b"x", at=at)
    s = spec(
        "a/journal",
        template='date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/hour='
        '{{.Spool.FirstAppendTime.Format "15"}}',
    )
    assert eval_path_postfix(snap, s) == "date=2024-03-05/hour=07"
    assert eval_path_postfix(snap, spec("a/journal")) == ""
    with pytest.raises(TemplateError, match="unsupported"):
        eval_path_postfix(snap, spec("a/journal", template="{{ .Spool.Registers }}"))

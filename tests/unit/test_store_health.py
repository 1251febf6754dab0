"""StoreHealth: cached per-store health, Gazette's retry schedule, append gating, sweeping."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from gazette import auth
from gazette.broker import store_health as health_mod
from gazette.broker.service import JournalService
from gazette.broker.store_health import (
    FIRST_CHECK_PENDING,
    LAST_CHECK,
    RETRY_INTERVALS,
    RETRY_INTERVALS_ENV,
    StoreChecksExhausted,
    StoreHealth,
    check_delete,
    default_retry_intervals,
)
from gazette.fragment.errors import StoreError
from gazette.fragment.stores import FragmentStore, Stores
from gazette.protocol import protocol_pb2 as pb

URL = "fake://store/"


class FakeStore:
    """A store whose health checks follow a script of outcomes (True: pass)."""

    def __init__(self, outcomes: list[bool] | None = None, default: bool = True) -> None:
        self.outcomes = list(outcomes or [])
        self.default = default
        self.calls = 0
        self.block = asyncio.Event()
        self.block.set()
        self.changed = asyncio.Event()

    async def health_check(self) -> None:
        self.calls += 1
        self.changed.set()
        await self.block.wait()
        ok = self.outcomes.pop(0) if self.outcomes else self.default
        if not ok:
            raise StoreError(f"check {self.calls} failed")


class FakeStores(Stores):
    def __init__(self, stores: dict[str, object], file_root: str | None = None) -> None:
        super().__init__(file_root)
        self.fakes = stores

    def get(self, url: str) -> FragmentStore:
        fake = self.fakes.get(url)
        if fake is not None:
            return fake  # type: ignore[return-value]
        return super().get(url)


def spec(*stores: str) -> pb.JournalSpec:
    s = pb.JournalSpec(name="a/journal")
    s.fragment.stores.extend(stores)
    return s


@contextlib.asynccontextmanager
async def running(health: StoreHealth) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(health.run())
    await asyncio.wait_for(health.started.wait(), 10)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def monitor(stores: Stores, **kw: object) -> StoreHealth:
    kw.setdefault("rand", lambda: 0.5)  # No jitter.
    kw.setdefault("retry_intervals", (0.0,))
    return StoreHealth(stores, **kw)  # type: ignore[arg-type]


async def test_first_check_pending_then_cached() -> None:
    fake = FakeStore()
    health = monitor(FakeStores({URL: fake}))
    assert health.status(URL) == (False, FIRST_CHECK_PENDING)
    assert health.append_status(spec(URL)) == pb.FRAGMENT_STORE_UNHEALTHY
    assert health.append_status(spec()) == pb.OK  # No stores: nothing to gate on.
    async with running(health):
        assert await health.await_status(URL) == (True, "")
        assert health.status(URL) == (True, "")
        assert health.append_status(spec(URL, "fake://other/")) == pb.OK
        assert health.append_error(spec(URL)) == ""
        calls = fake.calls
        # Cached: asking again runs no check (the next is ok_interval away).
        for _ in range(10):
            health.status(URL)
        assert await health.await_status(URL) == (True, "")
        assert fake.calls == calls


async def test_failures_retry_on_schedule_then_recover() -> None:
    fake = FakeStore([False, False, False], default=True)
    health = monitor(FakeStores({URL: fake}), retry_intervals=(0.0, 0.01))
    async with running(health):
        assert await health.await_status(URL) == (False, "check 1 failed")
        if not health.status(URL)[0]:  # (The retries may have run on already.)
            assert health.append_status(spec(URL)) == pb.FRAGMENT_STORE_UNHEALTHY
            assert re.fullmatch(rf"fragment store {URL} unhealthy: check \d failed",
                                health.append_error(spec(URL)))
        # The retries run by themselves until one passes.
        assert await health.await_append_status(spec(URL)) == (pb.OK, "")
        assert fake.calls == 4
        assert health.status(URL) == (True, "")
        assert health.healthy_for_append(spec(URL))  # the append's no-wait check agrees


async def test_healthy_for_append_only_once_a_check_passed() -> None:
    fake = FakeStore([False], default=True)
    health = monitor(FakeStores({URL: fake}), retry_intervals=(0.0, 0.01))
    assert not health.healthy_for_append(spec(URL))  # never checked: the append must wait
    assert health.healthy_for_append(pb.JournalSpec(name="no/stores"))  # nothing to check
    async with running(health):
        assert await health.await_status(URL) == (False, "check 1 failed")
        assert not health.healthy_for_append(spec(URL)) or health.status(URL)[0]
        assert await health.await_append_status(spec(URL)) == (pb.OK, "")
        assert health.healthy_for_append(spec(URL))


def test_interval_schedule_and_jitter() -> None:
    for r, factor in [(0.5, 1.0), (0.0, 0.8), (1.0, 1.2)]:
        health = StoreHealth(FakeStores({}), ok_interval=1800, retry_intervals=RETRY_INTERVALS,
                             rand=lambda r=r: r)  # type: ignore[misc]
        e = health._entry(URL)
        e.ok = True
        assert health._interval(e) == pytest.approx(1800 * factor)
        e.ok = False
        got = []
        for failures in range(1, 10):
            e.failures = failures
            got.append(health._interval(e))
        assert got == pytest.approx([x * factor for x in (0, 0.1, 1, 1, 10, 10, 100, 100, 100)])


async def test_append_refused_after_gazettes_retries() -> None:
    fake = FakeStore(default=False)
    health = monitor(FakeStores({URL: fake}), append_retries=5)
    async with running(health):
        status, error = await health.await_append_status(spec(URL))
        assert status == pb.FRAGMENT_STORE_UNHEALTHY
        assert error.startswith(f"fragment store {URL} unhealthy: check ")
        # The first check, then append_retries + 2 more awaited by the append.
        assert fake.calls >= 7


async def test_check_now_runs_a_fresh_check() -> None:
    fake = FakeStore([True, False])
    health = monitor(FakeStores({URL: fake}))
    async with running(health):
        assert await health.await_status(URL) == (True, "")
        assert fake.calls == 1
        assert await health.check_now(URL) == (False, "check 2 failed")
        assert fake.calls == 2


async def test_check_now_during_a_check_waits_for_the_next_one() -> None:
    fake = FakeStore([True, False])
    fake.block.clear()
    health = monitor(FakeStores({URL: fake}))
    async with running(health):
        health.watch(URL)
        await asyncio.wait_for(fake.changed.wait(), 10)  # The first check is in flight.
        waiter = asyncio.create_task(health.check_now(URL))
        await asyncio.sleep(0)
        fake.block.set()
        assert await asyncio.wait_for(waiter, 10) == (False, "check 2 failed")


async def test_inline_checks_without_run() -> None:
    fake = FakeStore([False, True])
    health = monitor(FakeStores({URL: fake}))
    assert await health.await_status(URL) == (False, "check 1 failed")
    assert await health.await_append_status(spec(URL)) == (pb.OK, "")
    assert fake.calls == 2
    assert await health.check_now(URL) == (True, "")
    assert fake.calls == 3
    # Concurrent waiters share one inline check.
    results = await asyncio.gather(*(health.check_now(URL) for _ in range(5)))
    assert results == [(True, "")] * 5
    assert fake.calls == 4


async def test_check_timeout_and_unbuildable_store() -> None:
    fake = FakeStore()
    fake.block.clear()  # Never completes.
    health = monitor(FakeStores({URL: fake}), timeout=0.05)
    ok, error = await health.await_status(URL)
    assert not ok and "did not complete within 0.05s" in error

    ok, error = await health.await_status("s3://bucket/prefix/?bogus=1")
    assert not ok and "unknown argument 'bogus'" in error
    ok, error = await health.await_status("gopher://x/")
    assert not ok and "unsupported fragment store scheme 'gopher'" in error


async def test_sweep_stops_unused_stores() -> None:
    fake = FakeStore(default=False)
    health = monitor(FakeStores({URL: fake, "fake://used/": FakeStore()}), retry_intervals=(60.0,))
    async with running(health):
        await health.await_status(URL)
        await health.await_status("fake://used/")
        waiter = asyncio.create_task(health.await_append_status(spec(URL)))
        await asyncio.sleep(0)
        assert health.sweep() == 0  # Both were asked about since the last sweep.
        health.status("fake://used/")
        assert health.sweep() == 1
        assert await asyncio.wait_for(waiter, 10) == (
            pb.FRAGMENT_STORE_UNHEALTHY, f"fragment store {URL} unhealthy: {LAST_CHECK}",
        )  # fmt: skip
        assert health.status("fake://used/") == (True, "")
        # A swept store asked about again starts over.
        assert health.status(URL) == (False, FIRST_CHECK_PENDING)


async def test_file_stores_through_the_monitor(tmp_path: Path) -> None:
    stores = Stores(str(tmp_path))
    health = monitor(stores)
    async with running(health):
        assert await health.await_status("file:///") == (True, "")
        ok, error = await health.await_status("file:///missing/")
        assert not ok and "invalid file store directory" in error
        (tmp_path / "missing").mkdir()
        assert await health.check_now("file:///missing/") == (True, "")
    await check_delete(stores, "file:///", "some/prefix/")
    assert not (tmp_path / "some/prefix/.gazette-delete-probe").exists()
    with pytest.raises(StoreError, match="does not support"):
        await check_delete(FakeStores({URL: FakeStore()}), URL)


def test_retry_intervals_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RETRY_INTERVALS_ENV, raising=False)
    assert default_retry_intervals() == RETRY_INTERVALS
    monkeypatch.setenv(RETRY_INTERVALS_ENV, "0, 0.05,1")
    assert default_retry_intervals() == (0.0, 0.05, 1.0)
    assert StoreHealth(Stores()).retry_intervals == (0.0, 0.05, 1.0)
    for bad in ["x", "1,,2", "-1"]:
        monkeypatch.setenv(RETRY_INTERVALS_ENV, bad)
        with pytest.raises(ValueError, match=RETRY_INTERVALS_ENV):
            default_retry_intervals()


# -- The FragmentStoreHealth RPC: validation, who may ask about what, limits, no paths ------


class _Aborted(Exception):
    pass


class _Context:
    """What the handler uses of a grpc.aio context: metadata in, an abort out."""

    def __init__(self, authorization: str | None = None) -> None:
        self.metadata = [("authorization", authorization)] if authorization else []
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(code, details)


KEY = b"a key of the store health tests, 32+ bytes"


def _service(root: Path, named: list[str], *, auth_on: bool = False,
             stores: Stores | None = None, **kw: object) -> tuple[JournalService, StoreHealth]:
    stores = stores or Stores(str(root))
    health = monitor(stores, **kw)
    specs = [spec(*named)]
    keyspace = SimpleNamespace(revision=7, root="/root",
                               prefixed=lambda prefix: [SimpleNamespace(value=s) for s in specs])
    broker = SimpleNamespace(
        keyspace=keyspace, stores=stores, store_health=health,
        resolver=SimpleNamespace(header=lambda: pb.Header()),
        verifier=auth.KeyedAuth(base64.b64encode(KEY).decode()) if auth_on else auth.NO_AUTH)
    return JournalService(broker), health  # type: ignore[arg-type]


async def _ask(svc: JournalService, store: str, token: int | None = None, *, check_delete: bool = False,
               prefix: str = "") -> tuple[str, pb.FragmentStoreHealthResponse | str]:
    """``("OK", response)`` or ``(gRPC code name, details)``."""
    authorization = None
    if token is not None:
        authorization = auth.KeyedAuth(base64.b64encode(KEY).decode()).authorization(auth.Claims(token), 60)
    ctx = _Context(authorization)
    req = pb.FragmentStoreHealthRequest(fragment_store=store, check_delete=check_delete,
                                        check_delete_prefix=prefix)
    try:
        return "OK", await svc.FragmentStoreHealth(req, ctx)
    except _Aborted:
        assert ctx.aborted is not None
        return ctx.aborted[0].name, ctx.aborted[1]


async def test_rpc_refuses_malformed_requests_as_invalid_argument(tmp_path: Path) -> None:
    svc, health = _service(tmp_path, ["file:///"])
    for store, check, prefix in [
        ("foo://bucket/", False, ""),          # unknown scheme (was FRAGMENT_STORE_UNHEALTHY)
        ("file:///no-slash", False, ""),       # path must end in '/'
        ("s3:///path/", False, ""),            # missing bucket
        ("file://host/", False, ""),           # file stores have no host
        ("file:///../", False, ""),            # would leave the file root
        ("file:///a/%2e%2e/", False, ""),
        ("file:///", True, "../"),             # probe prefix escaping the store
        ("file:///", True, "a/../../x/"),
        ("file:///", False, "a/"),             # a prefix without the probe
    ]:
        code, detail = await _ask(svc, store, check_delete=check, prefix=prefix)
        assert code == "INVALID_ARGUMENT", (store, prefix, code, detail)
    assert health._entries == {}  # nothing was checked


async def test_rpc_with_auth_off_checks_only_stores_journals_name(tmp_path: Path) -> None:
    svc, health = _service(tmp_path, ["file:///"])
    code, resp = await _ask(svc, "file:///")
    assert code == "OK" and isinstance(resp, pb.FragmentStoreHealthResponse)
    assert (resp.status, resp.store_health_error) == (pb.OK, "")
    for store in ["file:///elsewhere/", "s3://bucket/p/?endpoint=http://127.0.0.1:9/&region=x"]:
        code, detail = await _ask(svc, store)
        assert code == "FAILED_PRECONDITION" and "no journal names" in str(detail), (store, code, detail)
    assert set(health._entries) == {"file:///"}  # no other store was built or dialled


async def test_rpc_with_auth_on_needs_apply_and_then_checks_any_store_once(tmp_path: Path) -> None:
    svc, health = _service(tmp_path, ["file:///"], auth_on=True)
    assert (await _ask(svc, "file:///"))[0] == "UNAUTHENTICATED"
    code, detail = await _ask(svc, "file:///", auth.READ)
    assert code == "PERMISSION_DENIED" and "APPLY" in str(detail)
    code, resp = await _ask(svc, "file:///", auth.READ | auth.APPLY)
    assert code == "OK" and isinstance(resp, pb.FragmentStoreHealthResponse) and resp.status == pb.OK
    # A store no journal names: checked on demand, not kept checked, its answer cached.
    (tmp_path / "other").mkdir()
    code, resp = await _ask(svc, "file:///other/", auth.APPLY)
    assert code == "OK" and isinstance(resp, pb.FragmentStoreHealthResponse) and resp.status == pb.OK
    assert "file:///other/" not in health._entries
    code, resp = await _ask(svc, "file:///other/", auth.APPLY, check_delete=True, prefix="p/")
    assert code == "OK" and isinstance(resp, pb.FragmentStoreHealthResponse) and resp.status == pb.OK
    assert not (tmp_path / "other/p/.gazette-delete-probe").exists()


async def test_rpc_errors_never_hold_the_file_root(tmp_path: Path) -> None:
    root = tmp_path / "fragment-root"
    root.mkdir()
    (root / "blocked").write_bytes(b"a file where the probe wants a directory")
    svc, _ = _service(root, ["file:///", "file:///missing/"])
    answers = [await _ask(svc, "file:///missing/"),
               await _ask(svc, "file:///", check_delete=True, prefix="blocked/")]
    for code, resp in answers:
        assert code == "OK" and isinstance(resp, pb.FragmentStoreHealthResponse)
        assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY and resp.store_health_error
        assert str(tmp_path) not in resp.store_health_error, resp.store_health_error
    assert "'missing'" in answers[0][1].store_health_error  # type: ignore[union-attr]
    assert "'blocked" in answers[1][1].store_health_error  # type: ignore[union-attr]


async def test_on_demand_checks_are_limited_shared_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = asyncio.Event()
    full = asyncio.Event()
    built: list[str] = []
    running = 0
    most = 0

    class Slow:
        async def health_check(self) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            if running == 2:
                full.set()
            try:
                await gate.wait()
            finally:
                running -= 1

    def build(url: str, root: str | None) -> object:
        built.append(url)
        return Slow()

    monkeypatch.setattr(health_mod, "store_for_url", build)
    now = [100.0]
    health = monitor(Stores(), max_concurrent_checks=2, max_pending_requests=5, clock=lambda: now[0])
    urls = [f"s3://bucket-{i}/" for i in range(4)]
    asks = [asyncio.ensure_future(health.request(u, named=False)) for u in [*urls, urls[0]]]
    await asyncio.wait_for(full.wait(), 10)  # two checks run; the others wait for a slot or share one
    with pytest.raises(StoreChecksExhausted):
        await health.request("s3://one-too-many/", named=False)
    gate.set()
    assert await asyncio.gather(*asks) == [(True, "")] * 5
    assert most == 2 and sorted(built) == sorted(urls)  # bucket-0 checked once for two asks
    assert await health.request(urls[1], named=False) == (True, "")  # cached
    assert len(built) == 4
    now[0] += health.adhoc_ttl + 1
    assert await health.request(urls[1], named=False) == (True, "")  # stale: checked again
    assert len(built) == 5
    assert health.pending_requests == 0 and health._entries == {}


async def test_on_demand_checks_run_in_the_monitors_task_group(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeStore([False])
    monkeypatch.setattr(health_mod, "store_for_url", lambda url, root: fake)
    health = monitor(Stores())
    async with running(health):
        assert await health.request("s3://bucket/", named=False) == (False, "check 1 failed")
        assert await health.request("s3://bucket/", named=False) == (False, "check 1 failed")  # cached
    assert fake.calls == 1 and health._entries == {}

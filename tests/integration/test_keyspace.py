"""KeySpace against a real etcd: load, watch, ordering, restarts and compaction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aetcd
import pytest

from gazette.etcd import connect
from gazette.etcd.keyspace import KeySpace
from gazette.testing.etcd import EtcdFixture, unique_prefix
from gazette.testing.etcd_process import EtcdProcess

WAIT = 15.0  # generous deadline for conditions; tests finish far sooner when correct


def decode_text(key: str, raw: bytes) -> str:
    if raw.startswith(b"bad"):
        raise ValueError("refusing a bad value")
    return raw.decode()


def mirror(ks: KeySpace) -> dict[str, str]:
    return {kv.key: kv.value for kv in ks.key_values}


async def etcd_snapshot(client: aetcd.Client, root: str) -> dict[str, str]:
    """What etcd holds under the root right now, decoded the way the mirror decodes."""
    out = {}
    for kv in await client.get_prefix((root + "/").encode()):
        if not kv.value.startswith(b"bad"):
            out[kv.key.decode()] = kv.value.decode()
    return out


@asynccontextmanager
async def watching(ks: KeySpace, client: aetcd.Client) -> AsyncIterator[asyncio.Task[Any]]:
    """Runs ks.watch for the duration of the block; fails the test if the watch died."""
    task = asyncio.create_task(ks.watch(client))
    try:
        yield task
        assert not task.done(), f"watch stopped: {task.exception() if task.done() else ''}"
    finally:
        task.cancel()
        await asyncio.wait([task])


async def put(client: aetcd.Client, key: str, value: str) -> int:
    result = await client.put(key.encode(), value.encode())
    revision: int = result.header.revision
    return revision


async def put_when_reachable(client: aetcd.Client, key: str, value: str) -> int:
    """put, retried while the client's channel is still reconnecting to a restarted etcd."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                return await put(client, key, value)
            except aetcd.exceptions.ConnectionFailedError:
                await asyncio.sleep(0.05)  # pacing between attempts, not synchronisation


async def delete(client: aetcd.Client, key: str) -> int:
    result = await client.delete(key.encode())
    revision: int = result.header.revision
    return revision


async def test_load_reads_prefix_at_one_revision(etcd: EtcdFixture) -> None:
    root = etcd.prefix
    for i in range(5):
        await put(etcd.client, f"{root}/items/j{i}", f"v{i}")
    await put(etcd.client, f"{root}/items/broken", "bad value")
    # A sibling root sharing the string prefix must not leak into this keyspace.
    await put(etcd.client, f"{root}-sibling/items/x", "no")
    last = await put(etcd.client, f"{root}/members/z#m", "member")

    ks = KeySpace(root, decode_text, page_size=2)  # several pages
    await ks.load(etcd.client)

    assert mirror(ks) == {**{f"{root}/items/j{i}": f"v{i}" for i in range(5)},
                          f"{root}/members/z#m": "member"}
    assert [kv.key for kv in ks.key_values] == sorted(mirror(ks))
    assert ks.revision >= last
    assert ks.header.cluster_id != 0
    entry = ks.search(f"{root}/items/j3")
    assert entry is not None and entry.raw == b"v3" and entry.version == 1
    assert [kv.key for kv in ks.prefixed(f"{root}/members/")] == [f"{root}/members/z#m"]


async def test_load_at_an_older_revision(etcd: EtcdFixture) -> None:
    root = etcd.prefix
    rev = await put(etcd.client, f"{root}/a", "1")
    await put(etcd.client, f"{root}/a", "2")
    await put(etcd.client, f"{root}/b", "3")
    ks = KeySpace(root, decode_text)
    await ks.load(etcd.client, revision=rev)
    assert mirror(ks) == {f"{root}/a": "1"}
    assert ks.revision == rev


async def test_watch_applies_changes_in_revision_order(etcd: EtcdFixture) -> None:
    root = etcd.prefix
    client = etcd.client
    ks = KeySpace(root, decode_text, apply_delay=0.0)
    observed: list[tuple[int, dict[str, str]]] = []
    ks.observers.append(lambda: observed.append((ks.revision, mirror(ks))))

    await put(client, f"{root}/items/pre", "existing")
    await ks.load(client)
    expected_at: dict[int, dict[str, str]] = {ks.revision: mirror(ks)}
    state = dict(mirror(ks))

    async with watching(ks, client):
        async def step(op: Callable[[], Any], change: Callable[[dict[str, str]], object]) -> None:
            revision = await op()
            change(state)
            expected_at[revision] = dict(state)

        await step(lambda: put(client, f"{root}/items/a", "1"),
                   lambda s: s.update({f"{root}/items/a": "1"}))
        await step(lambda: put(client, f"{root}/items/b", "2"),
                   lambda s: s.update({f"{root}/items/b": "2"}))
        await step(lambda: put(client, f"{root}/items/a", "3"),
                   lambda s: s.update({f"{root}/items/a": "3"}))
        await step(lambda: delete(client, f"{root}/items/pre"),
                   lambda s: s.pop(f"{root}/items/pre"))

        # One transaction, one revision: both changes must appear together.
        async def txn() -> int:
            ok, _ = await client.transaction(
                compare=[],
                success=[
                    client.transactions.put(f"{root}/items/c".encode(), b"4"),
                    client.transactions.delete(f"{root}/items/b".encode()),
                ],
                failure=[],  # aetcd requires a list here
            )
            assert ok
            got = await client.get(f"{root}/items/c".encode())
            assert got is not None
            revision: int = got.mod_revision
            return revision

        def txn_change(s: dict[str, str]) -> None:
            s[f"{root}/items/c"] = "4"
            del s[f"{root}/items/b"]

        await step(txn, txn_change)
        final = max(expected_at)
        await ks.wait_for_revision(final, timeout=WAIT)

    assert mirror(ks) == state
    assert ks.revision == final
    revisions = [rev for rev, _ in observed]
    assert revisions == sorted(set(revisions)), "observers must see strictly increasing revisions"
    for rev, snapshot in observed:
        assert snapshot == expected_at[rev], f"state at revision {rev} is not etcd's"


async def test_bad_values_are_skipped_and_repaired(etcd: EtcdFixture) -> None:
    root, client = etcd.prefix, etcd.client
    ks = KeySpace(root, decode_text, apply_delay=0.0)
    await ks.load(client)
    async with watching(ks, client):
        await put(client, f"{root}/x", "good")
        await put(client, f"{root}/y", "bad one")  # never decodes: stays absent
        rev = await put(client, f"{root}/x", "bad update")  # keeps the last good value
        await ks.wait_for_revision(rev, timeout=WAIT)
        assert mirror(ks) == {f"{root}/x": "good"}

        rev = await put(client, f"{root}/y", "fixed")
        await ks.wait_for_revision(rev, timeout=WAIT)
        assert mirror(ks) == {f"{root}/x": "good", f"{root}/y": "fixed"}
        rev = await delete(client, f"{root}/x")
        await ks.wait_for_revision(rev, timeout=WAIT)
        assert mirror(ks) == {f"{root}/y": "fixed"}


async def test_wait_for_revision_times_out(etcd: EtcdFixture) -> None:
    ks = KeySpace(etcd.prefix, decode_text)
    await ks.load(etcd.client)
    with pytest.raises(TimeoutError):
        await ks.wait_for_revision(ks.revision + 1, timeout=0.05)
    await ks.wait_for_revision(ks.revision, timeout=0.05)  # already there: returns at once


async def test_update_signal_wakes_waiters(etcd: EtcdFixture) -> None:
    ks = KeySpace(etcd.prefix, decode_text, apply_delay=0.0)
    await ks.load(etcd.client)
    async with watching(ks, etcd.client):
        signal = ks.update_signal()
        assert not signal.is_set()
        await put(etcd.client, f"{etcd.prefix}/k", "v")
        async with asyncio.timeout(WAIT):
            await signal.wait()
        assert ks.search(f"{etcd.prefix}/k") is not None


async def test_watch_resumes_after_etcd_restart(
    etcd_fresh: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gazette.etcd.keyspace")
    root = unique_prefix()
    client = await connect(etcd_fresh.endpoint)
    try:
        ks = KeySpace(root, decode_text, apply_delay=0.0)
        await put(client, f"{root}/before", "1")
        async with watching(ks, client):
            await ks.wait_for_revision(1, timeout=WAIT)  # the initial load
            rev = await put(client, f"{root}/during", "2")
            await ks.wait_for_revision(rev, timeout=WAIT)
            cluster_id = ks.header.cluster_id

            await etcd_fresh.akill()
            await etcd_fresh.arestart()

            rev = await put_when_reachable(client, f"{root}/after", "3")
            await delete(client, f"{root}/before")
            rev = await put(client, f"{root}/during", "4")
            await ks.wait_for_revision(rev, timeout=WAIT)

            assert mirror(ks) == {f"{root}/during": "4", f"{root}/after": "3"}
            assert mirror(ks) == await etcd_snapshot(client, root)
            assert ks.header.cluster_id == cluster_id
        assert "unavailable" in caplog.text or "watch ended" in caplog.text
    finally:
        await client.close()


async def test_watch_reloads_after_falling_behind_compaction(
    etcd_fresh: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gazette.etcd.keyspace")
    root = unique_prefix()
    client = await connect(etcd_fresh.endpoint)
    try:
        for i in range(10):
            await put(client, f"{root}/k{i}", f"v{i}")
        ks = KeySpace(root, decode_text, apply_delay=0.0)
        observed: list[int] = []
        ks.observers.append(lambda: observed.append(ks.revision))

        # Watch for a while, then stop watching (as a stalled process would).
        async with watching(ks, client):
            rev = await put(client, f"{root}/k0", "changed")
            await ks.wait_for_revision(rev, timeout=WAIT)
        behind = ks.revision

        # Meanwhile etcd moves on, and compacts away the history the mirror would need.
        for i in range(60):
            await put(client, f"{root}/k{i % 15}", f"w{i}")
        for i in range(0, 15, 3):
            await delete(client, f"{root}/k{i}")
        await put(client, f"{root}/k1", "bad now")  # an undecodable value in the snapshot
        head = await put(client, f"{root}/last", "x")
        await client.compact(head, physical=True)

        async with watching(ks, client):
            await ks.wait_for_revision(head, timeout=WAIT)
            assert mirror(ks) == await etcd_snapshot(client, root)
            # And it keeps following after the reload.
            rev = await put(client, f"{root}/k1", "repaired")
            await ks.wait_for_revision(rev, timeout=WAIT)
            assert mirror(ks)[f"{root}/k1"] == "repaired"
            assert mirror(ks) == await etcd_snapshot(client, root)

        assert behind < head
        assert observed == sorted(observed)
        assert "compaction" in caplog.text
    finally:
        await client.close()

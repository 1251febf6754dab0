"""JSONFileStore: commits survive reopening, wait for their appends, snapshot the state when
started, and a damaged file is a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.consumer.stores.json_file import JSONFileStore, StateFileError
from gazette.consumer.stores.recorded import StoreOptionError
from gazette.protocol import consumer_pb2 as pc
from gazette.recoverylog import FSM, Recorder


def _checkpoint(offsets: dict[str, int]) -> pc.Checkpoint:
    cp = pc.Checkpoint()
    for j, o in offsets.items():
        cp.sources[j].read_through = o
        cp.sources[j].producers.add(id=b"\x01\x02\x03\x04\x05\x06").state.last_ack = 7
    cp.ack_intents["out/a"] = b"ack\n"
    return cp


async def test_commit_then_reopen_restores_state_and_checkpoint(tmp_path: Path) -> None:
    store = JSONFileStore(tmp_path / "s", {"a": 1})
    assert store.restore_checkpoint(None) == pc.Checkpoint()  # type: ignore[arg-type]
    cp = _checkpoint({"in/x": 120})
    await store.start_commit(None, cp, [])  # type: ignore[arg-type]
    again = JSONFileStore(tmp_path / "s")
    assert again.state == {"a": 1}
    assert again.restore_checkpoint(None) == cp  # type: ignore[arg-type]
    assert not (tmp_path / "s" / "next.json").exists()
    lines = (tmp_path / "s" / "state.json").read_text().splitlines()
    assert lines[0] == '{"in/x": 120}'  # Gazette's layout: offsets, state, checkpoint


async def test_commit_waits_for_appends_and_snapshots_state(tmp_path: Path) -> None:
    store = JSONFileStore(tmp_path, {"n": 1})
    append: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut = store.start_commit(None, _checkpoint({"in/x": 5}), [append])  # type: ignore[arg-type]
    store.state["n"] = 2  # the next transaction mutates state while this one commits
    await asyncio.sleep(0)
    assert not (tmp_path / "state.json").exists()  # nothing written before the append resolved
    append.set_result(None)
    await fut
    assert JSONFileStore(tmp_path).state == {"n": 1}


async def test_failed_append_fails_the_commit_and_writes_nothing(tmp_path: Path) -> None:
    store = JSONFileStore(tmp_path, {"n": 1})
    append: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    append.set_exception(OSError("broker gone"))
    with pytest.raises(OSError, match="broker gone"):
        await store.start_commit(None, _checkpoint({"in/x": 5}), [append])  # type: ignore[arg-type]
    assert not (tmp_path / "state.json").exists()


def test_offsets_line_overrides_checkpoint_and_damage_is_named(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"in/x": 99}\n{"k": 3}\n')
    store = JSONFileStore(tmp_path)
    assert store.checkpoint.sources["in/x"].read_through == 99 and store.state == {"k": 3}
    path.write_text("{not json\n")
    with pytest.raises(StateFileError, match="state.json"):
        JSONFileStore(tmp_path)


def test_destroy_keeps_the_directory_without_a_recorder(tmp_path: Path) -> None:
    JSONFileStore(tmp_path / "keep").destroy()
    assert (tmp_path / "keep").exists()
    rec = Recorder(None, "log", FSM("log"), 1, str(tmp_path / "gone"))  # type: ignore[arg-type]
    JSONFileStore(recorder=rec).destroy()
    assert not (tmp_path / "gone").exists()
    with pytest.raises(StoreOptionError, match="lives in its recorder's directory"):
        JSONFileStore(tmp_path / "elsewhere", recorder=rec)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=50, deadline=None)
@given(state=json_values, offsets=st.dictionaries(st.from_regex(r"[a-z]{1,6}/[a-z0-9]{1,6}", fullmatch=True),
                                                  st.integers(0, 1 << 50), max_size=4))
def test_round_trip(tmp_path_factory: pytest.TempPathFactory, state: Any, offsets: dict[str, int]) -> None:
    d = tmp_path_factory.mktemp("rt")

    async def go() -> None:
        store = JSONFileStore(d, {"v": state})
        await store.start_commit(None, _checkpoint(offsets), [])  # type: ignore[arg-type]

    asyncio.run(go())
    back = JSONFileStore(d)
    assert back.state == {"v": state}
    assert back.checkpoint == _checkpoint(offsets)

"""FanIn: several async iterators into one bounded queue (read_committed's and a shard's readers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gazette.message.fanin import FanIn
from gazette.testing.eventually import eventually


async def items(name: str, n: int, fail: Exception | None = None) -> AsyncIterator[str]:
    for i in range(n):
        yield f"{name}{i}"
        await asyncio.sleep(0)
    if fail is not None:
        raise fail


async def drain(fan: FanIn[str]) -> list[str]:
    out = []
    while (item := await fan.get()) is not None:
        out.append(item)
    return out


@pytest.mark.parametrize("sources", [[("a", 5)], [("a", 5), ("b", 3)], [("a", 0), ("b", 4), ("c", 1)]])
async def test_every_item_once_each_source_in_order(sources: list[tuple[str, int]]) -> None:
    async with FanIn[str]("t", 2) as fan:
        for name, n in sources:
            fan.add(name, items(name, n))
        got = await drain(fan)
        assert await fan.get() is None  # ended stays ended
    for name, n in sources:
        assert [g for g in got if g[0] == name] == [f"{name}{i}" for i in range(n)]
    assert len(got) == sum(n for _, n in sources)


async def test_a_failure_comes_after_the_items_read_before_it_then_the_rest_continue() -> None:
    async with FanIn[str]("t", 8) as fan:
        fan.add("bad", items("x", 3, ValueError("broken")))
        got: list[str] = []
        with pytest.raises(ValueError, match="broken"):
            while (item := await fan.get()) is not None:
                got.append(item)
        assert got == ["x0", "x1", "x2"]
        assert await fan.get() is None  # the failed source has ended


async def test_the_queue_bound_holds_readers_back_and_aclose_stops_them() -> None:
    produced: list[int] = []

    async def endless() -> AsyncIterator[str]:
        i = 0
        while True:
            produced.append(i)
            yield str(i)
            i += 1

    fan = FanIn[str]("t", 3)
    fan.add("endless", endless())
    await eventually(lambda: len(produced) >= 4, "the reader fills the queue", interval=0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(produced) == 4  # three queued, the fourth waits to be put
    assert await fan.get() == "0"
    await fan.aclose()
    stopped = len(produced)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(produced) == stopped  # the reader task is gone

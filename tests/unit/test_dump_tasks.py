"""SIGUSR1's task dump: every task named with its frames, never failing half-way."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gazette.server.process import dump_tasks


async def _parked(event: asyncio.Event) -> None:
    await event.wait()


async def _agen(event: asyncio.Event):  # type: ignore[no-untyped-def]
    await event.wait()
    yield 1


async def _in_generator(event: asyncio.Event) -> None:
    async for _ in _agen(event):
        pass


def test_dump_names_every_task_and_its_frames(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        event = asyncio.Event()
        tasks = [asyncio.create_task(_parked(event), name="parked-reader"),
                 asyncio.create_task(_in_generator(event), name="generator-consumer")]
        await asyncio.sleep(0)  # let both park on the event
        with caplog.at_level(logging.WARNING, logger="gazette"):
            dump_tasks()
        event.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    text = caplog.text
    assert "asyncio tasks (SIGUSR1)" in text
    assert "--- task parked-reader" in text and "in _parked" in text
    assert "--- task generator-consumer" in text and "in _in_generator" in text
    assert "stack unavailable" not in text

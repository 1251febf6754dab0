"""Fixtures shared by unit test modules, and the event loops async tests run on.

A module marked ``both_loops`` (``pytestmark = pytest.mark.both_loops``) runs each of its
async tests twice, on asyncio's loop and on uvloop (ids ``[asyncio]`` and ``[uvloop]``); every
other async test runs on asyncio's loop alone, as before. Without uvloop installed (the
uvloop extra) the ``[uvloop]`` runs are skipped, saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
from raw_h2 import stalls  # noqa: F401  (the transport tests' CPU-stall probe, a fixture)

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def _uvloop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        pytest.skip("uvloop is not installed (the uvloop extra)")
    return uvloop.new_event_loop()


ASYNCIO_ONLY: Mapping[str, LoopFactory] = {"asyncio": asyncio.new_event_loop}
BOTH_LOOPS: Mapping[str, LoopFactory] = {"asyncio": asyncio.new_event_loop, "uvloop": _uvloop}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, LoopFactory]:
    """pytest-asyncio's hook: the loops ``item`` runs on (both for ``both_loops`` modules)."""
    return BOTH_LOOPS if item.get_closest_marker("both_loops") is not None else ASYNCIO_ONLY

"""Waiting for a condition that nothing signals: poll it under a deadline.

Tests and harnesses observe other processes (their logs, etcd, a port), worker threads, or an
event loop's fakes, which offer nothing to await. They poll, and polling is then the
synchronisation: never a fixed sleep. This is the one polling helper of the project:

* :func:`eventually` (a coroutine): ``cond`` may be a plain function or return an awaitable
  (an ``async def`` predicate); between polls the loop runs other tasks.
* :func:`eventually_sync`: the same for synchronous callers (threads, the process harness).

Invariants:

* ``cond`` is called at least once, and once more after the deadline passed, so a condition
  met just at the deadline is seen. Its first truthy result is returned.
* Past ``within`` seconds it raises :class:`NotMetError` naming ``what`` (an
  ``AssertionError``, so pytest shows it as a failed expectation, and a ``TimeoutError``).
* ``interval=0`` yields to the event loop once per poll: for fakes that need loop turns, not
  time (the deadline still bounds a condition never met).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

from gazette.errors import GazetteError

__all__ = ["DEFAULT_WITHIN", "NotMetError", "eventually", "eventually_sync"]

T = TypeVar("T")

#: The default deadline, generous for a busy 2-core machine.
DEFAULT_WITHIN = 30.0
_INTERVAL = 0.05


class NotMetError(GazetteError, AssertionError, TimeoutError):
    """A condition polled by ``eventually`` was not met within its deadline."""


def _not_met(what: str, within: float) -> NotMetError:
    return NotMetError(f"{what}: not met within {within}s")


@overload
async def eventually(cond: Callable[[], Awaitable[T | None]], what: str, within: float = ...,
                     *, interval: float = ...) -> T: ...


@overload
async def eventually(cond: Callable[[], T | None], what: str, within: float = ...,
                     *, interval: float = ...) -> T: ...


async def eventually(cond: Callable[[], object], what: str, within: float = DEFAULT_WITHIN,
                     *, interval: float = _INTERVAL) -> object:
    """Polls ``cond`` every ``interval`` seconds until it returns something truthy (returned);
    :class:`NotMetError` naming ``what`` after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        late = loop.time() >= deadline
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if late:
            raise _not_met(what, within)
        await asyncio.sleep(interval)  # polling: the condition is the synchronisation


def eventually_sync(cond: Callable[[], T | None], what: str, within: float = DEFAULT_WITHIN,
                    *, interval: float = _INTERVAL) -> T:
    """:func:`eventually` for synchronous callers: blocks the calling thread between polls."""
    deadline = time.monotonic() + within
    while True:
        late = time.monotonic() >= deadline
        got = cond()
        if got:
            return got
        if late:
            raise _not_met(what, within)
        time.sleep(interval)  # polling other processes: the condition is the synchronisation

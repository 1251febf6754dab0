"""The event loop a member process runs on: uvloop where it is installed (the ``uvloop``
extra), else asyncio's own.

``gazette serve`` and ``gazette consume`` (and ``run_consumer``) take ``--event-loop`` (env
``GAZETTE_EVENT_LOOP``): ``auto`` (the default: uvloop if it imports, else asyncio),
``uvloop`` or ``asyncio``; ``run_consumer``'s ``event_loop`` keyword overrides the flag.

Invariants:

* ``uvloop`` asked for and not installed exits with one line naming the extra to install;
  an unknown name exits with one line naming the flag. Nothing has started by then.
* The loop is made by ``asyncio.Runner(loop_factory=...)``, never by a global event loop
  policy, so other loops of the process (a thread's, a test's) are unaffected; asyncio's is
  made exactly as ``asyncio.run`` makes it.
* The process logs which loop it runs, once, at INFO, before it starts.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gazette.server.flags import Flag

__all__ = ["EVENT_LOOPS", "EVENT_LOOP_FLAG", "loop_factory", "run"]

log = logging.getLogger(__name__)

T = TypeVar("T")

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

EVENT_LOOP_FLAG: Flag = (
    "--event-loop", "GAZETTE_EVENT_LOOP", "auto",
    "Event loop: auto (uvloop if installed, else asyncio), uvloop or asyncio")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(name: str) -> tuple[str, LoopFactory | None]:
    """The loop ``name`` (one of ``EVENT_LOOPS``) stands for: what it resolved to (with
    uvloop's version) and its factory (None: asyncio's, as ``asyncio.run`` makes it).
    Exits with one line if ``name`` is unknown, or is ``uvloop`` and uvloop is missing."""
    choice = name.strip().lower()
    if choice not in EVENT_LOOPS:
        raise SystemExit(f"gazette: invalid --event-loop {name!r} (expected {', '.join(EVENT_LOOPS)})")
    if choice == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError as err:
        if choice == "auto":
            return "asyncio", None
        raise SystemExit(f"gazette: --event-loop uvloop: uvloop is not installed ({err}); "
                         "install the uvloop extra: pip install 'gazette[uvloop]'") from None
    return f"uvloop {importlib.metadata.version('uvloop')}", uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], event_loop: str = "auto") -> T:
    """Runs ``main`` to completion on the loop ``event_loop`` names (see ``loop_factory``),
    as ``asyncio.run`` does, having logged which loop it is."""
    try:
        kind, factory = loop_factory(event_loop)
    except BaseException:
        main.close()  # never awaited: no "coroutine was never awaited" warning on top
        raise
    log.info(f"event loop: {kind}", extra={"event_loop": kind.split()[0]})
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

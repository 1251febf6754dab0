"""Owned tasks: Gazette's ``task.Group`` in asyncio terms, and cancelling a task correctly.

Every background task gazette starts has an owner that outlives it and cancels and awaits it
when the owner closes: a :class:`Supervisor` (a replica's pipeline shutdowns and pulses, the
RPC server's per-call handlers, the mux's connection set-ups, a shard's loops) or, for a
single handle, :func:`cancel_and_wait`.

Invariants:

* A task spawned in a Supervisor is referenced until it ends (asyncio holds only weak
  references), and forgotten once it ends: a long-lived owner does not grow.
* Policy ``"log"``: a failed task is logged with its name and the owner carries on (one
  journal's or one RPC's failure is its own). Policy ``"fail"``: the first failure cancels
  every other task and is raised from ``aclose()`` (and ``__aexit__``), as Gazette's Group.
  Policy ``"collect"``: failures are left on the tasks for the owner to read (it reaps them
  itself, e.g. gazctl's read session). A task's own cancellation is never a failure.
* ``aclose()`` cancels every remaining task and waits for all of them; afterwards nothing
  spawned here runs, and ``spawn`` refuses. If the caller is itself cancelled while waiting,
  the tasks are still awaited (none outlives its owner) and the cancellation is re-raised.
* :func:`cancel_and_wait` never swallows the *caller's* cancellation: a CancelledError that
  the cancelled task raises is absorbed, one aimed at the caller propagates (after the task
  settled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Literal

__all__ = ["Supervisor", "cancel_and_wait", "wait_first"]

log = logging.getLogger(__name__)

Policy = Literal["log", "fail", "collect"]


async def cancel_and_wait(fut: asyncio.Future[Any]) -> None:
    """Cancels ``fut`` and waits until it finished; re-raises the caller's own cancellation
    (one that arrived while waiting, or was pending before) once ``fut`` is done."""
    fut.cancel()
    interrupted = False
    while not fut.done():
        try:
            await asyncio.wait((fut,))
        except asyncio.CancelledError:
            interrupted = True  # keep waiting: nothing may outlive its owner
    if not fut.cancelled() and fut.exception() is not None:
        fut.exception()  # retrieved: the task's failure is its own, not the caller's
    task = asyncio.current_task()
    if interrupted or (task is not None and task.cancelling()):
        raise asyncio.CancelledError()


async def wait_first(*aws: Any) -> None:
    """Returns once any of ``aws`` (futures, tasks or coroutines) is done. Coroutines are
    wrapped here and cancelled on return; futures and tasks given are the caller's, left as is."""
    futs = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(futs, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f, a in zip(futs, aws, strict=True):
            if f is not a:
                f.cancel()


class Supervisor:
    """A group of named tasks with one owner (see the module docstring)."""

    def __init__(self, name: str, policy: Policy = "log") -> None:
        self.name = name
        self.policy = policy
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: BaseException | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        return frozenset(self._tasks)

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any],
              loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[Any]:
        """Starts ``coro`` as a task owned by this supervisor, on ``loop`` (the running loop if
        None: a caller that holds it spares the lookup, a system call per task on CPython
        3.11, which checks the process id)."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"supervisor {self.name!r} is closed; cannot spawn {name!r}")
        task = (loop or asyncio.get_running_loop()).create_task(coro, name=f"{self.name}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is None:
            return
        if self.policy == "collect":
            return
        if self.policy == "log":
            log.warning("task failed", extra={"task": task.get_name(), "err": repr(err)})
        elif self._failure is None:
            self._failure = err
            for t in self._tasks:
                t.cancel()

    @property
    def failure(self) -> BaseException | None:
        """The first failure under policy ``"fail"`` (None if none)."""
        return self._failure

    async def wait(self) -> None:
        """Waits until every task ended (new ones included); raises a ``"fail"`` failure."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._failure is not None:
            raise self._failure

    async def aclose(self) -> None:
        """Cancels every task, waits for all, then raises a ``"fail"`` failure if any."""
        self._closed = True
        interrupted = False
        while self._tasks:
            for t in self._tasks:
                t.cancel()
            try:
                await asyncio.wait(set(self._tasks))
            except asyncio.CancelledError:
                interrupted = True  # keep waiting: nothing may outlive its owner
        if interrupted:
            raise asyncio.CancelledError()
        if self._failure is not None:
            raise self._failure

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: object) -> None:
        await self.aclose()

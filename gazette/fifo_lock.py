"""`FifoLock`: an asyncio lock handed from holder to waiter in arrival order, whose free case
takes no coroutine.

A journal's send side is taken by every append (``broker/append.py``) and is free nearly
always: ``asyncio.Lock.acquire`` is an interpreted coroutine (and, once the lock has ever had
a waiter, a generator over its waiters) made and run for each, about a microsecond of a lone
append. :meth:`FifoLock.try_acquire` takes a free lock synchronously; :meth:`acquire` waits
only when it is held.

Invariants:

* At most one holder. ``release`` by a non-holder is not detected beyond a lock that is not
  held at all (RuntimeError), as ``asyncio.Lock``.
* Waiters are served in the order they began waiting. ``release`` with waiters hands the lock
  to the first waiter still waiting (the lock never appears free meanwhile), so a task that
  arrives later cannot overtake one already queued: ``try_acquire`` succeeds only when the
  lock is free, which implies that nobody waits.
* A waiter cancelled while waiting leaves the queue. One cancelled after the lock was handed
  to it, before it ran, passes the lock on to the next waiter and raises its cancellation:
  a cancellation never leaves the lock held by nobody. Nothing here awaits inside an
  ``except`` or ``finally`` block (the compiled build's rule, docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

__all__ = ["FifoLock"]


class FifoLock:
    """A FIFO hand-off lock (see the module docstring); usable as ``async with``."""

    def __init__(self) -> None:
        self._locked = False
        self._waiters: deque[asyncio.Future[None]] | None = None  # made on first contention

    def locked(self) -> bool:
        return self._locked

    def try_acquire(self) -> bool:
        """Takes the lock if it is free (no waiter can then be queued); True if taken."""
        if self._locked:
            return False
        self._locked = True
        return True

    async def acquire(self) -> bool:
        """Takes the lock, waiting behind earlier waiters if it is held; returns True."""
        if not self._locked:
            self._locked = True
            return True
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = deque()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            # Handed to us (its result set) before our cancellation could take effect: we
            # hold the lock and must pass it on. Otherwise we were still queued (unless a
            # release already dropped our cancelled future).
            if fut.done() and not fut.cancelled():
                self.release()
            elif fut in waiters:
                waiters.remove(fut)
            raise
        return True

    def release(self) -> None:
        """Hands the lock to the first waiter still waiting, or frees it."""
        if not self._locked:
            raise RuntimeError("FifoLock is not acquired")
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # stays locked: it is the waiter's now
                return
        self._locked = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()

    def __repr__(self) -> str:
        n = len(self._waiters) if self._waiters else 0
        return f"<FifoLock {'locked' if self._locked else 'unlocked'}, waiters:{n}>"

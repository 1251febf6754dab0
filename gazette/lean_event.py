"""`LeanEvent`: an ``asyncio.Event`` whose waiters are kept in a list, not a deque.

``asyncio.Event()`` allocates a ``collections.deque`` for its waiters up front: 624 bytes on
64-bit CPython, most of an event's cost, where an empty list is 56 (and 88 with one waiter).
A broker keeps several events per journal replica (route changes, refreshes, pulses, its
index's), each with no or one waiter nearly always: with 10,000 replicas the deques were
~45 MiB, a third of what the replicas cost (tracemalloc, ``bench/replica_memory_bench.py``).
A consumer's shards and recovery-log players, and the event a shard renews after every
transaction, are the same kind.

Invariants:

* It is an ``asyncio.Event`` (a subclass): same methods, same semantics, accepted wherever
  one is typed. Only the container of its waiters differs: the three operations
  ``asyncio.Event`` applies to it (append, remove, iterate) are a list's too. Removal is
  linear in the waiters, which is fine for the few an event of one journal has.
* It relies on ``asyncio.Event``'s two private attributes, ``_waiters`` and ``_value``, as
  CPython 3.11 to 3.13 define them; ``tests/unit/test_lean_event.py`` fails if they change.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LeanEvent"]


class LeanEvent(asyncio.Event):
    def __init__(self) -> None:  # deliberately not asyncio.Event's: that one makes the deque
        self._waiters: Any = []
        self._value = False

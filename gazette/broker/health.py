"""`HealthTicker`: one timer for the health ticks of every journal a broker is primary of.

Gazette's pulse daemon gives every replica its own timer. Here a primary replica registers
with the broker's ticker instead, which wakes every ``granularity`` seconds and ticks, in one
pass, the replicas whose next tick came due (``Replica.health_tick``). A timer per replica
costs an event-loop wake, a timeout context and a task switch per tick: about 30 us each, a
few per cent of a core at tens of thousands of journals; the ticker's pass costs a heap pop.

Invariants:

* A registered replica is ticked once per ``interval``, jittered to 0.75-1.25 of it (drawn
  per tick), so journals registered together (a large apply, a broker's start) spread out
  instead of ticking together every interval; the first tick comes a jittered interval
  after registration.
* ``discard`` takes effect at once: a discarded replica is never ticked again, even though
  its heap entry stays until it comes due (entries carry the token of their registration,
  and a re-registration gets a new one).
* Ticks run synchronously in the ticker's pass, in due order; ``health_tick`` only counts and
  may ask for a pulse (it never awaits), so one pass never holds the loop for long.
* The clock is injected (``clock``, ``rand``): ``due(now)`` is the whole state machine, and
  ``run`` only sleeps between passes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["HealthTicker", "Tickable"]


class Tickable(Protocol):
    """What the ticker ticks (a primary ``Replica``)."""

    def health_tick(self) -> None: ...


class HealthTicker:
    """See the module docstring."""

    def __init__(self, interval: float, *, granularity: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random) -> None:
        if interval <= 0:
            raise ValueError(f"health interval must be positive, not {interval}")
        self.interval = interval
        # Ticks are jittered by a quarter of the interval: finer wake-ups would buy nothing.
        self.granularity = granularity if granularity is not None else min(1.0, interval / 8)
        self._clock = clock
        self._rand = rand
        self._heap: list[tuple[float, int, Tickable]] = []
        self._tokens: dict[Tickable, int] = {}
        self._next_token = itertools.count()

    def __len__(self) -> int:
        return len(self._tokens)

    def _next_due(self, now: float) -> float:
        return now + self.interval * (0.75 + 0.5 * self._rand())

    def add(self, replica: Tickable) -> None:
        """Registers ``replica`` (again: its earlier registration is replaced)."""
        token = next(self._next_token)
        self._tokens[replica] = token
        heapq.heappush(self._heap, (self._next_due(self._clock()), token, replica))

    def discard(self, replica: Tickable) -> None:
        """Stops ticking ``replica``, if it was registered."""
        self._tokens.pop(replica, None)

    def due(self, now: float) -> list[Tickable]:
        """Pops the registrations due at ``now``, schedules their next ticks, and returns
        their replicas in due order."""
        heap, tokens, out = self._heap, self._tokens, []
        while heap and heap[0][0] <= now:
            _, token, replica = heapq.heappop(heap)
            if tokens.get(replica) != token:
                continue  # discarded, or registered again since
            out.append(replica)
            heapq.heappush(heap, (self._next_due(now), token, replica))
        return out

    def tick(self) -> int:
        """Ticks every replica due now; returns how many."""
        ticked = self.due(self._clock())
        for replica in ticked:
            replica.health_tick()
        return len(ticked)

    async def run(self) -> None:
        """Ticks due replicas every ``granularity`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.granularity)  # a periodic timer, not a synchronisation
            self.tick()

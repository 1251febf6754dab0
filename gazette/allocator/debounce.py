"""`SolveDebounce`: when the leader re-solves after its network (items, members, limits) changes.

Applying many items arrives as a burst of etcd transactions, each changing
`State.network_key`, and each solve costs time linear in all items: solving after every one
made a 10,000-journal apply cost seconds of solving per transaction. The leader instead waits
for the burst to pause. Meanwhile it keeps converging towards its previous solution, which
is still a valid assignment (see `allocator`'s invariants); new items simply wait.

Invariants (times from the injected `clock`):

* Nothing is due while the key equals the key last solved.
* A change is due at once if it is urgent (the caller says so for member or limit changes,
  which a previous solution may not survive), or if it starts a pending period after a quiet
  spell: no solve completed within `quiet` before it. So a lone change is solved without delay.
* Otherwise it is due once the key has not changed for `quiet`, or `max_delay` after the
  pending period began, whichever comes first: a steady stream of changes is still solved at
  least every `max_delay`.
* Solving is at most `max_duty` of a steady stream's time: its pending periods last at least
  the last solve's duration (as `solved` was told it) over `max_duty`, when that is longer
  than `max_delay`. A solve grows with every item while a large apply streams in; without
  this the leader solved back to back at 50,000 journals, and its solver competed for the
  cores with the apply and the replicas it was assigning.
* `observe` never sleeps: it returns how long the caller may wait before asking again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class SolveDebounce:
    """See the module docstring."""

    __slots__ = ("quiet", "max_delay", "max_duty", "_clock", "_solved", "_seen", "_changed_at",
                 "_pending_since", "_solved_at", "_took")

    def __init__(self, quiet: float, max_delay: float, clock: Clock = time.monotonic,
                 max_duty: float = 1.0) -> None:
        if quiet < 0 or max_delay < quiet:
            raise ValueError(f"need 0 <= quiet ({quiet}) <= max_delay ({max_delay})")
        if not 0 < max_duty <= 1:
            raise ValueError(f"need 0 < max_duty ({max_duty}) <= 1")
        self.quiet, self.max_delay, self.max_duty, self._clock = quiet, max_delay, max_duty, clock
        self._took = 0.0  # the last solve's duration
        self._solved: object = _NEVER  # the key last solved
        self._seen: object = _NEVER  # the key last observed
        self._changed_at = 0.0  # when `_seen` was first observed
        self._pending_since: float | None = None  # when the key first differed from `_solved`
        self._solved_at: float | None = None  # when the last solve completed

    def observe(self, key: object, *, urgent: bool = False) -> float | None:
        """Records the current key: None if no solve is pending, 0.0 if one is due now, else
        the seconds until it is due (if nothing changes meanwhile)."""
        now = self._clock()
        if key == self._solved:
            self._seen, self._pending_since = key, None
            return None
        if key != self._seen:
            self._seen, self._changed_at = key, now
        if self._pending_since is None:
            self._pending_since = now
            if self._solved_at is None or now - self._solved_at >= self.quiet:
                return 0.0
        if urgent:
            return 0.0
        longest = max(self.max_delay, self._took / self.max_duty)
        due = min(self._changed_at + self.quiet, self._pending_since + longest)
        return max(0.0, due - now)

    def solved(self, key: object, took: float = 0.0) -> None:
        """Records that `key` was solved (call when the solve completes), in `took` seconds."""
        self._solved, self._solved_at, self._took = key, self._clock(), took
        self._pending_since = None if key == self._seen else self._solved_at


class _Never:
    """A key equal to nothing observed: nothing is solved before the first solve."""

    __slots__ = ()


_NEVER = _Never()

"""Cache of journal routes learned from broker response headers.

Invariants:
- Only routes with members are cached; an empty or absent route invalidates the entry.
- Entries expire after ``ttl`` seconds and the cache holds at most ``size`` journals
  (least recently used first out), so a stale route costs at most one misdirected
  request before the broker's answer corrects it.
- ``pick`` returns an endpoint of the route or None (meaning: use the default address).
  An append must reach the primary; a read prefers a member in the client's zone, then
  one whose endpoint already has a channel, then the primary.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Container

from gazette.protocol import protocol_pb2 as pb


class RouteCache:
    def __init__(self, size: int = 1024, ttl: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if size <= 0:
            raise ValueError(f"route cache size must be > 0, not {size}")
        self._size = size
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[pb.Route, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The most journals the cache holds."""
        return self._size

    def update(self, journal: str, route: pb.Route | None) -> None:
        """Cache ``route`` for ``journal``, or forget the journal if the route is empty."""
        if route is None or len(route.members) == 0:
            self._entries.pop(journal, None)
            return
        copy = pb.Route()
        copy.CopyFrom(route)
        self._entries[journal] = (copy, self._clock())
        self._entries.move_to_end(journal)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def invalidate(self, journal: str) -> None:
        self._entries.pop(journal, None)

    def route(self, journal: str) -> pb.Route | None:
        """The cached route of ``journal``, or None when unknown or expired."""
        entry = self._entries.get(journal)
        if entry is None:
            return None
        route, at = entry
        if at + self._ttl < self._clock():
            del self._entries[journal]
            return None
        self._entries.move_to_end(journal)
        return route


def pick(route: pb.Route | None, require_primary: bool, zone: str = "",
         connected: Container[str] = ()) -> str | None:
    """Endpoint of ``route`` to dispatch to, or None to use the default address."""
    if route is None or len(route.members) == 0 or len(route.endpoints) != len(route.members):
        return None
    if require_primary:
        if 0 <= route.primary < len(route.endpoints):
            return route.endpoints[route.primary] or None
        return None
    candidates = list(range(len(route.members)))
    if zone:
        local = [i for i in candidates if route.members[i].zone == zone]
        candidates = local or candidates
    warm = [i for i in candidates if route.endpoints[i] in connected]
    if warm:
        candidates = warm
    if route.primary in candidates:
        return route.endpoints[route.primary] or None
    return route.endpoints[candidates[0]] or None

"""Queued appends: an append reads its client's stream ahead before it queues.

An append reads its client's stream ahead, under the min-rate policy (``flow.py``), *before*
it takes its place in the journal's queue for the pipeline: until the client committed (the
empty chunk or the end of the stream) or ``READ_AHEAD`` bytes of content arrived. So a stalled
client (one that opened the stream and sent a little or nothing) never queues: it is aborted
where it stands, alongside every other stalled one, instead of each holding the pipeline for
its budget in turn while healthy appends wait behind all of them (300 stalled appends held a
healthy one for minutes). An append that arrived whole cannot stall once it holds the
pipeline; one that streams more than ``READ_AHEAD`` has shown it is sending, and is policed as
the holder (Gazette's policy: a stall costs the others at most its budget). While queued it
reads no further, so the broker's queueing never drains a client's budget.

Compiled (``gazette/_compiled.py``): every append fills one, and the fill of one that arrived
whole is a few calls into the transport's compiled request stream.

Invariant: the items come out exactly in the order the stream produced them, each once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from gazette.broker.flow import READ_AHEAD, StallWatch, min_rate_policed

__all__ = ["ReadAhead"]

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """A request stream read ahead before its append queues (see the module docstring):
    :meth:`fill` buffers items, iterating yields the buffered ones, then the rest of ``it``.

    Invariant: the items come out exactly in the order ``it`` produced them, each once."""

    def __init__(self, it: AsyncIterator[T]) -> None:
        self._it = it
        self._buf: deque[T] = deque()
        self._ended = False
        self._ready: Callable[[], bool] | None = getattr(it, "ready", None)
        self.buffered = 0
        """Content bytes read ahead by the last :meth:`fill` (for tests and metrics)."""

    async def fill(self, content_length: Callable[[T], int], min_rate: int,
                   limit: int = READ_AHEAD, watch: StallWatch | None = None) -> None:
        """Reads ahead until an empty item (the commit), the end of the stream, or ``limit``
        content bytes; raises FlowControlUnderflow if the client stalls meanwhile (below
        ``min_rate``; 0 polices nothing)."""
        it, ready = self._it, self._ready
        policed: AsyncIterator[T] | None = None  # made at the first wait (most appends arrive whole)
        n = 0
        while n < limit and not self._ended:
            if ready is not None and ready():
                source = it  # the item is here: taking it cannot stall
            elif policed is None:
                source = policed = min_rate_policed(it, content_length, min_rate, watch) if min_rate else it
            else:
                source = policed
            try:
                item = await source.__anext__()
            except StopAsyncIteration:
                self._ended = True
                break
            self._buf.append(item)
            size = content_length(item)
            if size == 0:
                # The commit: nothing more is due before it is answered. The end of the
                # stream, if it is already here, is taken too: the append then knows its
                # client sent everything, without another read of the stream.
                if ready is not None and ready():
                    try:
                        self._buf.append(await it.__anext__())
                    except StopAsyncIteration:
                        self._ended = True
                break
            n += size
        self.buffered = n

    def take(self) -> list[T]:
        """The items read ahead and not yet yielded, in order; they are yielded no more."""
        out = list(self._buf)
        self._buf.clear()
        return out

    @property
    def ended(self) -> bool:
        """Whether the stream's end was read (after the items :meth:`take` returns)."""
        return self._ended

    def ready(self) -> bool:
        """Whether the next item (or the end) is already here."""
        return bool(self._buf) or self._ended or (self._ready is not None and self._ready())

    def __aiter__(self) -> ReadAhead[T]:
        return self

    async def __anext__(self) -> T:
        if self._buf:
            return self._buf.popleft()
        if self._ended:
            raise StopAsyncIteration
        return await self._it.__anext__()

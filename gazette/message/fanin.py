"""Several async iterators read concurrently into one bounded queue: the readers' fan-in.

``read_committed`` and ``read_uncommitted`` of several journals and a consumer shard's
source journals read each journal in its own task and take what they read from one queue;
this is that machinery, once.

Invariants:

* One task per source, owned by the fan-in's :class:`~gazette.tasks.Supervisor`:
  ``aclose`` (or leaving ``async with``) cancels and awaits every one of them.
* The queue is bounded (``maxsize`` items): a slow taker holds every reader back.
* Items of one source keep their order; sources interleave as they arrive.
* A source's failure is delivered in order, after the items it read before failing:
  ``get`` raises it (once). ``get`` returns None once every source has ended (so items are
  never None).
"""

from __future__ import annotations

from asyncio import Queue
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from gazette.tasks import Supervisor

__all__ = ["FanIn"]

T = TypeVar("T")


class _Failed:
    __slots__ = ("err",)

    def __init__(self, err: Exception) -> None:
        self.err = err


_END: Any = object()


class FanIn(Generic[T]):
    """The items of several async iterators, through one bounded queue (see the module
    docstring)."""

    def __init__(self, name: str, maxsize: int) -> None:
        self._queue: Queue[Any] = Queue(maxsize=maxsize)
        self._readers = Supervisor(name, "collect")
        self._live = 0

    def add(self, name: str, items: AsyncIterator[T]) -> None:
        """Starts reading ``items`` in a task of its own."""
        self._readers.spawn(name, self._pump(items))
        self._live += 1

    async def _pump(self, items: AsyncIterator[T]) -> None:
        put = self._queue.put
        try:
            async for item in items:
                await put(item)
        except Exception as err:  # noqa: BLE001 - delivered in order to the taker
            await put(_Failed(err))
            return
        await put(_END)

    async def get(self) -> T | None:
        """The next item of any source; None once every source ended; raises a source's
        failure."""
        while self._live:
            item = await self._queue.get()
            if item is _END:
                self._live -= 1
            elif type(item) is _Failed:
                self._live -= 1
                raise item.err
            else:
                return item  # type: ignore[no-any-return]
        return None

    async def aclose(self) -> None:
        """Stops every reader task and waits for them."""
        await self._readers.aclose()

    async def __aenter__(self) -> FanIn[T]:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: object) -> None:
        await self.aclose()

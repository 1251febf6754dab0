"""The roles a :class:`~gazette.message.publisher.Publisher` appends through: ``AppendTarget``
and, when it can queue without suspending, ``BufferedAppender`` (the client's AppendService
is both).

Protocols, kept apart from the Publisher: a compiled module's protocol classes are not
protocols at runtime, and ``BufferedAppender`` is checked with ``isinstance``.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["AppendTarget", "BufferedAppender"]

H_co = TypeVar("H_co", covariant=True)
"""The type of an append's handle (``AsyncAppend`` for the client's AppendService)."""


class AppendTarget(Protocol[H_co]):
    """Appends framed content to journals, asynchronously (the client's AppendService).

    (Named so as not to be confused with ``gazette.client.Appender``, one Append RPC.)"""

    async def append(self, journal: str, data: bytes) -> H_co:
        """Start appending ``data`` to ``journal``, returning a handle on the append.

        Appends to one journal must be ordered as the calls were made; an implementation
        must therefore enqueue before its first suspension point.
        """
        ...


@runtime_checkable
class BufferedAppender(Protocol[H_co]):
    """An AppendTarget that queues without suspending, and says when writers must wait
    (:class:`gazette.client.AppendService`). The Publisher then awaits only for
    back-pressure, not once per message."""

    def append_nowait(self, journal: str, data: bytes) -> H_co:
        """Queue ``data`` for ``journal`` (ordered as called); returns a handle on it."""
        ...

    @property
    def writable(self) -> bool:
        """False once writers should await :meth:`wait_writable`."""
        ...

    async def wait_writable(self) -> None:
        """Wait until more may be queued (giving the event loop a turn)."""
        ...

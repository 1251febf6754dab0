"""File descriptors of a serving process: its limit, the reserve kept for new connections, and
accept failures.

A systemd unit or a login shell gives a process a soft ``RLIMIT_NOFILE`` of 1,024 and a far
higher hard limit; a broker holds a descriptor per connection, fragment file and peer. So:

* ``raise_nofile_limit()`` raises the soft limit to the hard one at process start (as Go's
  runtime does since 1.19) and logs the new limit once.
* ``FdBudget`` says how many descriptors the public port's connections may hold: the soft
  limit (read on every accept: an operator may lower it with ``prlimit``) less a
  reserve (``max(64, limit // 10)`` for files, etcd and peers, plus the 100 connections asyncio
  may accept in one go before admitting any), less the
  descriptors the process holds besides its connections (sampled from ``/proc/self/fd``). The
  multiplexer sheds its oldest idle or slow connections when its connections reach it.
* ``RESOURCE_ERRNOS`` are the ``accept()`` failures that mean descriptors (or memory) ran
  out: the multiplexer's listener pauses a second on one, sheds, and logs one line per
  interval with a count.

Invariants: nothing here raises at start (a platform without ``resource`` or ``/proc`` gets no
raise and a budget from the limit alone).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable

__all__ = ["ACCEPT_BURST", "RESOURCE_ERRNOS", "FdBudget", "nofile_limit", "open_fds", "raise_nofile_limit", "reserve_for"]

log = logging.getLogger(__name__)

try:
    import resource
except ImportError:  # pragma: no cover - not a POSIX system
    resource = None  # type: ignore[assignment]

MIN_RESERVE = 64
ACCEPT_BURST = 100
"""Connections asyncio accepts in one go before any is admitted (its ``backlog``, which the
multiplexer passes explicitly): the reserve covers them, so a flood cannot reach the limit
between two admission checks."""
_UNLIMITED = 1 << 20  # what an RLIM_INFINITY soft limit counts as


def nofile_limit() -> tuple[int, int]:
    """(soft, hard) ``RLIMIT_NOFILE``; infinity counts as 2**20."""
    if resource is None:  # pragma: no cover
        return _UNLIMITED, _UNLIMITED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (_UNLIMITED if soft == inf else soft), (_UNLIMITED if hard == inf else hard)


def raise_nofile_limit() -> int:
    """Raises the soft ``RLIMIT_NOFILE`` to the hard limit (capped where the kernel caps it);
    logs the limit once and returns it. Failure leaves the limit as it was (logged)."""
    if resource is None:  # pragma: no cover
        return _UNLIMITED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        target = hard
        if hard == resource.RLIM_INFINITY:  # setting infinity fails where nr_open caps it
            target = _nr_open() or soft
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as err:
            log.warning("cannot raise the file descriptor limit",
                        extra={"soft": soft, "hard": hard, "err": str(err)})
            return int(soft)
        log.info("raised the file descriptor limit", extra={"from": soft, "to": target})
        return int(target)
    log.info("file descriptor limit", extra={"limit": soft})
    return int(soft)


def _nr_open() -> int | None:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def open_fds() -> int | None:
    """How many descriptors this process holds (None where that cannot be told cheaply)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path)) - 1  # listing it opens one
        except OSError:
            continue
    return None  # pragma: no cover


def reserve_for(limit: int) -> int:
    """Descriptors kept free of connections under a soft limit of ``limit``."""
    return max(MIN_RESERVE, limit // 10) + ACCEPT_BURST


class FdBudget:
    """How many connections the port may hold before it sheds (see the module docstring).

    ``allowed(count)`` is the budget; it reads the limit each time (one syscall) and samples
    the process's other descriptors at most every ``refresh`` seconds (a directory listing),
    so it is cheap enough to ask on every accept. ``min_reserve`` (``--server.fd-reserve``)
    replaces the reserve's ``max(64, limit // 10)``; the accept burst is kept in either case.
    """

    def __init__(self, refresh: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 min_reserve: int | None = None) -> None:
        self.refresh = refresh
        self.min_reserve = min_reserve
        self._clock = clock
        self._at = float("-inf")
        self.limit = 0
        self.reserve = 0
        self.others = 0  # descriptors held besides the port's connections, at the last sample

    def allowed(self, connections: Callable[[], int]) -> int:
        """The budget; ``connections()`` (the exact count of open connections, which may cost
        the caller a scan) is asked only when the sample is refreshed."""
        self.limit = nofile_limit()[0]  # a syscall: cheap enough for every accept
        self.reserve = reserve_for(self.limit) if self.min_reserve is None else self.min_reserve + ACCEPT_BURST
        now = self._clock()
        if now - self._at >= self.refresh:
            self._at = now
            fds = open_fds()
            # The connections' own descriptors are in the sample; the rest is everything else
            # (listeners, files, etcd, peers, the splice helper's socket pair).
            self.others = max(0, fds - connections()) if fds is not None else 0
        return max(0, self.limit - self.reserve - self.others)


RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""Errors of ``accept()`` that mean the process (or system) is out of descriptors or memory."""

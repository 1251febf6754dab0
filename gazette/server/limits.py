"""The memory and descriptor budget of a serving process, as ``--server.*`` flags.

``gazette serve`` and ``gazette consume`` share these flags (both serve on the same scaffolding,
``gazette.server``); each defaults to its environment variable (``SERVER_MAX_BUFFERED``, ...)
and to the library's constant, so a process started without them behaves as before:

* ``--server.max-buffered``: request data all connections together may hold unconsumed
  (``gazette.rpc.server.MAX_BUFFERED``); over it, the connections holding more than their share
  are granted no more window.
* ``--server.connection-window`` and ``--server.connection-buffer``: one connection's receive
  window and the unread data its streams may hold before that window stops being replenished
  (``gazette.rpc.connection.CONNECTION_WINDOW``, ``CONNECTION_BUFFER_CAP``).
* ``--server.max-unread``: answers queued for a client that does not read them before its
  connection stops being read (``WRITE_BACKLOG_LIMIT``).
* ``--server.fd-reserve``: descriptors kept free of connections (0: ``max(64, limit // 10)``,
  see ``gazette.server.fds``).
* ``--server.http-head-timeout``: how long an HTTP/1.1 request head may take
  (``gazette.server.http.HTTP_HEAD_TIMEOUT``; Go's ReadHeaderTimeout).

Invariants: sizes parse as Go's ``humanize``-style byte counts (``256MiB``, ``64KiB``, ``1GB``,
``1048576``); a bad value exits at start with one line naming the flag, never later. A value of
``None`` in :class:`ServerLimits` means the library's default, read when the server is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from gazette.server.flags import Flag, Flags

__all__ = ["SERVER_LIMIT_FLAGS", "ServerLimits", "limits_from_flags", "parse_size"]

SERVER_LIMIT_FLAGS: list[Flag] = [
    ("--server.max-buffered", "SERVER_MAX_BUFFERED", "256MiB",
     "Request data all connections together may hold unconsumed; over it, connections holding more "
     "than their share are not read (flow control)"),
    ("--server.connection-window", "SERVER_CONNECTION_WINDOW", "32MiB",
     "HTTP/2 receive window granted to each connection"),
    ("--server.connection-buffer", "SERVER_CONNECTION_BUFFER", "32MiB",
     "Unread request data one connection's streams may hold before its window stops being replenished"),
    ("--server.max-unread", "SERVER_MAX_UNREAD", "4MiB",
     "Answers queued for a client that does not read them before its connection stops being read"),
    ("--server.fd-reserve", "SERVER_FD_RESERVE", "0",
     "File descriptors kept free of client connections (oldest idle or slow ones are shed to keep it). "
     "0: a tenth of the limit, at least 64"),
    ("--server.http-head-timeout", "SERVER_HTTP_HEAD_TIMEOUT", "10s",
     "Time an HTTP/1.1 request head may take from its first byte, or the connection is closed"),
]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes of a size such as ``256MiB``, ``64KiB``, ``1.5GB`` or ``1048576`` (ValueError if not one)."""
    m = _SIZE.fullmatch(text)
    unit = m and _UNITS.get(m.group(2).lower())
    if m is None or unit is None:
        raise ValueError(f"{text!r} is not a size (expected e.g. 256MiB, 64KiB, 1GB or a byte count)")
    return int(Fraction(m.group(1)) * unit)  # exact: a float loses bytes past 2**53


@dataclass(frozen=True)
class ServerLimits:
    """A process's budget (see the module docstring); ``None``: the library's default."""

    max_buffered: int | None = None
    connection_window: int | None = None
    connection_buffer: int | None = None
    max_unread: int | None = None
    fd_reserve: int | None = None
    http_head_timeout: float | None = None


def limits_from_flags(flags: Flags) -> ServerLimits:
    """The ``--server.*`` flags' budget; a bad value exits naming its flag."""

    def size(name: str, minimum: int = 1) -> int:
        try:
            value = parse_size(flags.get(name))
        except ValueError as err:
            raise SystemExit(f"gazette: invalid --{name}: {err}") from None
        if value < minimum:
            raise SystemExit(f"gazette: invalid --{name} {flags.get(name)!r} (expected at least {minimum} bytes)")
        return value

    window = size("server.connection-window", 65535)
    if window > (1 << 31) - 1:
        raise SystemExit(f"gazette: invalid --server.connection-window {flags.get('server.connection-window')!r} "
                         "(an HTTP/2 window is at most 2GiB - 1)")
    reserve = flags.integer("server.fd-reserve")
    if reserve < 0:
        raise SystemExit(f"gazette: invalid --server.fd-reserve {reserve} (expected >= 0)")
    head_timeout = flags.seconds("server.http-head-timeout")
    if head_timeout <= 0:
        raise SystemExit(f"gazette: invalid --server.http-head-timeout {flags.get('server.http-head-timeout')!r} "
                         "(expected a positive duration)")
    return ServerLimits(
        max_buffered=size("server.max-buffered"),
        connection_window=window,
        connection_buffer=size("server.connection-buffer"),
        max_unread=size("server.max-unread"),
        fd_reserve=reserve or None,
        http_head_timeout=head_timeout,
    )

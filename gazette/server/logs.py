"""Log output of gazette's processes: Gazette-like text lines or JSON, fields from ``extra``;
and bounded lines about clients (``ClientLog``, ``EveryInterval``, ``TokenBucket``, ``clip``).

Invariants: one line per record on stderr; ``--log.level`` and ``--log.format`` are checked,
a bad value exits with a message naming the flag. A client cannot make the process log more
than ``ClientLog``'s rate of lines about it, each at most ``MAX_LINE`` characters, and never a
traceback: those are for our own bugs.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_LINE", "ClientLog", "EveryInterval", "TokenBucket", "clip", "setup_logging"]


class _JSONFormatter(logging.Formatter):
    _SKIP = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._SKIP})
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _TextFormatter(logging.Formatter):
    _SKIP = _JSONFormatter._SKIP

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in self._SKIP)
        line = f"{record.levelname[:4]}[{time.strftime('%H:%M:%S', time.localtime(record.created))}] {record.getMessage():<40} {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line.rstrip()


def setup_logging(level: str, fmt: str) -> None:
    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR}
    if level.lower() not in levels:
        raise SystemExit(f"gazette: invalid --log.level {level!r} (expected debug, info, warn or error)")
    if fmt not in ("text", "json"):
        raise SystemExit(f"gazette: invalid --log.format {fmt!r} (expected text or json)")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JSONFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(levels[level.lower()])


# -- lines about clients ----------------------------------------------------------------------
#
# A client chooses what it sends and how often: whatever it makes us log must cost it more than
# it costs us. Hence lines about expected client misbehaviour (a malformed request, a timeout, a
# refused connection) are bounded three ways: in size (request data clipped, a line <= MAX_LINE
# bytes), per connection (the caller logs at most once per connection: one flag of its own), and
# per process (a token bucket; what it drops is counted and reported by the next line let
# through). Tracebacks are for our own bugs only, never for these.

MAX_LINE = 1024
"""Upper bound of a client line's message and fields together, in characters."""

_FIELD_LIMIT = 140  # 5 fields, their names and a 160-character message: under MAX_LINE
_MAX_FIELDS = 5


def clip(value: object, limit: int = _FIELD_LIMIT) -> str:
    """``value`` as printable text of at most ``limit`` characters (bytes and control characters
    escaped as ``repr`` does; what is cut is counted: ``...(+123)``)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value[: limit + 1])
        text = repr(raw)[2:-1]
        total = len(value)
        shown = len(raw)
    else:
        text = str(value)
        if not text.isprintable():
            text = repr(text)[1:-1]
        total = shown = len(text)
    if len(text) <= limit and shown == total:
        return text
    cut = text[: max(0, limit - 16)]
    return f"{cut}...(+{max(total - len(cut), 1)})"


class TokenBucket:
    """``take()`` succeeds at most ``burst`` times at once and ``rate`` times per second on
    average (tokens refill continuously up to ``burst``). Not thread-safe: one event loop."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket: rate {rate} and burst {burst} must be positive")
        self.rate, self.burst, self._clock = rate, float(burst), clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, n: float = 1.0) -> bool:
        """Takes ``n`` tokens if there are; False (and nothing taken) if not."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False


class ClientLog:
    """Rate-limited, size-bounded log lines about clients (see the section comment above).

    ``note(what, **fields)`` logs ``what`` with the fields (each clipped to 140 characters, at
    most 5 of them; the message to 160) if the process-wide bucket allows, and returns whether it did; lines it
    dropped since the last one are counted in the next line's ``dropped`` field. Never logs a
    traceback. The once-per-connection rule is the caller's: keep a flag on the connection.
    """

    def __init__(self, logger: logging.Logger, *, rate: float = 2.0, burst: float = 20,
                 level: int = logging.INFO, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.level = logger, level
        self.bucket = TokenBucket(rate, burst, clock)
        self.dropped = 0

    def note(self, what: str, **fields: object) -> bool:
        if not self.logger.isEnabledFor(self.level):
            return False
        if not self.bucket.take():
            self.dropped += 1
            return False
        extra = {k: clip(v) for k, v in list(fields.items())[:_MAX_FIELDS]}
        if self.dropped:
            extra["dropped"] = str(self.dropped)
            self.dropped = 0
        self.logger.log(self.level, clip(what, 160), extra=extra)
        return True


class EveryInterval:
    """Counts an event and logs one line per ``interval`` seconds at most: the first occurrence
    at once, later ones as a count in the next line (``event()`` returns whether it logged).
    For conditions that may repeat thousands of times a second (accept failures)."""

    def __init__(self, logger: logging.Logger, message: str, *, interval: float = 10.0,
                 level: int = logging.WARNING, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.message, self.interval, self.level = logger, message, interval, level
        self._clock = clock
        self._last: float | None = None
        self.count = 0       # occurrences not yet reported
        self.total = 0

    def event(self, n: int = 1, **fields: object) -> bool:
        """Counts ``n`` occurrences; logs if the interval since the last line has passed."""
        self.count += n
        self.total += n
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return False
        extra = {k: clip(v) for k, v in list(fields.items())[:_MAX_FIELDS]}
        extra["count"] = str(self.count)
        extra["interval_s"] = str(self.interval)
        self.logger.log(self.level, self.message, extra=extra)
        self._last = now
        self.count = 0
        return True

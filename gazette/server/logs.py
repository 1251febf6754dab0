"""Log output of gazette's processes: Gazette-like text lines or JSON, fields from ``extra``.

Invariants: one line per record on stderr; ``--log.level`` and ``--log.format`` are checked,
a bad value exits with a message naming the flag.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["setup_logging"]


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

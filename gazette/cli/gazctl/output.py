"""Output of gazctl: tables, humanized sizes and times, JSON, and log lines.

Invariants:
- Tables look like Gazette's (tablewriter): ``+---+`` borders, upper-cased centred
  headers, numeric cells right-aligned and others left-aligned, one space of padding.
- ``ibytes`` and ``reltime`` format exactly as go-humanize's IBytes and Time do.
- ``go_json`` encodes a message as Go's encoding/json encodes Gazette's structs: proto field
  names, zero values omitted, enums and 64-bit integers as numbers.
- Log lines are logrus's text layout: ``LEVL[0000] message`` padded to 44 columns, then
  ``key=value`` fields (values quoted when they need it), one line each, on stderr; or its
  colored layout, or its JSON (``--log.format``). The library's own ``logging`` records go
  through the same ``Log`` (``LogHandler``), so one command writes one format.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import time
import unicodedata
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_NUMERIC = re.compile(r"^-?(?:\d{1,3}(?:,\d{3})*|\d+)(?:\.\d+)?$")


def _width(s: str) -> int:
    if s.isascii():  # every ASCII character is one column: no per-character lookups
        return len(s)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _is_num_or_space(c: str) -> bool:
    return c == " " or c.isdigit()


def header_title(name: str) -> str:
    """tablewriter's header transform: '_' and word-joining '.' become spaces, upper case."""
    chars = list(name)
    for i, c in enumerate(chars):
        if c == "_":
            chars[i] = " "
        elif c == "." and ((i != 0 and not _is_num_or_space(chars[i - 1]))
                           or (i != len(chars) - 1 and not _is_num_or_space(chars[i + 1]))):
            chars[i] = " "
    out = "".join(chars).strip()
    if not out and name:
        out = " "
    return out.upper()


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    titles = [header_title(h) for h in headers]
    widths = [_width(t) for t in titles]
    for row in rows:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], _width(text))
    border = "+" + "+".join("-" * (w + 2) for w in widths) + "+\n"

    def centre(s: str, w: int) -> str:
        gap = w - _width(s)
        left = gap // 2
        return " " * left + s + " " * (gap - left)

    def cell(s: str, w: int) -> str:
        pad = " " * (w - _width(s))
        return pad + s if _NUMERIC.match(s) else s + pad

    out = [border, "| " + " | ".join(centre(t, w) for t, w in zip(titles, widths, strict=True))
           + " |\n", border]
    for row in rows:
        out.append("| " + " | ".join(cell(c, w) for c, w in zip(row, widths, strict=True))
                   + " |\n")
    out.append(border)
    return "".join(out)


_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def ibytes(n: int) -> str:
    """go-humanize IBytes: '43 B', '2.3 KiB', '15 MiB'."""
    if n < 10:
        return f"{n} B"
    e = int(math.floor(math.log(n) / math.log(1024)))
    val = math.floor(n / 1024**e * 10 + 0.5) / 10
    return (f"{val:.1f} {_IEC[e]}" if val < 10 else f"{val:.0f} {_IEC[e]}")


_DAY = 86400
_WEEK = 7 * _DAY
_MONTH = 30 * _DAY
_YEAR = 12 * _MONTH
_MAGNITUDES: list[tuple[float, str, int]] = [
    (1, "now", 1),
    (2, "1 second %s", 1),
    (60, "%d seconds %s", 1),
    (120, "1 minute %s", 1),
    (3600, "%d minutes %s", 60),
    (7200, "1 hour %s", 1),
    (_DAY, "%d hours %s", 3600),
    (2 * _DAY, "1 day %s", 1),
    (_WEEK, "%d days %s", _DAY),
    (2 * _WEEK, "1 week %s", 1),
    (_MONTH, "%d weeks %s", _WEEK),
    (2 * _MONTH, "1 month %s", 1),
    (_YEAR, "%d months %s", _MONTH),
    (18 * _MONTH, "1 year %s", 1),
    (2 * _YEAR, "2 years %s", 1),
    (37 * _YEAR, "%d years %s", _YEAR),
    (math.inf, "a long while %s", 1),
]


def reltime(then: float, now: float | None = None) -> str:
    """go-humanize Time: '8 minutes ago', '1 minute ago', '3 hours from now'."""
    now = time.time() if now is None else now
    label, diff = ("ago", now - then) if then <= now else ("from now", then - now)
    diff = int(diff)
    for limit, fmt, div in _MAGNITUDES:
        if diff < limit:
            if "%d" in fmt:
                return fmt % (diff // div, label)
            return fmt % label if "%s" in fmt else fmt
    raise AssertionError("unreachable")


def go_json(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fd, value in msg.ListFields():
        out[fd.name] = _go_value(fd, value)
    return out


def _go_value(fd: FieldDescriptor, value: Any) -> Any:
    if fd.is_repeated:
        return [_go_scalar(fd, v) for v in value]
    return _go_scalar(fd, value)


def _go_scalar(fd: FieldDescriptor, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return go_json(value)
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


def json_line(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


# --- logrus-style logging ---------------------------------------------------------------

LEVELS = {"debug": 10, "info": 20, "warn": 30, "warning": 30, "error": 40, "fatal": 50,
          "panic": 50, "trace": 5}
_TEXT = {5: "TRAC", 10: "DEBU", 20: "INFO", 30: "WARN", 40: "ERRO", 50: "FATA"}
_BARE = re.compile(r"^[A-Za-z0-9\-._/@^+]+$")


def _quote(v: Any) -> str:
    s = str(v)
    return s if _BARE.match(s) else json.dumps(s, ensure_ascii=False)


FORMATS = ("text", "json", "color")
# logrus's TextFormatter colours: gray for debug and trace, blue info, yellow warn, red above.
_COLOR = {5: 37, 10: 37, 20: 36, 30: 33, 40: 31, 50: 31}
_JSON_LEVEL = {5: "trace", 10: "debug", 20: "info", 30: "warning", 40: "error", 50: "fatal"}


class Log:
    """gazctl's log: logrus's text layout (``text``), its colored one (``color``), or its JSON
    (``json``: one object per line, ``level``, ``msg``, ``time`` and the fields)."""

    def __init__(self, stream: TextIO, level: str = "info", format: str = "text") -> None:
        if level.lower() not in LEVELS:
            raise ValueError(f"invalid log level {level!r} (want one of debug, info, warn, "
                             "error, fatal)")
        if format not in FORMATS:
            raise ValueError(f"invalid log format {format!r} (want one of text, json, color)")
        self.stream = stream
        self.level = LEVELS[level.lower()]
        self.format = format
        self._start = time.monotonic()

    def enabled(self, level: int) -> bool:
        return level >= self.level

    def emit(self, level: int, message: str, **fields: Any) -> None:
        if level < self.level:
            return
        level = max(k for k in _TEXT if k <= level) if level >= 5 else 5
        if self.format == "json":
            obj = {k: v if isinstance(v, (int, float, bool)) or v is None else str(v)
                   for k, v in fields.items()}
            obj.update(level=_JSON_LEVEL[level], msg=message,
                       time=datetime.now().astimezone().isoformat(timespec="seconds"))
            self.stream.write(json_line(obj))
        else:
            secs = int(time.monotonic() - self._start)
            if self.format == "color":
                color = _COLOR[level]
                line = f"\x1b[{color}m{_TEXT[level]}\x1b[0m[{secs:04d}] {message:<44} "
                line += "".join(f" \x1b[{color}m{k}\x1b[0m={_quote(v)}" for k, v in fields.items())
            else:
                line = f"{_TEXT[level]}[{secs:04d}] {message:<44} "
                line += "".join(f" {k}={_quote(v)}" for k, v in fields.items())
            self.stream.write(line.rstrip() + "\n")
        self.stream.flush()

    def debug(self, message: str, **fields: Any) -> None:
        self.emit(10, message, **fields)

    def info(self, message: str, **fields: Any) -> None:
        self.emit(20, message, **fields)

    def warn(self, message: str, **fields: Any) -> None:
        self.emit(30, message, **fields)

    def error(self, message: str, **fields: Any) -> None:
        self.emit(40, message, **fields)

    def fatal(self, message: str, **fields: Any) -> None:
        self.emit(50, message, **fields)


_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "taskName"}


class LogHandler(logging.Handler):
    """Routes the library's ``logging`` records through a gazctl ``Log``: same stream, level
    and format as gazctl's own lines; a record's ``extra`` becomes its fields, an exception
    its ``err`` field."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
            if record.exc_info and record.exc_info[1] is not None:
                fields["err"] = str(record.exc_info[1]) or type(record.exc_info[1]).__name__
            self.log.emit(record.levelno, record.getMessage(), **fields)
        except Exception:  # logging must not fail the command
            self.handleError(record)

"""``gazctl attach-uuids``: give each input line a fresh message UUID, as Gazette's does.

Invariants:
- One run is one producer: a new random ``ProducerID`` (gazette.message.uuid), and one
  ``Clock`` started at the wall time, ticked once per line and moved forward to the wall
  time at most every 100 ms. UUIDs are flagged ``OUTSIDE_TXN`` (committed: readers
  process them at once), so within a run every UUID is distinct and their clocks strictly
  increase in output order.
- Lines are read like Go's ``bufio.Scanner``: the terminating ``\\n`` and one ``\\r``
  before it are not part of ``.Line``; a last line without a newline still counts (less a
  trailing ``\\r``); a line longer than ``--max-length`` bytes with its ``\\n``, or of
  ``--max-length`` bytes or more without one, is an error.
- ``--template`` is the subset of Go's text/template that attach-uuids needs: literal
  text, ``{{.UUID}}`` and ``{{.Line}}`` (spaces allowed), ``{{- `` / `` -}}`` trim
  markers and ``{{/* comments */}}``. Anything else is refused before input is read.
  Lines are bytes in and bytes out: input need not be UTF-8.
- Output is flushed after every line when reading a stream (a pipe or terminal), so
  records flow through ``attach-uuids | journals append`` as they arrive.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Final

from gazette.errors import GazetteError
from gazette.message.uuid import OUTSIDE_TXN, Clock, build_uuid, new_producer_id

DEFAULT_TEMPLATE: Final = "{{.UUID}},{{.Line}}\n"
DEFAULT_MAX_LENGTH: Final = 4 * 1024 * 1024
_UPDATE_NS: Final = 100_000_000  # How often the clock is moved up to the wall time.

# An action: "{{", optional "- " trim, the body, optional " -" trim, "}}".
_ACTION = re.compile(r"\{\{(-[ \t\r\n])?(.*?)([ \t\r\n]-)?\}\}", re.S)
_FIELD = re.compile(r"\s*\.(UUID|Line)\s*")
_COMMENT = re.compile(r"\s*/\*.*?\*/\s*", re.S)
_SPACE = b" \t\r\n"


class UUIDTemplateError(GazetteError, ValueError):
    pass


@dataclass(frozen=True)
class Template:
    """A compiled template: literal byte pieces around field references."""

    #: Alternating literals and fields: parts[0] literal, parts[1] field, parts[2] literal...
    parts: tuple[bytes | str, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        parts: list[bytes | str] = []
        literal = b""
        pos = 0
        trim_next = False
        for m in _ACTION.finditer(text):
            chunk = text[pos:m.start()].encode()
            if trim_next:
                chunk = chunk.lstrip(_SPACE)
            if m.group(1):
                chunk = chunk.rstrip(_SPACE)
            literal += chunk
            body = m.group(2)
            field = _FIELD.fullmatch(body)
            if field is not None:
                parts += [literal, field.group(1)]
                literal = b""
            elif not _COMMENT.fullmatch(body):
                col = m.start() + 1
                raise UUIDTemplateError(
                    f"template: col {col}: unsupported action {m.group(0)!r} (attach-uuids "
                    "templates may use {{.UUID}} and {{.Line}})")
            trim_next = bool(m.group(3))
            pos = m.end()
        rest = text[pos:]
        if "{{" in rest:
            raise UUIDTemplateError(f"template: col {pos + rest.index('{{') + 1}: unclosed action")
        tail = rest.encode()
        literal += tail.lstrip(_SPACE) if trim_next else tail
        parts.append(literal)
        return cls(tuple(parts))

    def render(self, uuid_text: bytes, line: bytes) -> bytes:
        out: list[bytes] = []
        for part in self.parts:
            if isinstance(part, bytes):
                out.append(part)
            else:
                out.append(uuid_text if part == "UUID" else line)
        return b"".join(out)


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--template", default=DEFAULT_TEMPLATE,
                   help="Go text/template for output (default '{{.UUID}},{{.Line}}\\n'; "
                        "use $'..' in a shell for newline escapes)")
    p.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH,
                   help="Maximum allowed byte-length of an input line")
    p.add_argument("--skip-header", action="store_true",
                   help="Omit the first line of each input file")
    p.add_argument("paths", nargs="*", metavar="/path/to/file",
                   help="Input files (stdin if none)")


DESCRIPTION: Final = """\
For each line of each argument input file, generate a RFC 4122 v1 compatible UUID and,
using the --template, combine it with the input line into output written to stdout.
If no input file arguments are given, stdin is read instead.

Exactly-once processing requires that messages carry a v1 UUID authored by Gazette,
encoding a unique producer ID, a monotonic Clock and transaction flags. The UUIDs are
flagged as committed (outside of a transaction): readers process them immediately.
Each run uses a new random producer ID, which readers track (a little state each), so
combine many small files into few large ones before attaching UUIDs. When preparing
files, attach UUIDs into new temporary files and append those, so that a restarted
append does not produce new UUIDs for the same records.

Templates support literal text, {{.UUID}} and {{.Line}}, with Go's {{- -}} trimming.

Prefix CSV rows with a UUID (the default --template):
  gazctl attach-uuids inputOne.csv inputTwo.csv
Skip an initial header row of each input:
  gazctl attach-uuids --skip-header inputOne.csv inputTwo.csv
Postfix CSV rows with a UUID:
  gazctl attach-uuids input.csv --template=$'{{.Line}},{{.UUID}}\\n'
Wrap JSON inputs with a UUID:
  gazctl attach-uuids input.json --template=$'{"uuid": "{{.UUID}}","record":{{.Line}}}\\n'
"""


class LineTooLong(GazetteError, ValueError):
    pass


def scan_lines(f: IO[bytes], max_length: int) -> Iterator[bytes]:
    """Lines of ``f`` without their terminator, as Go's bufio.Scanner(ScanLines)."""
    while True:
        raw = f.readline(max_length)
        if not raw:
            return
        if len(raw) >= max_length and not (len(raw) == max_length and raw.endswith(b"\n")):
            raise LineTooLong(f"token too long: a line is longer than --max-length "
                              f"({max_length} bytes)")
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):  # ScanLines drops one CR, also from a last unended line.
            raw = raw[:-1]
        yield raw


def _is_stream(f: IO[bytes]) -> bool:
    try:
        return not stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # BytesIO and friends: not a stream.
        return False


def attach(template: Template, inputs: list[IO[bytes]], out: IO[bytes], *,
           max_length: int = DEFAULT_MAX_LENGTH, skip_header: bool = False,
           clock: Clock | None = None) -> int:
    """Writes every line of ``inputs`` with a new UUID; returns how many lines."""
    producer = new_producer_id()
    if clock is None:
        clock = Clock.now()
    updated = time.monotonic_ns()
    count = 0
    for f in inputs:
        flush = _is_stream(f)
        lines = scan_lines(f, max_length)
        if skip_header:
            next(lines, None)
        for line in lines:
            mono = time.monotonic_ns()
            if mono - updated >= _UPDATE_NS:
                clock.update(time.time_ns())
                updated = mono
            uuid = build_uuid(producer, clock.tick(), OUTSIDE_TXN)
            out.write(template.render(str(uuid).encode(), line))
            count += 1
            if flush:
                out.flush()
    out.flush()
    return count

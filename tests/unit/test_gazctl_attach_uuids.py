"""gazctl attach-uuids: templates, line scanning (as Go's bufio.Scanner), and the UUIDs
(Gazette's layout: one producer per run, committed flags, strictly increasing clocks)."""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.cli.gazctl import main
from gazette.cli.gazctl.attach_uuids import (
    LineTooLong,
    Template,
    UUIDTemplateError,
    attach,
    scan_lines,
)
from gazette.message.uuid import OUTSIDE_TXN, Clock, get_clock, get_flags, get_producer_id


def run(*argv: str, stdin: bytes = b"") -> tuple[int, bytes, str]:
    out, err = io.BytesIO(), io.StringIO()
    code = main(["attach-uuids", *argv], stdin=io.BytesIO(stdin), stdout=out, stderr=err,
                env={"HOME": "/nonexistent"})
    return code, out.getvalue(), err.getvalue()


def split_default(out: bytes) -> list[tuple[uuid.UUID, bytes]]:
    rows = []
    for line in out.splitlines():
        u, _, rest = line.partition(b",")
        rows.append((uuid.UUID(u.decode()), rest))
    return rows


# --- templates ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "want"), [
    ("{{.UUID}},{{.Line}}\n", b"U,L\n"),
    ("{{.Line}},{{.UUID}}\n", b"L,U\n"),
    ('{"uuid": "{{ .UUID }}","record":{{.Line}}}\n', b'{"uuid": "U","record":L}\n'),
    ("a  {{- .Line -}}  b", b"aLb"),
    ("a \n{{- /* a comment */ -}}\n b{{.Line}}", b"abL"),
    ("{{/* only */}}x", b"x"),
    ("no actions", b"no actions"),
    ("{{.Line}}{{.Line}}", b"LL"),
])
def test_template_rendering(text: str, want: bytes) -> None:
    assert Template.parse(text).render(b"U", b"L") == want


@pytest.mark.parametrize("text", ["{{.Foo}}", "{{printf \"%s\" .Line}}", "{{.Line", "x{{ }}",
                                  "{{.Line | html}}"])
def test_unsupported_templates_are_refused(text: str) -> None:
    with pytest.raises(UUIDTemplateError):
        Template.parse(text)
    code, out, err = run("--template", text, stdin=b"line\n")
    assert code == 1 and out == b"" and err.startswith("FATA") and "--template" in err


# --- scanning -----------------------------------------------------------------------------

def go_scan(data: bytes, max_length: int) -> list[bytes] | None:
    """A model of bufio.Scanner(ScanLines) with Buffer(nil, max_length): None on ErrTooLong."""
    lines, pos = [], 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        if end - pos > max_length or (nl < 0 and end - pos >= max_length):
            return None
        line = data[pos:nl if nl >= 0 else end]
        lines.append(line[:-1] if line.endswith(b"\r") else line)  # dropCR
        pos = end
    return lines


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"xyz", b"\r\n"]), max_size=30),
       st.integers(min_value=1, max_value=8))
def test_scan_lines_is_go_scanner(parts: list[bytes], max_length: int) -> None:
    data = b"".join(parts)
    want = go_scan(data, max_length)
    if want is None:
        with pytest.raises(LineTooLong):
            list(scan_lines(io.BytesIO(data), max_length))
    else:
        assert list(scan_lines(io.BytesIO(data), max_length)) == want


def test_max_length_flag() -> None:
    code, out, err = run("--max-length", "4", stdin=b"abc\nabcd\n")
    assert code == 1 and "token too long" in err
    assert len(split_default(out)) == 1  # Lines before the long one were written.


# --- UUIDs --------------------------------------------------------------------------------

def test_uuids_of_one_run_share_a_producer_and_increase() -> None:
    before = time.time_ns()
    code, out, err = run(stdin=b"".join(b"row,%d\n" % i for i in range(500)))
    assert code == 0, err
    rows = split_default(out)
    assert [r for _, r in rows] == [b"row,%d" % i for i in range(500)]
    producers = {get_producer_id(u) for u, _ in rows}
    assert len(producers) == 1
    (producer,) = producers
    assert producer[0] & 0x01  # Random node ids set the multicast bit.
    clocks = [get_clock(u) for u, _ in rows]
    assert all(a < b for a, b in zip(clocks, clocks[1:], strict=False))
    assert all(u.version == 1 and u.variant == uuid.RFC_4122 for u, _ in rows)
    assert all(get_flags(u) == OUTSIDE_TXN for u, _ in rows)
    # The clock is the wall time (give or take the ticks).
    assert Clock(clocks[0]).as_time() >= before - 1000
    assert Clock(clocks[0]).as_time() <= time.time_ns()

    _, again, _ = run(stdin=b"row\n")
    assert get_producer_id(split_default(again)[0][0]) != producer  # A new producer per run.


def test_clock_ticks_from_a_given_start() -> None:
    out = io.BytesIO()
    clock = Clock(1 << 40)
    attach(Template.parse("{{.UUID}}\n"), [io.BytesIO(b"a\nb\n")], out, clock=clock)
    got = [get_clock(uuid.UUID(line.decode())) for line in out.getvalue().splitlines()]
    assert got == [(1 << 40) + 160, (1 << 40) + 320]  # One microsecond per tick, as Gazette.


def test_files_skip_header_and_json_template(tmp_path: Path) -> None:
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_bytes(b'"header"\n{"a": 1}\n{"a": 2}\n')
    two.write_bytes(b'"header"\n{"b": "\xc3\xa9"}')  # No final newline; UTF-8 passes through.
    code, out, err = run("--skip-header", str(one), str(two),
                         "--template", '{"uuid": "{{.UUID}}","record":{{.Line}}}\n')
    assert code == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["record"] for d in docs] == [{"a": 1}, {"a": 2}, {"b": "é"}]
    assert len({get_producer_id(uuid.UUID(d["uuid"])) for d in docs}) == 1

    code, out, err = run(str(one), str(tmp_path / "missing"))
    assert code == 1 and out == b"" and "missing" in err  # Inputs are opened up front.


def test_non_utf8_lines_pass_through() -> None:
    code, out, err = run("--template", "{{.Line}}|{{.UUID}}\n", stdin=b"\xff\xfe\r\n")
    assert code == 0, err
    line, _, u = out.rstrip(b"\n").partition(b"|")
    assert line == b"\xff\xfe" and uuid.UUID(u.decode()).version == 1

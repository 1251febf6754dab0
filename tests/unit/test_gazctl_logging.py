"""gazctl's logging flags: ``--log.format`` (text, json, color) and ``--log.level`` apply to
gazctl's own lines and to the library's ``logging`` records; ``--version``; ``python -m``."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import gazette
from gazette._compiled import build_line
from gazette.cli.gazctl import main
from gazette.cli.gazctl.output import Log, LogHandler

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = {"HOME": "/nonexistent", "BROKER_ADDRESS": "http://127.0.0.1:1"}


def _gazctl(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    err = io.StringIO()
    code = main(list(argv), stdin=io.BytesIO(), stdout=io.BytesIO(), stderr=err,
                env={**UNREACHABLE, **(env or {})})
    return code, err.getvalue()


def test_json_format_is_one_object_per_line() -> None:
    code, err = _gazctl("journals", "list", "--log.format", "json")
    assert code == 1
    (line,) = err.splitlines()
    obj = json.loads(line)
    assert obj["level"] == "fatal" and obj["msg"] == "failed to list journals"
    assert "UNAVAILABLE" in obj["err"] and obj["time"][:2] == "20"


def test_format_and_level_from_the_environment() -> None:
    code, err = _gazctl("journals", "list", env={"LOG_FORMAT": "json", "LOG_LEVEL": "error"})
    assert code == 1 and json.loads(err)["level"] == "fatal"
    code, err = _gazctl("journals", "list", env={"LOG_FORMAT": "yaml"})
    assert code == 1 and err == "gazctl: invalid log format 'yaml' (want one of text, json, color)\n"


def test_color_format_colors_the_level_and_the_keys() -> None:
    code, err = _gazctl("journals", "list", "--log.format", "color")
    assert code == 1
    assert err.startswith("\x1b[31mFATA\x1b[0m[0000] failed to list journals")
    assert "\x1b[31merr\x1b[0m=" in err


def test_library_records_go_through_gazctls_format_at_its_level() -> None:
    # asyncio.run's loop logs its selector at DEBUG: a library record, shown only at debug.
    code, err = _gazctl("journals", "list", "--log.format", "json", "--log.level", "debug")
    assert code == 1
    records = [json.loads(line) for line in err.splitlines()]
    assert any(r["level"] == "debug" and r["msg"].startswith("Using selector") for r in records)
    code, err = _gazctl("journals", "list", "--log.format", "json")
    assert [json.loads(line)["level"] for line in err.splitlines()] == ["fatal"]
    # main leaves the process's logging as it found it
    assert LogHandler not in {type(h) for h in logging.getLogger().handlers}


def test_a_records_extra_fields_and_exception_become_fields() -> None:
    out = io.StringIO()
    handler = LogHandler(Log(out, "info"))
    logger = logging.getLogger("gazette.test_gazctl_logging")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.debug("not shown")
        logger.warning("route changed", extra={"journal": "a/b", "brokers": 3})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("append failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("WARN[0000] route changed") and lines[0].endswith(" journal=a/b brokers=3")
    assert lines[1].startswith("ERRO[0000] append failed") and lines[1].endswith("err=boom")


def test_version_and_python_dash_m() -> None:
    # The gazette under test (the checkout's, or an installed build's) is the children's too.
    env = {**os.environ, "PYTHONPATH": str(Path(gazette.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-m", "gazette.cli.gazctl", "--version"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out == f"gazctl {gazette.__version__}; {build_line()}\n"
    for args in (["-m", "gazette", "--version"], ["-m", "gazette", "--help"]):
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gazette") and "consume" in done.stdout

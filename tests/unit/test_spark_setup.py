"""The Spark source's options, set-up checks and progress line, without starting Spark."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gazette.spark.errors import OptionError, SetupError
from gazette.spark.options import Mode, parse_options
from gazette.spark.plan import JournalSlice, Segment, balance, segments_of
from gazette.spark.session import Progress, check_java


def test_options_are_checked_and_named() -> None:
    opts = parse_options({"selector": "prefix=a/", "MODE": "Committed", "end_offset": '{"a/b": 10}',
                          "begin_mod_time": "2026-01-01T00:00:00+00:00"})
    assert opts.mode is Mode.COMMITTED and opts.end_of("a/b", 100) == 10
    assert opts.end_of("a/c", 100) == 100 and opts.begin_mod_time == 1767225600
    for bad, match in [({}, "option 'selector': is required"),
                       ({"selector": "prefix=a/", "colour": "x"}, "'colour': is not an option"),
                       ({"selector": "prefix=a/", "end_offset": "[1]"}, "'end_offset'"),
                       ({"selector": "prefix=a/", "block_bytes": "12"}, "at least 1024"),
                       ({"selector": "a in (", }, "'selector'")]:
        with pytest.raises(OptionError, match=match):
            parse_options(bad)


def test_missing_java_is_a_setup_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SetupError, match="Spark needs Java 17 or newer .*has no bin/java"):
        check_java()


def _frag(begin: int, end: int, url: str = "", store: str = "file:///", mod: int = 100) -> Any:
    return SimpleNamespace(spec=SimpleNamespace(begin=begin, end=end, backing_store=store,
                                                mod_time=mod, compression_codec=0),
                           signed_url=url)


def test_planning_reads_each_byte_once_from_stores_where_it_can() -> None:
    frags = [_frag(0, 100, "file:///j/a"), _frag(0, 250, "file:///j/big"),
             _frag(100, 250, "file:///j/b"), _frag(250, 300, "", store="")]
    segs = segments_of(frags, 0, 300, 0, "/root")
    assert [(s.begin, s.end, s.url) for s in segs] == [(0, 250, "file:///j/big"), (250, 300, "")]
    # Without the file root, file:// fragments are read through the brokers.
    assert all(s.url == "" for s in segments_of(frags, 0, 300, 0, None))
    # begin_mod_time skips old persisted fragments, never content not yet persisted.
    old = [_frag(0, 100, "file:///a", mod=5), _frag(100, 200, "file:///b", mod=50),
           _frag(200, 210, "", store="", mod=0)]
    assert [(s.begin, s.end) for s in segments_of(old, 0, 210, 10, "/r")] == [(100, 200), (200, 210)]
    # A read from the middle starts mid-fragment.
    assert [(s.begin, s.fragment_begin) for s in segments_of(frags, 120, 300, 0, "/r")][0] == (120, 0)


def test_balance_splits_on_fragment_boundaries() -> None:
    segs = tuple(Segment(i * 10, i * 10 + 10, i * 10, i * 10 + 10, 0) for i in range(10))
    sl = JournalSlice("a/b", "application/x-ndjson", 0, 100, segs)
    opts = parse_options({"selector": "prefix=a/", "partition_bytes": "30"})
    parts = balance([sl], opts)
    assert [(p.begin, p.end) for p in parts] == [(0, 30), (30, 60), (60, 90), (90, 100)]
    committed = parse_options({"selector": "prefix=a/", "partition_bytes": "30", "mode": "committed"})
    assert balance([sl], committed) == [sl]


def test_progress_line_counts_tasks_and_estimates_time_left() -> None:
    info = SimpleNamespace(numTasks=10, numCompletedTasks=4, numActiveTasks=2)
    tracker = SimpleNamespace(getActiveStageIds=lambda: [3], getStageInfo=lambda _: info)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: tracker))
    progress = Progress(spark)  # type: ignore[arg-type]
    progress._seen[3] = 0.0  # The stage began at monotonic time 0: ETA is from its rate.
    line = progress.line()
    assert line is not None and line.startswith("stage 3: 4/10 tasks (2 running, about ")

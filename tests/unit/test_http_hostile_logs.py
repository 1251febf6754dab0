"""Lines about clients cannot be weaponised: clipped, at most 1 KiB, rate-limited, counted
when dropped, never a traceback (``gazette.server.logs``), and the gRPC edge's line per failed
call goes through the same bucket."""

from __future__ import annotations

import logging

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.server import edge
from gazette.server.logs import MAX_LINE, ClientLog, EveryInterval, TokenBucket, clip
from gazette.server.logs import _TextFormatter as TextFormatter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(st.one_of(st.binary(max_size=5000), st.text(max_size=5000)), st.integers(20, 400))
def test_clip_is_bounded_and_printable(value: bytes | str, limit: int) -> None:
    out = clip(value, limit)
    assert len(out) <= limit and out.isprintable()
    if len(out) < len(str(value)) or isinstance(value, bytes):
        assert out == clip(value, limit)  # deterministic


def test_clip_says_how_much_it_cut() -> None:
    assert clip(b"a" * 1000, 40).endswith("...(+976)")
    assert clip("short") == "short"
    assert clip("line\nbreak") == "line\\nbreak"


def test_token_bucket() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now = 0.5
    assert bucket.take() and not bucket.take()
    clock.now = 100
    assert sum(bucket.take() for _ in range(10)) == 3  # refills up to the burst only
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


def test_client_log_is_rate_limited_bounded_and_counts_what_it_drops(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    logger = logging.getLogger("test.clientlog")
    lines = ClientLog(logger, rate=1, burst=5, clock=clock)
    huge = b"\x00" * (4 << 20)
    with caplog.at_level(logging.INFO, logger="test.clientlog"):
        for _ in range(10_000):
            lines.note("bad request " + "x" * 5000, data=huge, a=huge, b=huge, c=huge, d=huge, e=huge, f=huge)
        clock.now = 1.0
        assert lines.note("again")
    recs = [r for r in caplog.records if r.name == "test.clientlog"]
    assert len(recs) == 6
    assert recs[-1].dropped == str(10_000 - 5)
    fmt = TextFormatter()
    for rec in recs:
        assert rec.exc_info is None
        assert len(fmt.format(rec)) <= MAX_LINE


def test_every_interval_logs_first_then_counts() -> None:
    clock = Clock()
    logger = logging.getLogger("test.interval")
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    try:
        lines = EveryInterval(logger, "accept failed", interval=10, clock=clock)
        assert lines.event() and not any(lines.event() for _ in range(500))
        clock.now = 10
        assert lines.event(3)
        assert [r.count for r in got] == ["1", "503"]
        assert lines.total == 504
    finally:
        logger.handlers.clear()


def test_the_grpc_edge_line_per_failed_call_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=edge.log.name):
        for _ in range(5000):
            edge._note("Append", ValueError("garbage " + "z" * 10_000), grpc.StatusCode.INVALID_ARGUMENT)
    recs = [r for r in caplog.records if r.name == edge.log.name]
    assert 1 <= len(recs) <= edge._ENDINGS.bucket.burst + 1
    assert all(len(r.err) <= 140 for r in recs)

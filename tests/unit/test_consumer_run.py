"""``gazette consume`` / ``run_consumer``: a bad process id names its flag, and a process ended
by an expected error (a lost lease) exits with one line, not a traceback."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import gazette.consumer.run as run_mod
from gazette.allocator import AnnouncementLostError
from gazette.consumer.run import config_from_args, consumer_parser


def _config(*argv: str) -> Any:
    return config_from_args(consumer_parser(None, "test").parse_args(list(argv)))


def test_a_bad_consumer_id_names_the_flag_and_value() -> None:
    with pytest.raises(SystemExit) as info:
        _config("--consumer.id", "ab")
    assert str(info.value) == ("gazette: invalid --consumer.id 'ab': "
                               "invalid length (2; expected 4 <= length <= 128)")
    with pytest.raises(SystemExit, match=r"^gazette: invalid --consumer.zone 'a b': "):
        _config("--consumer.zone", "a b")
    assert _config("--consumer.id", "good-id").suffix == "good-id"
    assert len(_config().suffix) >= 4  # none given: a random one


def test_a_lost_lease_ends_the_process_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    async def lose_lease(config: Any, app: Any) -> None:
        # As MemberProcess.run's task group raises it when the keep-alive finds the lease gone.
        raise ExceptionGroup("unhandled errors in a TaskGroup", [
            AnnouncementLostError("lease 7 of member key '/app/members/local#cons' expired")])

    monkeypatch.setattr(run_mod, "_consume", lose_lease)
    ns = consumer_parser(None, "test").parse_args(["--consumer.id", "cons-0"])
    with caplog.at_level(logging.ERROR, logger="gazette"):
        assert run_mod.run(object(), ns) == 1  # type: ignore[arg-type]
    [record] = [r for r in caplog.records if r.name == "gazette"]
    assert record.getMessage() == ("gazette: consumer stopped: AnnouncementLostError: lease 7 of "
                                   "member key '/app/members/local#cons' expired")
    assert record.exc_info is None and "\n" not in record.getMessage()


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    async def bug(config: Any, app: Any) -> None:
        raise ExceptionGroup("unhandled errors in a TaskGroup", [
            AnnouncementLostError("lost"), KeyError("oops")])

    monkeypatch.setattr(run_mod, "_consume", bug)
    ns = consumer_parser(None, "test").parse_args([])
    with pytest.raises(ExceptionGroup):
        run_mod.run(object(), ns)  # type: ignore[arg-type]

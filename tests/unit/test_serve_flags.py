"""`gazette serve` flags: Gazette's names, environment variables and refusals."""

from __future__ import annotations

import pytest

from gazette.cli.serve import build_parser, config_from_args


def _config(argv: list[str]):  # type: ignore[no-untyped-def]
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_append_rate_flags_and_defaults() -> None:
    cfg = _config(["--broker.id", "broker-one"])
    assert (cfg.max_append_rate, cfg.min_append_rate) == (0, 1 << 16)
    cfg = _config(["--broker.id", "broker-one", "--broker.max-append-rate", "1000000",
                   "--broker.min-append-rate", "4096"])
    assert (cfg.max_append_rate, cfg.min_append_rate) == (1_000_000, 4096)


def test_append_rate_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_MAX_APPEND_RATE", "123456")
    monkeypatch.setenv("BROKER_MIN_APPEND_RATE", "0")
    cfg = _config(["--broker.id", "broker-one"])
    assert (cfg.max_append_rate, cfg.min_append_rate) == (123456, 0)


@pytest.mark.parametrize("flag,value", [("--broker.max-append-rate", "-1"), ("--broker.min-append-rate", "fast")])
def test_bad_append_rates_are_refused(flag: str, value: str) -> None:
    with pytest.raises(SystemExit, match=flag.lstrip("-")):
        _config(["--broker.id", "broker-one", flag, value])

"""`gazette serve` flags: Gazette's names, environment variables and refusals; the start-up
warning when authorization is off on a reachable address."""

from __future__ import annotations

import pytest

from gazette.auth import NO_AUTH, KeyedAuth
from gazette.cli.serve import build_parser, config_from_args
from gazette.server.process import is_loopback, warn_if_open


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


def test_auto_suspend_is_a_switch_and_the_health_interval_a_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(["--broker.id", "broker-one"])
    assert (cfg.auto_suspend, cfg.health_interval) == (False, 60.0)
    cfg = _config(["--broker.id", "broker-one", "--broker.auto-suspend", "--broker.health-interval", "250ms"])
    assert (cfg.auto_suspend, cfg.health_interval) == (True, 0.25)
    monkeypatch.setenv("BROKER_AUTO_SUSPEND", "true")
    assert _config(["--broker.id", "broker-one"]).auto_suspend is True
    monkeypatch.setenv("BROKER_AUTO_SUSPEND", "0")
    assert _config(["--broker.id", "broker-one"]).auto_suspend is False


@pytest.mark.parametrize("value", ["0s", "soon"])
def test_a_bad_health_interval_is_refused(value: str) -> None:
    with pytest.raises(SystemExit, match="broker.health-interval"):
        _config(["--broker.id", "broker-one", "--broker.health-interval", value])


# --- the operator's warning: authorization off on a reachable address ---------------------------


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
                                           ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                           ("", False), ("::", False), ("10.1.2.3", False),
                                           ("broker.example", False)])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_access_on_a_reachable_address_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="gazette.server.process"):
        assert warn_if_open("broker", "0.0.0.0", NO_AUTH)
    [rec] = caplog.records
    assert rec.levelname == "WARNING"
    msg = rec.getMessage()
    for what in ("authorization off", "--auth-keys", "Apply", "delete", "Replicate"):
        assert what in msg
    caplog.clear()
    with caplog.at_level("INFO", logger="gazette.server.process"):
        assert warn_if_open("consumer", "", KeyedAuth("AA== c2VjcmV0LWtleS1vZi1hdC1sZWFzdC0zMi1ieXRlcyE="))
    assert "AA==" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("host,keys", [("127.0.0.1", ""), ("::1", ""),
                                       ("0.0.0.0", "c2VjcmV0LWtleS1vZi1hdC1sZWFzdC0zMi1ieXRlcyE=")])
def test_no_warning_on_loopback_or_with_keys(caplog: pytest.LogCaptureFixture, host: str, keys: str) -> None:
    verifier = KeyedAuth(keys) if keys else NO_AUTH
    with caplog.at_level("INFO", logger="gazette.server.process"):
        assert not warn_if_open("broker", host, verifier)
    assert not [r for r in caplog.records if r.name == "gazette.server.process"]


def test_bad_auth_keys_exit_naming_the_flag() -> None:
    with pytest.raises(SystemExit, match="auth-keys"):
        _config(["--broker.id", "broker-one", "--auth-keys", "not base64!"])


@pytest.mark.parametrize("address", ["ftp://etcd.example:2379", "http://host:port", "https://etcd.example"])
def test_an_unusable_etcd_address_exits_naming_the_flag(address: str) -> None:
    with pytest.raises(SystemExit, match="--etcd.address"):
        _config(["--broker.id", "broker-one", "--etcd.address", address])


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    from gazette import __version__
    from gazette._compiled import build_line

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gazette {__version__}; {build_line()}"

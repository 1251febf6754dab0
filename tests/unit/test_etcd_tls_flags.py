"""The etcd TLS flags of ``gazette serve`` and ``gazette consume`` (Gazette's names and
environment variables), their checks at start-up (one line naming the flag), and how a
failed TLS handshake is told apart from etcd being down."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import trustme

from gazette.cli.serve import build_parser, config_from_args
from gazette.consumer import run as consumer_run
from gazette.etcd.client import EtcdTLSError, tls_failure
from gazette.rpc.tls import ClientTLS


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    client = ca.issue_cert("client.example")
    other = trustme.CA().issue_cert("other.example")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    other.private_key_pem.write_to_path(str(d / "other.key"))
    (d / "garbage.pem").write_text("not a certificate\n")
    return {"ca": str(d / "ca.pem"), "cert": str(d / "client.pem"), "key": str(d / "client.key"),
            "other_key": str(d / "other.key"), "garbage": str(d / "garbage.pem"), "missing": str(d / "nope.pem")}


@pytest.fixture(autouse=True)
def _no_etcd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags default to these variables: the runner's own must not leak in."""
    for var in ("ETCD_ADDRESS", "ETCD_CERT_FILE", "ETCD_CERT_KEY_FILE", "ETCD_TRUSTED_CA_FILE"):
        monkeypatch.delenv(var, raising=False)


def _serve(argv: list[str]) -> Any:
    return config_from_args(build_parser().parse_args(["serve", "--broker.id", "broker-one", *argv]))


def _consume(argv: list[str]) -> Any:
    return consumer_run.config_from_args(consumer_run.consumer_parser(None, "test").parse_args(argv))


@pytest.mark.parametrize("config", [_serve, _consume])
def test_https_with_a_certificate_and_ca(config: Any, files: dict[str, str]) -> None:
    cfg = config(["--etcd.address", "https://etcd.example:2379", "--etcd.cert-file", files["cert"],
                  "--etcd.cert-key-file", files["key"], "--etcd.trusted-ca-file", files["ca"]])
    assert cfg.etcd_tls == ClientTLS(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"])


@pytest.mark.parametrize("config", [_serve, _consume])
def test_https_without_files_uses_the_system_roots_and_http_has_no_tls(config: Any) -> None:
    assert config(["--etcd.address", "https://etcd.example:2379"]).etcd_tls == ClientTLS()
    assert config(["--etcd.address", "http://etcd.example:2379"]).etcd_tls is None


def test_flags_default_to_gazettes_environment_variables(monkeypatch: pytest.MonkeyPatch,
                                                         files: dict[str, str]) -> None:
    monkeypatch.setenv("ETCD_ADDRESS", "https://etcd.example:2379")
    monkeypatch.setenv("ETCD_CERT_FILE", files["cert"])
    monkeypatch.setenv("ETCD_CERT_KEY_FILE", files["key"])
    monkeypatch.setenv("ETCD_TRUSTED_CA_FILE", files["ca"])
    for cfg in (_serve([]), _consume([])):
        assert cfg.etcd_address == "https://etcd.example:2379"
        assert cfg.etcd_tls == ClientTLS(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"])


@pytest.mark.parametrize("argv,flag,says", [
    # TLS files for a plaintext endpoint: refused rather than silently dialled in plaintext.
    (["--etcd.address", "http://etcd.example:2379", "--etcd.trusted-ca-file", "{ca}"],
     "--etcd.trusted-ca-file", "not https://"),
    (["--etcd.cert-file", "{cert}", "--etcd.cert-key-file", "{key}"], "--etcd.cert-file", "not https://"),
    (["--etcd.address", "https://e:2379", "--etcd.trusted-ca-file", "{missing}"], "--etcd.trusted-ca-file",
     "no such file"),
    (["--etcd.address", "https://e:2379", "--etcd.trusted-ca-file", "{garbage}"], "--etcd.trusted-ca-file",
     "cannot load CA file"),
    (["--etcd.address", "https://e:2379", "--etcd.cert-file", "{cert}", "--etcd.cert-key-file", "{other_key}"],
     "--etcd.cert-file", "cannot load certificate"),
    (["--etcd.address", "https://e:2379", "--etcd.cert-file", "{missing}"], "--etcd.cert-file", "no such file"),
    (["--etcd.address", "https://e:2379", "--etcd.cert-key-file", "{key}"], "--etcd.cert-key-file",
     "no --etcd.cert-file"),
])
@pytest.mark.parametrize("config", [_serve, _consume])
def test_unusable_tls_settings_exit_with_one_line_naming_the_flag(
        config: Any, files: dict[str, str], argv: list[str], flag: str, says: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        config([a.format(**files) for a in argv])
    message = str(exit_.value.code)
    assert message.startswith(f"gazette: invalid {flag}") and says in message and "\n" not in message


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_a_failed_handshake_is_told_apart_from_etcd_being_down() -> None:
    refused = _rpc_error(grpc.StatusCode.UNAVAILABLE, (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: Tls handshake failed "
        "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:10000412:SSL routines:OPENSSL_internal:"
        "SSLV3_ALERT_BAD_CERTIFICATE: OK"))
    err = tls_failure("https://127.0.0.1:2379", refused)
    assert isinstance(err, EtcdTLSError) and not err.cut_short
    assert str(err) == ("etcd at https://127.0.0.1:2379: TLS handshake failed (SSLV3_ALERT_BAD_CERTIFICATE): "
                        "check --etcd.cert-file, --etcd.cert-key-file and --etcd.trusted-ca-file")
    down = _rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: "
                      "UNKNOWN: ipv4:127.0.0.1:2379: Failed to connect to remote host: Connection refused")
    assert tls_failure("https://127.0.0.1:2379", down) is None
    untrusted = _rpc_error(grpc.StatusCode.UNAVAILABLE, (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: Tls handshake failed "
        "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK"))
    assert "(CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate)" in str(
        tls_failure("https://127.0.0.1:2379", untrusted))
    assert tls_failure("https://127.0.0.1:2379", _rpc_error(grpc.StatusCode.INTERNAL, "handshake")) is None


class _Keyspace:
    """A keyspace whose first loads fail with ``errors``, then succeed."""

    revision = 0

    def __init__(self, *errors: grpc.aio.AioRpcError) -> None:
        self.errors = list(errors)
        self.loads = 0

    async def load(self, etcd: object) -> None:
        self.loads += 1
        if self.errors:
            raise self.errors.pop(0)


def _member(keyspace: _Keyspace) -> Any:
    from gazette.server.process import MemberProcess
    m = MemberProcess(zone="z", suffix="s", host="127.0.0.1", port=0, etcd_address="https://127.0.0.1:2379",
                      etcd_lease=5.0, keyspace=keyspace, is_consistent=lambda *a: True)  # type: ignore[arg-type]
    m._etcd = object()  # the fake keyspace never uses it
    return m


CUT_SHORT = ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:2379: "
             "Handshake read failed (Endpoint closing)")


async def test_a_handshake_cut_short_at_start_is_retried_and_a_refused_one_is_not() -> None:
    cut_short = tls_failure("https://127.0.0.1:2379", _rpc_error(grpc.StatusCode.UNAVAILABLE, CUT_SHORT))
    assert cut_short is not None and cut_short.cut_short
    cut = _Keyspace(*[_rpc_error(grpc.StatusCode.UNAVAILABLE, CUT_SHORT) for _ in range(2)])
    await _member(cut)._load_keyspace()  # etcd closed the first two handshakes: then it loads
    assert cut.loads == 3
    refused = _Keyspace(_rpc_error(grpc.StatusCode.UNAVAILABLE, (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: Tls handshake failed "
        "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:10000412:SSL routines:OPENSSL_internal:"
        "SSLV3_ALERT_BAD_CERTIFICATE: OK")))
    with pytest.raises(EtcdTLSError, match="SSLV3_ALERT_BAD_CERTIFICATE"):
        await _member(refused)._load_keyspace()
    assert refused.loads == 1  # refused at once: retrying will not help

"""etcd over TLS: a real etcd serving clients with mutual TLS (``--client-cert-auth``), a
``gazette serve`` broker dialling it with ``--etcd.cert-file``/``-cert-key-file``/
``-trusted-ca-file``, gazctl working through that broker, and a consumer process on the same
etcd; clients without a certificate
(or trusting another CA) are refused with an error that names what to fix.

Certificates are made by trustme: one CA signs etcd's (for 127.0.0.1) and the client's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aetcd.exceptions
import grpc
import pytest
import trustme
from consumer_support import CountingApp

from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.etcd import connect
from gazette.etcd.client import EtcdTLSError, tls_failure
from gazette.rpc.tls import ClientTLS, ServerTLS
from gazette.testing.cluster import BrokerStartError, Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.eventually import eventually_sync


@dataclass(frozen=True)
class PKI:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed neither certificate

    def client_tls(self, *, with_cert: bool = True) -> ClientTLS:
        if with_cert:
            return ClientTLS(str(self.ca), str(self.client_cert), str(self.client_key))
        return ClientTLS(str(self.ca))

    def etcd_flags(self) -> tuple[str, ...]:
        return ("--etcd.cert-file", str(self.client_cert), "--etcd.cert-key-file", str(self.client_key),
                "--etcd.trusted-ca-file", str(self.ca))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("etcd-pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("gazette-broker.example")
    pki = PKI(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
              d / "other-ca.pem")
    ca.cert_pem.write_to_path(str(pki.ca))
    trustme.CA().cert_pem.write_to_path(str(pki.other_ca))
    for cert, chain, key in ((server, pki.server_cert, pki.server_key), (client, pki.client_cert, pki.client_key)):
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
    return pki


@pytest.fixture(scope="module")
def tls_etcd(pki: PKI) -> Iterator[EtcdProcess]:
    """etcd serving clients over TLS only, requiring certificates signed by the CA."""
    server = EtcdProcess(unsafe_no_fsync=True, tls=ServerTLS(str(pki.server_cert), str(pki.server_key), str(pki.ca)),
                         probe_tls=pki.client_tls())
    with server:
        yield server


def _journal_yaml(name: str) -> str:
    return (f"name: {name}\nreplication: 1\nlabels:\n- name: content-type\n  value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [file:///]\n"
            "  refresh_interval: 1s\n")


async def test_a_broker_and_gazctl_work_over_an_mtls_etcd(tls_etcd: EtcdProcess, pki: PKI, tmp_path: Path) -> None:
    assert tls_etcd.url.startswith("https://")
    prefix = unique_prefix()
    name = f"tls-etcd/{uuid.uuid4().hex[:8]}"
    with Cluster(tls_etcd.url, prefix, tmp_path) as c:
        c.add_broker("local", "etcd-tls-owl", extra_args=pki.etcd_flags())
        applied = c.gazctl("journals", "apply", stdin=_journal_yaml(name))
        assert applied.rc == 0, applied.stderr

        # The journal is assigned once the broker's allocator has run over the new spec.
        def appended() -> bool:
            return c.gazctl("journals", "append", "-l", f"name={name}", stdin='{"over": "tls"}\n').rc == 0

        eventually_sync(appended, f"an append to {name} succeeds", within=30)
        got = c.gazctl("journals", "read", "-l", f"name={name}")
        assert got.rc == 0 and '{"over": "tls"}' in got.stdout, got.stderr

        # What gazctl applied went to the TLS etcd, under the cluster's prefix: a client with
        # the certificate reads the journal spec and the broker's member key there.
        client = await connect(tls_etcd.url, rpc_timeout=10, tls=pki.client_tls())
        try:
            keys = [kv.key.decode() for kv in await client.get_prefix(prefix.encode())]
        finally:
            await client.close()
        assert f"{prefix}/items/{name}" in keys, keys
        assert any(k.startswith(f"{prefix}/members/local#etcd-tls-owl") for k in keys), keys

        # A consumer process dials the same etcd with its certificate and announces itself.
        consumers = unique_prefix("/gazette-test-consumers")
        proc = ConsumerProcess(ConsumerConfig(
            port=0, broker_address=c.address, etcd_address=tls_etcd.url, etcd_tls=pki.client_tls(),
            etcd_prefix=consumers, etcd_lease=5, suffix="etcd-tls-fox"), CountingApp())
        task = asyncio.create_task(proc.run())
        try:
            async with asyncio.timeout(30):
                await proc.ready.wait()
            assert proc.keyspace.search(f"{consumers}/members/local#etcd-tls-fox") is not None
        finally:
            proc.stop()
            async with asyncio.timeout(30):
                await task


async def test_a_client_without_a_certificate_is_refused(tls_etcd: EtcdProcess, pki: PKI) -> None:
    client = await connect(tls_etcd.url, rpc_timeout=10, tls=pki.client_tls(with_cert=False))
    try:
        with pytest.raises(aetcd.exceptions.ConnectionFailedError, match="(?i)handshake"):
            await client.get(b"/anything")
        # Speaking to the KV service directly (as the keyspace does), the same refusal is a
        # gRPC UNAVAILABLE that tls_failure tells apart from etcd being down.
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await client.kvstub.Range(aetcd.rpc.RangeRequest(key=b"/anything"), timeout=10)
        err = tls_failure(tls_etcd.url, raised.value)
        assert isinstance(err, EtcdTLSError)
        assert tls_etcd.url in str(err) and "--etcd.cert-file" in str(err)
    finally:
        await client.close()


@pytest.mark.parametrize("flags,why", [
    # No client certificate: etcd refuses the handshake.
    (("--etcd.trusted-ca-file", "{ca}"), "--etcd.cert-file"),
    # A certificate, but trusting another CA: the broker refuses etcd's certificate.
    (("--etcd.cert-file", "{cert}", "--etcd.cert-key-file", "{key}", "--etcd.trusted-ca-file", "{other_ca}"),
     "--etcd.trusted-ca-file"),
])
def test_a_broker_refused_by_tls_exits_with_one_line(tls_etcd: EtcdProcess, pki: PKI, tmp_path: Path,
                                                     flags: tuple[str, ...], why: str) -> None:
    files = {"ca": pki.ca, "cert": pki.client_cert, "key": pki.client_key, "other_ca": pki.other_ca}
    args = tuple(a.format(**{k: str(v) for k, v in files.items()}) for a in flags)
    with Cluster(tls_etcd.url, unique_prefix(), tmp_path) as c:
        with pytest.raises(BrokerStartError, match="exited with status 1") as raised:
            c.add_broker("local", "etcd-tls-elk", extra_args=args, timeout=30)
    log = str(raised.value)
    [line] = [ln for ln in log.splitlines() if "cannot serve" in ln]
    assert "TLS handshake failed" in line and tls_etcd.url in line and why in line, log
    assert "Traceback" not in log, log

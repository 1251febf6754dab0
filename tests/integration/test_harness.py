"""The test harness itself: etcd process control, and the etcd, PostgreSQL and S3 fixtures."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gazette.etcd import connect, parse_endpoint
from gazette.testing.etcd import EtcdFixture
from gazette.testing.etcd_process import EtcdProcess, EtcdStartError, find_etcd_binary
from gazette.testing.postgres import PostgresServer
from gazette.testing.s3 import s3_client


def test_find_etcd_binary() -> None:
    binary = find_etcd_binary()
    assert os.access(binary, os.X_OK)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("127.0.0.1:2379", ("127.0.0.1", 2379)),
        ("http://localhost:2379", ("localhost", 2379)),
        ("http://localhost:2379/", ("localhost", 2379)),
        ("[::1]:23790", ("::1", 23790)),
    ],
)
def test_parse_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("bad", ["localhost", "http://:2379", "host:port"])
def test_parse_endpoint_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_endpoint(bad)


def test_https_is_parsed_and_tls_files_for_a_plaintext_endpoint_are_refused() -> None:
    from gazette.errors import GazetteError
    from gazette.etcd import is_tls_endpoint
    from gazette.etcd.client import check_tls
    from gazette.rpc.tls import ClientTLS

    assert parse_endpoint("https://etcd.example:2379/") == ("etcd.example", 2379)
    assert is_tls_endpoint("HTTPS://etcd.example:2379") and not is_tls_endpoint("http://etcd.example:2379")
    with pytest.raises(ValueError, match=r"plaintext but TLS files are given") as err:
        check_tls("http://etcd.example:2379", ClientTLS(ca_file="ca.pem"))
    assert isinstance(err.value, GazetteError) and err.value.grpc_code == "INVALID_ARGUMENT"


async def test_etcd_fixture_isolates_by_prefix(etcd: EtcdFixture) -> None:
    assert etcd.prefix.startswith("/gazette-test/")
    assert etcd.endpoint == etcd.server.endpoint
    await etcd.client.put(f"{etcd.prefix}/k".encode(), b"v")
    got = await etcd.client.get(f"{etcd.prefix}/k".encode())
    assert got is not None and got.value == b"v"


async def test_restart_keeps_data_dir_and_ports(tmp_path: Path) -> None:
    async with EtcdProcess(tmp_path / "etcd", unsafe_no_fsync=True) as server:
        endpoint = server.endpoint
        client = await connect(endpoint)
        try:
            await client.put(b"/k", b"kept")
            await server.akill()
            assert not server.is_running()
            await server.arestart()
            assert server.endpoint == endpoint
            async with asyncio.timeout(15):
                while True:
                    try:
                        got = await client.get(b"/k")
                        break
                    except Exception:  # the channel may still be reconnecting
                        await asyncio.sleep(0.05)
            assert got is not None and got.value == b"kept"
        finally:
            await client.close()
    assert not server.is_running()
    assert (tmp_path / "etcd").is_dir()  # a caller's data dir is kept


def test_owned_data_dir_is_removed() -> None:
    with EtcdProcess(unsafe_no_fsync=True) as server:
        data_dir = server.data_dir
        assert data_dir.is_dir()
    assert not data_dir.exists()


def test_start_failure_reports_the_cause(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = EtcdProcess(tmp_path / "etcd", client_port=port, start_timeout=10)
        with pytest.raises(EtcdStartError, match="address already in use"):
            server.start()
        assert not server.is_running()
        server.close()


def test_foreground_runner_stops_on_sigterm(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gazette.testing.etcd_process", "--data-dir", str(tmp_path / "d"),
         "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once etcd is healthy
        assert f"http://127.0.0.1:{port}" in line, line + proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "d" / "member").is_dir()


def test_postgres_fixture_gives_a_fresh_database(postgres_dsn: str) -> None:
    name = postgres_dsn.rsplit("/", 1)[1]
    server = PostgresServer()
    tables = server.psql(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
        database=name,
    )
    assert tables.strip() == "0"
    server.psql("CREATE TABLE checkpoints (shard text PRIMARY KEY, body bytea)", database=name)
    server.psql("INSERT INTO checkpoints VALUES ('s1', '\\x0102')", database=name)
    assert server.psql("SELECT shard FROM checkpoints", database=name).strip() == "s1"
    # The DSN works with a client as-is.
    done = subprocess.run(
        ["psql", "-X", "-tA", postgres_dsn, "-c", "SELECT count(*) FROM checkpoints"],
        capture_output=True, text=True, check=True, timeout=30,
    )
    assert done.stdout.strip() == "1"


def test_s3_fixture_round_trips_an_object(s3_server: str, s3_bucket: str) -> None:
    assert s3_server.startswith("http://127.0.0.1:")
    client = s3_client(s3_server)
    assert s3_bucket in {b["Name"] for b in client.list_buckets()["Buckets"]}
    client.put_object(Bucket=s3_bucket, Key="a/b/fragment.raw", Body=b"hello journal")
    got = client.get_object(Bucket=s3_bucket, Key="a/b/fragment.raw")
    assert got["Body"].read() == b"hello journal"
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="a/")
    assert [o["Key"] for o in listed["Contents"]] == ["a/b/fragment.raw"]
    assert os.environ["AWS_ACCESS_KEY_ID"]  # default-chain clients find credentials too


def test_s3_buckets_are_fresh_per_test(s3_server: str, s3_bucket: str) -> None:
    client = s3_client(s3_server)
    assert client.list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0

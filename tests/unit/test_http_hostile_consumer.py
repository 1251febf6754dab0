"""Hostile HTTP/1.1 against a consumer process (``gazette consume``): it serves its routes on
the same scaffolding as a broker, so the same refusals hold there, logged the same way."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from gazette.testing.cluster import Cluster, console_script
from gazette.testing.etcd import unique_prefix
from gazette.testing.eventually import eventually_sync

APP = textwrap.dedent('''
    from gazette.consumer.stores.memory import MemoryStore
    from gazette.message import JSONMessage

    class App:
        def new_store(self, shard, recorder):
            return MemoryStore()

        def new_message(self, spec):
            return JSONMessage

        def consume_message(self, shard, store, env, pub):
            pass

        def finalize_txn(self, shard, store, pub):
            pass
''')
DEADLINE = 30.0


def exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(1 << 16):
            out += chunk
        return out


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), answer[:200]
    return int(answer.split(b" ", 2)[1])


@pytest.mark.timeout(120)
def test_consumer_process_refuses_hostile_http(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_broker("local", "calm-lynx")
    (tmp_path / "idleapp.py").write_text(APP)
    log_path = tmp_path / "consumer.log"
    # The app's directory, then this tree (not whichever gazette the environment installed).
    pythonpath = os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])
    env = {**cluster.env(), "PYTHONPATH": pythonpath, "ETCD_ADDRESS": cluster.etcd_url,
           "ETCD_PREFIX": unique_prefix("/gazette-test-consumers"), "CONSUMER_PORT": "0"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen([console_script("gazette"), "consume", "--app", "idleapp:App"], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        def endpoint() -> int | None:
            m = re.search(r"consumer started.*endpoint=http://127\.0\.0\.1:(\d+)", log_path.read_text())
            return int(m.group(1)) if m else None

        eventually_sync(lambda: endpoint() is not None or proc.poll() is not None, "the consumer started", DEADLINE)
        port = endpoint()
        assert port is not None, log_path.read_text()[-3000:]
        cases = [
            (b"GET /debug/ready HTTP/2.0\r\nHost: x\r\n\r\n", 505),
            (b"PUT /debug/ready HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 501),
            (b"GET /debug/ready HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
            (b"GET /debug/ready HTTP/1.0\r\n\r\n", 200),
        ]
        for raw, expect in cases:
            assert status(exchange(port, raw)) == expect, raw
        # A half-sent head is closed by the server (after the 10 s head timeout), not held.
        t0 = time.monotonic()
        assert exchange(port, b"GET /debug/ready HTTP/1.1\r\nHost: x\r\n") == b""
        print(f"\nhalf-sent head closed after {time.monotonic() - t0:.1f} s")
        assert status(exchange(port, b"GET /debug/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    text = log_path.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert text.count("file descriptor limit") == 1
    assert all(len(line) <= 1024 for line in text.splitlines())
    assert len(re.findall(r"http: (bad request|request head)", text)) == 4, text[-3000:]

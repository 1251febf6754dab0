"""scripts/demo.sh in one-shot mode: a real etcd and two brokers, the example journals, an
append through one broker read back through the other; then bike-share end to end (two
consumer processes, generated rides streamed through the seed's pipeline, every planted cycle
found, the history API, shard lag); then a clean exit."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gazette.testing.cluster import free_port, http_status

REPO = Path(__file__).resolve().parents[2]
MESSAGES = '{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'


def free_port_pair(attempts: int = 50) -> int:
    """A port P such that P and P+1 are both free now (the demo's second broker takes P+1)."""
    for _ in range(attempts):
        port = free_port()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as a, \
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM) as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two adjacent free ports found")


@pytest.mark.skipif(shutil.which("curl") is None, reason="the demo uses curl")
def test_demo_script_oneshot(tmp_path: Path) -> None:
    broker_port = free_port_pair()
    env = {k: v for k, v in os.environ.items()
           if k not in ("BROKER_ADDRESS", "ETCD_ADDRESS", "ETCD_PREFIX", "BROKER_ID")}
    env.update(DEMO_ONESHOT="1", DEMO_DIR=str(tmp_path / "demo"),
               ETCD_PORT=str(free_port()), BROKER_PORT=str(broker_port), CONSUMER_PORT=str(free_port_pair()),
               DEMO_BIKES="60", DEMO_DATABASE="bike_share_demo_test",  # --fresh: dropped each run
               DEMO_VENV=sys.prefix)  # the build under test: no wheel built or installed here
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True,
                          timeout=420, check=False)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted((tmp_path / "demo").glob("*.log")))
    assert proc.returncode == 0, f"{out}\n{err}\n{logs}"

    assert "successfully applied" in err
    assert "examples/example-journal" in out
    # Appended through the first broker, read back (whole, in order) through the second.
    marker = f"--- appending through broker :{broker_port}, reading through broker :"
    assert marker in out, out
    after = out.split(marker, 1)[1].split("\n", 1)[1]
    assert after.startswith(MESSAGES), f"{out}\n{logs}"
    # The fragments table lists the journal's one fragment of those 62 bytes.
    assert "| examples/example-journal |      0 | 62 B" in out, out
    assert "Hello, Grace!" in out and "read 2 of them back, committed" in out, out

    # bike-share: every planted cycle printed as found, the history API, the shards' lag.
    assert "cycles-part-002 | PRIMARY" in out, out
    planted = int(out.split("(the generator planted ", 1)[1].split(")", 1)[0])
    assert out.count("a cycle of ") == planted > 0, out
    assert f"bike-share: {planted} planted cycles found; malformed rides skipped: 2" in out, out
    assert '"StartStation": ' in out and "examples/bike-share/rides/part-003:" in out, out
    # The Spark analytics job over the journals: every planted cycle, once.
    assert f"rides, {planted} cycles (Parquet under" in out, f"{out}\n{err}"
    assert "ride duration by hour of day (seconds)" in out, out

    # One-shot mode tears its cluster down: nothing answers on the brokers' ports any more.
    for port in (broker_port, broker_port + 1):
        assert http_status(f"http://127.0.0.1:{port}/debug/ready", timeout=0.5) is None

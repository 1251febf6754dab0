"""The bike-share preparation pipeline of the tutorial against a real broker:
``gazctl attach-uuids | awk | gazctl journals append --framing lines --mapping modulo`` into
partitioned journals, ``attach-uuids`` piped straight into a ``rendezvous`` append, and the
partitions read back by selector, while a blocking multi-journal read streams them.

Each record must sit in the journal ``gazette.message.mapping`` picks for its key (as a Go
publisher would), carry a UUID of its run's single producer, and come back whole.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gazette.message.mapping import modulo_mapping, rendezvous_mapping
from gazette.message.uuid import OUTSIDE_TXN, get_clock, get_flags, get_producer_id
from gazette.protocol import protocol_pb2 as pb
from gazette.testing.cluster import BrokerProcess, Cluster, console_script
from gazette.testing.eventually import eventually_sync

DEADLINE = 30.0
RIDES = [f"examples/rides/part-{i:03d}" for i in range(4)]
CYCLES = [f"examples/cycles/part-{i:03d}" for i in range(3)]


SPECS = """\
name: examples/
children:
- name: examples/cycles/
  replication: 1
  labels:
  - name: app.gazette.dev/message-type
    value: bikeshare.Cycle
  - name: content-type
    value: application/x-ndjson
  fragment:
    length: 4096
    compression_codec: NONE
    stores:
    - file:///
    refresh_interval: 1m0s
  children:
    - name: examples/cycles/part-000
    - name: examples/cycles/part-001
    - name: examples/cycles/part-002
- name: examples/rides/
  replication: 1
  labels:
  - name: app.gazette.dev/message-type
    value: bikeshare.Ride
  - name: content-type
    value: text/csv
  fragment:
    length: 4096
    compression_codec: NONE
    stores:
    - file:///
    refresh_interval: 1m0s
  children:
    - name: examples/rides/part-000
    - name: examples/rides/part-001
    - name: examples/rides/part-002
    - name: examples/rides/part-003
"""


def listing(names: list[str]) -> pb.ListResponse:
    resp = pb.ListResponse()
    for n in names:
        resp.journals.add().spec.name = n
    return resp


@pytest.fixture
def broker(cluster: Cluster) -> Iterator[BrokerProcess]:
    b = cluster.add_broker("local", "busy-walrus")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=SPECS)
    assert rc == 0, err

    def all_assigned() -> bool:
        rc, out, err = cluster.gazctl("journals", "list", "-l", "app.gazette.dev/message-type",
                                      "-o", "json")
        assert rc == 0, err
        journals = json.loads(out).get("journals", [])
        return len(journals) == 7 and all(j["route"].get("primary", -1) >= 0 for j in journals)

    eventually_sync(all_assigned, "every journal has a primary", DEADLINE)
    yield b
    assert "Traceback" not in b.log_text(), b.log_text()[-4000:]


def shell(cluster: Cluster, script: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**cluster.env(), "GAZCTL": console_script("gazctl")}
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env,
                          capture_output=True, timeout=DEADLINE, check=False)


def read_journal(cluster: Cluster, name: str) -> list[str]:
    rc, out, err = cluster.gazctl("journals", "read", "-l", f"name={name}")
    assert rc == 0, err
    assert out.endswith("\n") or out == ""
    return out.splitlines()


def check_uuids(uuids: list[uuid.UUID]) -> None:
    assert len(set(uuids)) == len(uuids)
    assert len({get_producer_id(u) for u in uuids}) == 1  # One producer per attach-uuids run.
    assert all(u.version == 1 and get_flags(u) == OUTSIDE_TXN for u in uuids)
    assert all(get_clock(u) > 0 for u in uuids)


def test_attach_uuids_and_partitioned_appends_read_back_by_selector(
        cluster: Cluster, broker: BrokerProcess, tmp_path: Path) -> None:
    bikes = [f"bike-{n}" for n in (17, 3, 250, 42, 8, 99, 1000)]
    rides = ["ride,started,bike"] + [f"ride-{i},2019-09-01T00:{i:02d},{bikes[i % 7]}"
                                     for i in range(35)]
    (tmp_path / "rides.csv").write_text("\n".join(rides) + "\n")
    (tmp_path / "bikes.txt").write_text("".join(f"{bikes[i % 7]}\n" for i in range(21)))

    # A blocking read of every ride partition, started before anything is appended.
    streaming = subprocess.Popen(
        [console_script("gazctl"), "journals", "read", "-l",
         "app.gazette.dev/message-type=bikeshare.Ride", "--block"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=cluster.env())
    try:
        # The tutorial's pipeline: UUIDs, then the bike id (4th column) alone on a line
        # before its record.
        done = shell(cluster, """
"$GAZCTL" attach-uuids --skip-header rides.csv \\
  | awk -F, '{print $4}{print}' \\
  | "$GAZCTL" journals append -l app.gazette.dev/message-type=bikeshare.Ride \\
      --framing=lines --mapping=modulo --log.level=debug
""", tmp_path)
        assert done.returncode == 0, done.stderr.decode()
        assert done.stderr.decode().count("mapped partition key to journal") == 35

        # attach-uuids straight into append: the template writes the key line itself.
        done = shell(cluster, """
"$GAZCTL" attach-uuids bikes.txt \\
    --template=$'{{.Line}}\\n{"uuid": "{{.UUID}}", "bike": "{{.Line}}"}\\n' \\
  | "$GAZCTL" journals append -l app.gazette.dev/message-type=bikeshare.Cycle \\
      --framing lines --mapping rendezvous
""", tmp_path)
        assert done.returncode == 0, done.stderr.decode()

        # Every record is where Gazette's mappings put its key, whole, with its UUID.
        mod = modulo_mapping(lambda k: k, lambda: listing(RIDES))
        ride_rows: list[str] = []
        for name in RIDES:
            for row in read_journal(cluster, name):
                u, ride, _, bike = row.split(",")
                assert mod(bike.encode())[0] == name, row
                ride_rows.append(row)
        assert sorted(r.split(",", 1)[1] for r in ride_rows) == sorted(rides[1:])
        check_uuids([uuid.UUID(r.split(",")[0]) for r in ride_rows])
        assert len({mod(b.encode())[0] for b in bikes}) > 1  # The test spreads keys.

        hrw = rendezvous_mapping(lambda k: k, lambda: listing(CYCLES))
        cycle_docs = []
        for name in CYCLES:
            for line in read_journal(cluster, name):
                doc = json.loads(line)
                assert hrw(doc["bike"].encode())[0] == name, line
                cycle_docs.append(doc)
        assert sorted(d["bike"] for d in cycle_docs) == sorted(bikes[i % 7] for i in range(21))
        check_uuids([uuid.UUID(d["uuid"]) for d in cycle_docs])

        # One read of all seven journals by selector: every record, each line whole.
        rc, out, err = cluster.gazctl("journals", "read", "-l", "app.gazette.dev/message-type")
        assert rc == 0, err
        assert err.count("read started") == 7 and err.count("read finished") == 7
        assert sorted(out.splitlines()) == sorted(ride_rows + [
            line for name in CYCLES for line in read_journal(cluster, name)])

        # The blocking read saw every ride, whole.
        got = b""
        deadline = time.monotonic() + DEADLINE
        assert streaming.stdout is not None
        fd = streaming.stdout.fileno()
        while got.count(b"\n") < 35:
            left = deadline - time.monotonic()
            assert left > 0, got
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                assert chunk, got
                got += chunk
        assert sorted(got.decode().splitlines()) == sorted(ride_rows)
        assert streaming.poll() is None  # Still waiting for more.
    finally:
        streaming.kill()
        streaming.wait()

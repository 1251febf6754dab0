"""``gazette consume --app module:Class`` as a real process: it takes its shards, consumes,
and drains on SIGTERM (exit 0, nothing left assigned)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from consumer_support import journals_yaml

from gazette.allocator.keys import items_key, members_prefix
from gazette.protocol import consumer_pb2 as pc
from gazette.testing.cluster import Cluster, console_script
from gazette.testing.etcd import unique_prefix
from gazette.testing.eventually import eventually_sync

SPECS = journals_yaml("part-000")

#: This tree, after the app's directory on the consumer's PYTHONPATH (not whichever gazette the
#: environment installed).
ROOT = Path(__file__).parents[2]

APP = textwrap.dedent('''
    import json, os
    from gazette.consumer.stores.memory import MemoryStore
    from gazette.message import JSONMessage
    from gazette.message.uuid import ACK_TXN, get_flags

    class App:
        def __init__(self):
            self.seen = 0

        def new_store(self, shard, recorder):
            return MemoryStore()

        def new_message(self, spec):
            return JSONMessage

        def consume_message(self, shard, store, env, pub):
            if get_flags(env.message.get_uuid()) != ACK_TXN:
                self.seen += 1

        def finalize_txn(self, shard, store, pub):
            with open(os.environ["COUNT_FILE"] + ".tmp", "w") as f:
                json.dump({"seen": self.seen}, f)
            os.replace(os.environ["COUNT_FILE"] + ".tmp", os.environ["COUNT_FILE"])
''')


@pytest.mark.timeout(120)
def test_gazette_consume_runs_an_app_and_drains(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_broker("local", "merry-yak")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=SPECS)
    assert rc == 0, err
    (tmp_path / "countapp.py").write_text(APP)
    prefix = unique_prefix("/gazette-test-consumers")
    spec = pc.ShardSpec(id="count-000")
    spec.sources.add(journal="in/part-000")
    subprocess.run([sys.executable, "-c", (
        "import asyncio,sys; from gazette.etcd import connect\n"
        "async def m():\n c = await connect(sys.argv[1]); await c.put(sys.argv[2].encode(), bytes.fromhex(sys.argv[3])); await c.close()\n"
        "asyncio.run(m())"), cluster.etcd_url, items_key(prefix, "count-000"), spec.SerializeToString().hex()],
        check=True, timeout=30)
    count_file = tmp_path / "count.json"
    env = {**cluster.env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "COUNT_FILE": str(count_file),
           "ETCD_ADDRESS": cluster.etcd_url, "ETCD_PREFIX": prefix, "CONSUMER_PORT": "0"}
    proc = subprocess.Popen([console_script("gazette"), "consume", "--app", "countapp:App"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = "".join(json.dumps({"n": i}) + "\n" for i in range(50))
        rc, _, err = cluster.gazctl("journals", "append", "-l", "name=in/part-000", stdin=lines)
        assert rc == 0, err
        eventually_sync(lambda: count_file.exists() and json.loads(count_file.read_text())["seen"] == 50, "the app consumed all 50 messages", 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "consumer started" in out and "consumer draining" in out, out


@pytest.mark.timeout(120)
def test_a_consumer_that_loses_its_lease_exits_with_one_line(cluster: Cluster, tmp_path: Path) -> None:
    """Its announcement's lease revoked under it (as when etcd expires a lease the process could
    not refresh), ``gazette consume`` exits 1 naming the loss in one line, no traceback."""
    cluster.add_broker("local", "lost-lynx")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=SPECS)
    assert rc == 0, err
    (tmp_path / "countapp.py").write_text(APP)
    prefix = unique_prefix("/gazette-test-lost-lease")
    env = {**cluster.env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "COUNT_FILE": str(tmp_path / "count.json"),
           "ETCD_ADDRESS": cluster.etcd_url, "ETCD_PREFIX": prefix, "CONSUMER_PORT": "0",
           "ETCD_LEASE": "3s"}
    proc = subprocess.Popen([console_script("gazette"), "consume", "--app", "countapp:App"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The member key, once announced, and the lease it is held under, revoked.
        revoke = (
            "import asyncio,sys; from gazette.etcd import connect\n"
            "async def m():\n"
            " c = await connect(sys.argv[1])\n"
            " try:\n"
            "  kvs = list(await c.get_prefix(sys.argv[2].encode()))\n"
            "  if len(kvs) != 1: sys.exit(3)\n"
            "  await c.revoke_lease(kvs[0].lease)\n"
            " finally:\n"
            "  await c.close()\n"
            "asyncio.run(m())")
        members = members_prefix(prefix)
        eventually_sync(lambda: subprocess.run([sys.executable, "-c", revoke, cluster.etcd_url, members],
                                               timeout=30).returncode == 0,
                        "the consumer was announced and its lease revoked", 60)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    # The keep-alive (AnnouncementLostError) or the keyspace watch (MemberNotFoundError) sees
    # the loss first; either way one line names it.
    [stopped] = [line for line in out.splitlines() if "consumer stopped" in line]
    assert re.search(r"(AnnouncementLostError|MemberNotFoundError): .*lease", stopped), out

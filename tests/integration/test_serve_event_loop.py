"""``gazette serve --event-loop {uvloop,asyncio}``: a broker on either loop logs which it runs
and serves appends and reads: gazctl's (our gRPC client), grpcio's (a large append, split in
chunks, read back whole) and HTTP's (the mux's aiohttp side), on one port."""

from __future__ import annotations

import urllib.request
import uuid

import grpc
import pytest

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.cluster import Cluster
from gazette.testing.eventually import eventually_sync

DEADLINE = 60.0


def _journal_yaml(name: str) -> str:
    return (f"name: {name}\nreplication: 1\nlabels:\n- name: content-type\n  value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [file:///]\n"
            "  refresh_interval: 1s\n")


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_serve_on_either_loop_serves_appends_and_reads(cluster: Cluster, event_loop: str) -> None:
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    broker = cluster.add_broker("local", f"loop-{event_loop}", extra_args=("--event-loop", event_loop))
    assert f"event loop: {event_loop}" in broker.log_text(), broker.log_text()[-2000:]
    name = f"loops/{event_loop}-{uuid.uuid4().hex[:8]}"
    applied = cluster.gazctl("journals", "apply", stdin=_journal_yaml(name))
    assert applied.rc == 0, applied.stderr

    def appended() -> bool:
        return cluster.gazctl("journals", "append", "-l", f"name={name}", stdin='{"n": 1}\n').rc == 0

    eventually_sync(appended, f"an append to {name} succeeds", within=DEADLINE)

    # grpcio: one append of 40 chunks of 64 KiB (flow control, large frames, gathered writes).
    body = b"".join(b'{"chunk": %d, "pad": "%s"}\n' % (i, b"x" * 65000) for i in range(40))
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        reqs = [pb.AppendRequest(journal=name), *(pb.AppendRequest(content=c) for c in chunks),
                pb.AppendRequest()]
        resp = stub.Append(iter(reqs), timeout=DEADLINE)
        assert resp.status == pb.OK and resp.commit.end - resp.commit.begin == len(body)
        read = b"".join(r.content for r in stub.Read(
            pb.ReadRequest(journal=name, offset=resp.commit.begin, block=False), timeout=DEADLINE))
        assert read == body

    # HTTP/1.1 through the same port.
    with urllib.request.urlopen(broker.url(name), timeout=DEADLINE) as r:
        http_body = r.read()
    assert http_body.startswith(b'{"n": 1}\n') and http_body.endswith(body)

    got = cluster.gazctl("journals", "read", "-l", f"name={name}")
    assert got.rc == 0 and got.stdout.startswith('{"n": 1}\n'), got.stderr
    assert "Traceback" not in broker.log_text()

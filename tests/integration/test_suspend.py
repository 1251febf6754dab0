"""Journal suspension on real brokers: by hand (``gazctl journals suspend``) and automatic
(``--broker.auto-suspend``), and resumption by the next append.

A fully suspended journal has no replicas (its desired replication is 0): the brokers hold
nothing for it until an append resumes it, which must then succeed and read back. Brokers
run with a short ``--broker.health-interval`` so that auto-suspension's 15 stable pulses take
seconds; every wait polls a condition under a deadline.
"""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.cluster import BrokerProcess, Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.eventually import eventually_sync

DEADLINE = 60.0
HEALTH = ("--broker.health-interval", "100ms")


@pytest.fixture(scope="module")
def susp(etcd_server: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(etcd_server.url, unique_prefix(), tmp_path_factory.mktemp("suspend")) as c:
        c.add_broker("zone-a", "auto-a", extra_args=("--broker.auto-suspend", *HEALTH))
        c.add_broker("zone-b", "auto-b", extra_args=("--broker.auto-suspend", *HEALTH))
        yield c


@pytest.fixture(scope="module")
def stub(susp: Cluster) -> Iterator[pb_grpc.JournalStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{susp.brokers[0].port}")
    try:
        yield pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
    finally:
        channel.close()


def listed(stub: pb_grpc.JournalStub, name: str) -> pb.ListResponse.Journal:
    req = pb.ListRequest()
    req.selector.include.labels.add(name="name", value=name)
    found = [j for resp in stub.List(req, timeout=DEADLINE) for j in resp.journals]
    assert len(found) == 1, found
    return found[0]


def create(stub: pb_grpc.JournalStub, prefix: str) -> str:
    name = f"{prefix}/{uuid.uuid4().hex[:12]}"
    spec = pb.JournalSpec(name=name, replication=2)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
    req = pb.ApplyRequest()
    req.changes.add(upsert=spec, expect_mod_revision=0)
    assert stub.Apply(req, timeout=DEADLINE).status == pb.OK
    return name


def append(broker: BrokerProcess, journal: str, body: bytes) -> int:
    """Appends over HTTP (a client's default: resume a suspended journal); the commit's end."""
    req = urllib.request.Request(broker.url(journal), data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as resp:  # noqa: S310 - loopback
            assert resp.status == 204
            return int(resp.headers["X-Commit-End"])
    except urllib.error.HTTPError as err:
        raise AssertionError(f"append to {journal}: HTTP {err.code}: {err.read()!r}") from None


def read(broker: BrokerProcess, journal: str) -> bytes:
    with urllib.request.urlopen(broker.url(journal), timeout=DEADLINE) as resp:  # noqa: S310
        return bytes(resp.read())


def level(j: pb.ListResponse.Journal) -> str:
    return pb.JournalSpec.Suspend.Level.Name(j.spec.suspend.level)


def test_an_idle_empty_journal_is_auto_suspended_and_an_append_resumes_it(
        susp: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = create(stub, "auto")
    eventually_sync(lambda: len(listed(stub, name).route.members) == 2, f"{name} has two replicas", DEADLINE)
    # Stable and empty: after 15 health intervals the primary's pulse suspends it fully, and the
    # allocator then takes its replicas away.
    eventually_sync(lambda: level(listed(stub, name)) == "FULL" and not listed(stub, name).route.members,
                    f"{name} is fully suspended with no replicas", DEADLINE)

    # An append (through the other broker too) resumes it and lands once.
    end = append(susp.brokers[1], name, b"hello\n")
    assert end == 6
    j = listed(stub, name)
    assert level(j) == "NONE", j
    assert read(susp.brokers[0], name) == b"hello\n"


def test_gazctl_suspend_and_resume(susp: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = create(stub, "manual")
    eventually_sync(lambda: listed(stub, name).route.primary != -1, f"{name} has a primary", DEADLINE)
    rc, out, err = susp.gazctl("journals", "suspend", "-l", f"name={name}")
    assert rc == 0, (out, err)
    eventually_sync(lambda: level(listed(stub, name)) == "FULL", f"{name} is suspended", DEADLINE)
    assert append(susp.brokers[0], name, b"one\n") == 4
    assert append(susp.brokers[0], name, b"two\n") == 8
    assert read(susp.brokers[1], name) == b"one\ntwo\n"

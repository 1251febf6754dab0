"""Bad input to a real broker gets a clear refusal, changes nothing, and leaves it healthy.

One broker serves the whole module (each test uses journals of its own). After every refusal
the test checks that journal specs and content are as before and that the broker still answers
``/debug/ready`` and serves appends and reads.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.flow import READ_AHEAD
from gazette.fragment import codecs
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.cluster import (
    BrokerProcess,
    BrokerStartError,
    Cluster,
    http_status,
)
from gazette.testing.etcd import unique_prefix
from gazette.testing.etcd_process import EtcdProcess
from gazette.testing.eventually import eventually_sync

DEADLINE = 30.0


# --- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def errs(etcd_server: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(etcd_server.url, unique_prefix(), tmp_path_factory.mktemp("errs")) as c:
        c.add_broker("local", "sturdy-yak")
        yield c


@pytest.fixture(scope="module")
def stub(errs: Cluster) -> Iterator[pb_grpc.JournalStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{errs.broker.port}")
    try:
        yield pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
    finally:
        channel.close()


def journal_spec(name: str, length: int = 1 << 17) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=1)
    spec.labels.labels.add(name="content-type", value="application/x-ndjson")
    spec.fragment.length = length
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
    return spec


def list_specs(stub: pb_grpc.JournalStub, selected: str) -> dict[str, tuple[int, bytes]]:
    """{name: (mod_revision, serialized spec)} of the journals under a `selected` prefix
    (ending in '/') or of the one so named."""
    req = pb.ListRequest()
    req.selector.include.labels.add(name="prefix" if selected.endswith("/") else "name",
                                    value=selected)
    out = {}
    for resp in stub.List(req, timeout=DEADLINE):
        assert resp.status == pb.OK
        for j in resp.journals:
            out[j.spec.name] = (j.mod_revision, j.spec.SerializeToString(deterministic=True))
    return out


def new_journal(errs: Cluster, stub: pb_grpc.JournalStub, length: int = 1 << 17) -> str:
    """Creates a journal of this test's own and waits until it has a primary."""
    name = f"errors/{uuid.uuid4().hex[:12]}"
    req = pb.ApplyRequest()
    req.changes.add(upsert=journal_spec(name, length), expect_mod_revision=0)
    assert stub.Apply(req, timeout=DEADLINE).status == pb.OK

    def assigned() -> bool:
        lr = pb.ListRequest()
        lr.selector.include.labels.add(name="name", value=name)
        return any(j.route.primary != -1 for r in stub.List(lr, timeout=DEADLINE)
                   for j in r.journals)

    eventually_sync(assigned, f"{name} has a primary", DEADLINE)
    return name


def put(url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as resp:  # noqa: S310 - loopback
            return int(resp.status), resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return int(err.code), err.read(), dict(err.headers)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=DEADLINE) as resp:  # noqa: S310 - loopback
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def content(broker: BrokerProcess, journal: str) -> bytes:
    status, body = get(broker.url(journal))
    if status == 416:  # nothing written yet (OFFSET_NOT_YET_AVAILABLE)
        return b""
    assert status == 206, (status, body)
    return body


def append_ok(broker: BrokerProcess, journal: str, body: bytes) -> tuple[int, int]:
    status, text, headers = put(broker.url(journal), body)
    assert status == 204, (status, text)
    return int(headers["X-Commit-Begin"]), int(headers["X-Commit-End"])


def assert_healthy(errs: Cluster) -> None:
    """The broker process is up, ready, and serves an append and a read of a fresh journal."""
    broker = errs.broker
    assert broker.is_running()
    assert http_status(broker.url("/debug/ready")) == 200
    status, body = get(broker.url("/debug/metrics"))
    assert status == 200 and b"gazette_appends_total" in body
    # Refusals are answers, not crashes: no request so far has logged an error traceback.
    assert "Traceback" not in broker.log_text(), broker.log_text()[-4000:]


# --- Apply: invalid specs ---------------------------------------------------------------------


def _bad_name(s: pb.JournalSpec) -> None:
    s.name = "errors/bad name"


def _bad_replication(s: pb.JournalSpec) -> None:
    s.replication = 0


def _bad_length(s: pb.JournalSpec) -> None:
    s.fragment.length = 256


def _bad_store(s: pb.JournalSpec) -> None:
    s.fragment.stores[0] = "file://some-host/path/"


def _bad_refresh(s: pb.JournalSpec) -> None:
    s.fragment.refresh_interval.CopyFrom(Duration(seconds=0))


def _bad_label(s: pb.JournalSpec) -> None:
    s.labels.labels.add(name="prefix", value="x/")


INVALID_SPECS = {
    "name": (_bad_name, "changes[1].upsert.name"),
    "replication": (_bad_replication, "changes[1].upsert.replication"),
    "fragment.length": (_bad_length, "changes[1].upsert.fragment.length"),
    "fragment.stores": (_bad_store, "changes[1].upsert.fragment.stores[0]"),
    "fragment.refresh_interval": (_bad_refresh, "changes[1].upsert.fragment.refresh_interval"),
    "labels": (_bad_label, "changes[1].upsert.labels"),
}


@pytest.mark.parametrize("case", sorted(INVALID_SPECS))
def test_apply_invalid_spec_is_refused_atomically(
    errs: Cluster, stub: pb_grpc.JournalStub, case: str
) -> None:
    mutate, field = INVALID_SPECS[case]
    prefix = f"invalid-{uuid.uuid4().hex[:8]}/"
    good, bad = journal_spec(prefix + "good"), journal_spec(prefix + "bad")
    mutate(bad)
    req = pb.ApplyRequest()
    req.changes.add(upsert=good, expect_mod_revision=0)  # valid, but must not land alone
    req.changes.add(upsert=bad, expect_mod_revision=0)

    with pytest.raises(grpc.RpcError) as info:
        stub.Apply(req, timeout=DEADLINE)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.details() or ""), err.details()

    assert list_specs(stub, prefix) == {}
    assert_healthy(errs)


def _cli_spec(replication: str = "1", length: str = "131072", refresh: str = "1m0s") -> str:
    return (f"name: errors/cli\nreplication: {replication}\nfragment:\n  length: {length}\n"
            f"  compression_codec: SNAPPY\n  stores: [file:///]\n"
            f"  refresh_interval: {refresh}\n")


GAZCTL_INVALID = {
    "replication": (_cli_spec(replication="0"), "replication"),
    "fragment.length": (_cli_spec(length="10"), "length"),
    "unknown field": ("name: errors/cli\nreplicaton: 1\n", "replicaton"),
    "bad duration": (_cli_spec(refresh="soon"), "refresh_interval"),
    "not yaml": ("name: [errors/cli\n", "yaml"),
}


@pytest.mark.parametrize("case", sorted(GAZCTL_INVALID))
def test_gazctl_apply_invalid_exits_1_with_one_line(
    errs: Cluster, stub: pb_grpc.JournalStub, case: str
) -> None:
    text, word = GAZCTL_INVALID[case]
    before = list_specs(stub, "errors/")
    rc, out, err = errs.gazctl("journals", "apply", stdin=text)
    assert rc == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("FATA"), err
    assert word.lower() in lines[0].lower(), err
    assert list_specs(stub, "errors/") == before
    assert_healthy(errs)


def test_apply_with_stale_revision(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = new_journal(errs, stub)
    (rev, spec_before), = list_specs(stub, name).values()

    # Someone else changes the journal; our revision is now stale.
    changed = journal_spec(name, length=1 << 18)
    req = pb.ApplyRequest()
    req.changes.add(upsert=changed, expect_mod_revision=rev)
    assert stub.Apply(req, timeout=DEADLINE).status == pb.OK
    (current_rev, current), = list_specs(stub, name).values()
    assert current_rev > rev

    stale = pb.ApplyRequest()
    stale.changes.add(upsert=journal_spec(name, length=1 << 19), expect_mod_revision=rev)
    resp = stub.Apply(stale, timeout=DEADLINE)
    assert resp.status == pb.ETCD_TRANSACTION_FAILED
    assert list_specs(stub, name) == {name: (current_rev, current)}

    # A delete at a stale revision is refused just the same.
    delete = pb.ApplyRequest()
    delete.changes.add(delete=name, expect_mod_revision=rev)
    assert stub.Apply(delete, timeout=DEADLINE).status == pb.ETCD_TRANSACTION_FAILED

    # Creating a journal that exists (revision 0 means "must not exist").
    create = pb.ApplyRequest()
    create.changes.add(upsert=journal_spec(name), expect_mod_revision=0)
    assert stub.Apply(create, timeout=DEADLINE).status == pb.ETCD_TRANSACTION_FAILED

    # gazctl reports it in one line and exits 1.
    yaml_text = _cli_spec().replace("errors/cli", name) + f"revision: {rev}\n"
    rc, out, err = errs.gazctl("journals", "apply", stdin=yaml_text)
    assert rc == 1
    assert len(err.strip().splitlines()) == 1 and err.startswith("FATA"), err
    assert "ETCD_TRANSACTION_FAILED" in err
    assert list_specs(stub, name) == {name: (current_rev, current)}
    assert_healthy(errs)


# --- unknown journals -------------------------------------------------------------------------


def test_unknown_journal(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    missing = f"errors/missing-{uuid.uuid4().hex[:8]}"
    broker = errs.broker

    status, body = get(broker.url(missing))
    assert (status, body) == (404, b"JOURNAL_NOT_FOUND\n")
    status, body, _ = put(broker.url(missing), b"data\n")
    assert (status, body) == (404, b"JOURNAL_NOT_FOUND\n")
    status, body = get(broker.url(missing) + "?block=true")
    assert status == 404

    first = next(iter(stub.Read(pb.ReadRequest(journal=missing), timeout=DEADLINE)))
    assert first.status == pb.JOURNAL_NOT_FOUND
    assert first.header.process_id.suffix == "sturdy-yak"

    resp = stub.Append(iter([pb.AppendRequest(journal=missing), pb.AppendRequest(content=b"x"),
                             pb.AppendRequest()]), timeout=DEADLINE)
    assert resp.status == pb.JOURNAL_NOT_FOUND
    assert not resp.HasField("commit")

    frags = stub.ListFragments(pb.FragmentsRequest(journal=missing), timeout=DEADLINE)
    assert frags.status == pb.JOURNAL_NOT_FOUND

    # Nothing was created by any of those.
    assert list_specs(stub, missing) == {}
    assert not (errs.file_root / missing).exists()
    assert_healthy(errs)


def test_malformed_grpc_requests(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = new_journal(errs, stub)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: next(iter(stub.Read(pb.ReadRequest(journal=name, offset=-2),
                                     timeout=DEADLINE))), "offset"),
        (lambda: next(iter(stub.Read(pb.ReadRequest(journal="errors/../up"),
                                     timeout=DEADLINE))), "journal"),
        (lambda: stub.Append(iter([pb.AppendRequest(journal=name, offset=-5)]),
                             timeout=DEADLINE), "offset"),
    ]
    for call, field in cases:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (info.value.details() or "")
    assert content(errs.broker, name) == b""
    assert_healthy(errs)


# --- HTTP: unknown query keys, malformed values -----------------------------------------------


@pytest.mark.parametrize(
    ("method", "query", "needle"),
    [
        ("GET", "offest=3", b"offest"),
        ("GET", "offset=3&colour=red", b"colour"),
        ("PUT", "offset=3", b"offset"),
        ("PUT", "flush=true", b"flush"),
        ("GET", "offset=abc", b"offset"),
        ("GET", "offset=1.5", b"offset"),
        ("GET", "offset=", b"offset"),
        ("GET", "offset=-2", b"offset"),
        ("GET", "offset=0x10", b"offset"),
        ("GET", "offset=99999999999999999999999", b"offset"),
        ("GET", "block=maybe", b"block"),
    ],
)
def test_bad_http_query_is_400(
    errs: Cluster, stub: pb_grpc.JournalStub, method: str, query: str, needle: bytes
) -> None:
    name = new_journal(errs, stub)
    broker = errs.broker
    append_ok(broker, name, b"before\n")
    url = f"{broker.url(name)}?{query}"
    if method == "GET":
        status, body = get(url)
    else:
        status, body, _ = put(url, b"must not land\n")
    assert status == 400, (status, body)
    assert needle in body, body
    assert content(broker, name) == b"before\n"
    assert append_ok(broker, name, b"after\n") == (7, 13)
    assert_healthy(errs)


# --- clients that go away mid-append ----------------------------------------------------------


def spool_sizes(broker: BrokerProcess) -> list[int]:
    """Sizes of the broker's open spool files, found through /proc/PID/fd: a spool file is
    anonymous (an ``O_TMPFILE``, or a temporary file unlinked at once), so its link reads
    ``... (deleted)``, and it is the only kind of regular file a broker holds unnamed."""
    pid = broker.pid
    assert pid is not None
    sizes = []
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(fd_dir / fd).endswith(" (deleted)"):
                st = os.stat(fd_dir / fd)
                if stat.S_ISREG(st.st_mode):
                    sizes.append(st.st_size)
        except OSError:
            continue  # closed meanwhile
    return sizes


requires_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(),
                                   reason="needs /proc to observe the broker's spool")


def assert_rolled_back(errs: Cluster, stub: pb_grpc.JournalStub, name: str,
                       before: bytes) -> None:
    """Content is exactly `before`; the next appends land at its end; and the fragment the
    spool persists holds no byte of the abandoned append."""
    broker = errs.broker
    assert content(broker, name) == before
    begin, end = append_ok(broker, name, b"after\n")
    assert (begin, end) == (len(before), len(before) + 6)
    expected = before + b"after\n"
    # Exceed the 1024-byte fragment length so the next append rolls and persists the spool.
    filler = b"".join(b'{"filler": %d}\n' % i for i in range(80))
    append_ok(broker, name, filler)
    append_ok(broker, name, b"roll\n")
    expected += filler + b"roll\n"
    assert content(broker, name) == expected

    directory = errs.file_root / name
    first = eventually_sync(lambda: next((p for p in directory.glob("0000000000000000-*.sz")), None)
        if directory.is_dir() else None, "first fragment persisted", DEADLINE)
    raw = codecs.decompress(pb.SNAPPY, first.read_bytes())
    end_offset = int(first.name.split("-")[1], 16)
    assert raw == expected[:end_offset]
    assert hashlib.sha1(raw).hexdigest() == first.name.split("-")[2].split(".")[0]
    assert b"X" not in raw
    assert_healthy(errs)


@requires_proc
def test_grpc_client_cancels_mid_append(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = new_journal(errs, stub, length=1024)
    broker = errs.broker
    append_ok(broker, name, b"before\n")
    # More than the broker reads ahead of a client before it queues the append (a smaller
    # append that never commits is aborted before it reaches the pipeline: nothing to see).
    abandoned = b"X" * (READ_AHEAD + 48 * 1024)

    release = threading.Event()

    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=name)
        for i in range(0, len(abandoned), 16 * 1024):
            yield pb.AppendRequest(content=abandoned[i:i + 16 * 1024])
        release.wait(DEADLINE)  # the commit chunk is never sent

    call = stub.Append.future(requests(), timeout=DEADLINE)
    try:
        # The broker has every abandoned byte in its spool, uncommitted.
        eventually_sync(lambda: any(s >= 7 + len(abandoned) for s in spool_sizes(broker)), "abandoned content reached the spool", DEADLINE)
        assert content(broker, name) == b"before\n"  # readers never see uncommitted bytes
    finally:
        call.cancel()
        release.set()
    with pytest.raises(grpc.FutureCancelledError):
        call.result()
    assert_rolled_back(errs, stub, name, b"before\n")


@requires_proc
def test_http_client_disconnects_mid_put(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = new_journal(errs, stub, length=1024)
    broker = errs.broker
    append_ok(broker, name, b"before\n")
    sent = b"X" * (48 * 1024)

    with socket.create_connection(("127.0.0.1", broker.port), timeout=DEADLINE) as sock:
        sock.sendall(
            f"PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {2 * len(sent)}\r\n"
            "Content-Type: application/octet-stream\r\n\r\n".encode()
        )
        sock.sendall(sent)  # half of the promised body
        eventually_sync(lambda: any(s >= 7 + len(sent) for s in spool_sizes(broker)), "partial body reached the spool", DEADLINE)
        assert content(broker, name) == b"before\n"
    # The socket is closed: the broker must roll the partial append back.
    assert_rolled_back(errs, stub, name, b"before\n")


def test_stalled_append_is_aborted_by_the_minimum_rate(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    """A client that stops streaming mid-append (below --broker.min-append-rate, 64 KiB/s by
    default) is aborted, its bytes are rolled back, and the journal takes other appends."""
    name = new_journal(errs, stub, length=1024)
    append_ok(errs.broker, name, b"before\n")
    release = threading.Event()

    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=name)
        yield pb.AppendRequest(content=b"stalled " * 64)
        release.wait(DEADLINE)  # never sends the commit chunk in time

    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Append(requests(), timeout=DEADLINE)
    finally:
        release.set()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "minimum append data rate" in (info.value.details() or "")
    assert_rolled_back(errs, stub, name, b"before\n")


def test_http_put_without_body_appends_nothing(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    name = new_journal(errs, stub)
    broker = errs.broker
    append_ok(broker, name, b"before\n")
    status, body, headers = put(broker.url(name), b"")
    assert status == 204, body
    assert headers["X-Commit-Begin"] == headers["X-Commit-End"] == "7"
    assert content(broker, name) == b"before\n"
    assert_healthy(errs)


# --- gazette serve: bad flags -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "extra", "message"),
    [
        ("local", ("--broker.limit", "lots"), "invalid --broker.limit 'lots'"),
        ("local", ("--etcd.lease", "forever"), "invalid --etcd.lease"),
        ("bad zone!", (), "invalid --broker.zone/--broker.id"),
    ],
)
def test_serve_refuses_bad_flags(
    errs: Cluster, tmp_path: Path, zone: str, extra: tuple[str, ...], message: str
) -> None:
    broker = BrokerProcess(etcd_url=errs.etcd_url, etcd_prefix=errs.etcd_prefix,
                           file_root=tmp_path / "fragments", log_dir=tmp_path, zone=zone,
                           broker_id="never-starts", extra_args=extra)
    with pytest.raises(BrokerStartError) as info:
        broker.start(DEADLINE)
    assert message in str(info.value)
    assert "Traceback" not in broker.log_text()
    assert not broker.is_running()
    assert_healthy(errs)


def test_serve_on_a_busy_port_says_so(errs: Cluster, tmp_path: Path) -> None:
    busy = errs.broker.port
    broker = BrokerProcess(etcd_url=errs.etcd_url, etcd_prefix=errs.etcd_prefix,
                           file_root=tmp_path / "fragments", log_dir=tmp_path,
                           broker_id="port-thief", port=busy)
    with pytest.raises(BrokerStartError) as info:
        broker.start(DEADLINE)
    assert "address already in use" in str(info.value)
    assert "Traceback" not in broker.log_text(), broker.log_text()
    assert broker.returncode() == 1
    assert_healthy(errs)


def test_request_proxied_to_a_restarted_address_is_unavailable(errs: Cluster, stub: pb_grpc.JournalStub) -> None:
    # A peer whose route still names the broker that used to listen here (its lease not yet
    # lapsed) proxies to us: a transient routing failure the sender retries, not a server bug.
    name = f"errors/misrouted-{uuid.uuid4().hex[:8]}"
    header = next(iter(stub.Read(pb.ReadRequest(journal=name), timeout=DEADLINE))).header  # a real one
    header.process_id.suffix = "gone-broker"
    with pytest.raises(grpc.RpcError) as info:
        stub.Append(iter([pb.AppendRequest(journal=name, header=header), pb.AppendRequest(content=b"x"),
                          pb.AppendRequest()]), timeout=DEADLINE)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ProcessId doesn't match our own" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Read(pb.ReadRequest(journal=name, header=header), timeout=DEADLINE)))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert http_status(errs.broker.url("/debug/ready")) == 200

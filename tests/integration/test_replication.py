"""Replicated journals across real brokers: appends land once, in one order, on every replica.

Each test starts its own brokers (``gazette serve`` processes, in two zones) on the session
etcd, with a short etcd lease so a killed broker's assignments expire quickly. Journals have
replication 3 and a file store. Every wait polls a condition under a deadline.

* Appends through different brokers land once each, in one order, and each replica serves
  identical content when read without proxying.
* A primary killed (SIGKILL) mid-stream is replaced once its lease expires; every append that
  was acknowledged is read back exactly once, at the offsets its commit named, and the
  persisted fragments tile the journal with correct SHA1 sums.
* Appends sent together on one connection commit in groups, each answered exactly its own
  range and SHA-1, directly and through a proxying broker.
* Content beyond the synchronised head in the store refuses appends (INDEX_HAS_GREATER_OFFSET)
  until ``gazctl journals reset-head`` confirms the new head.
* (soak) A rolling SIGTERM restart of every broker under continuous appends loses nothing.
* (soak) A frozen peer (SIGSTOP) is routed around under continuous appends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.fragment import codecs
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import BrokerProcess, Cluster
from gazette.testing.eventually import eventually_sync

DEADLINE = 60.0
LEASE = ("--etcd.lease", "2s")
ROLLS = 3  # rounds of the soak's rolling restart
FRAGMENT_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})(\.[a-z]+)?$")


# --- helpers ------------------------------------------------------------------------------


class Stubs:
    """A gRPC stub per broker (by port), closed at the end of the test."""

    def __init__(self) -> None:
        self._channels: dict[int, grpc.Channel] = {}

    def __call__(self, broker: BrokerProcess) -> pb_grpc.JournalStub:
        ch = self._channels.get(broker.port)
        if ch is None:
            ch = self._channels[broker.port] = grpc.insecure_channel(f"127.0.0.1:{broker.port}")
        return pb_grpc.JournalStub(ch)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()


@pytest.fixture
def stubs() -> Iterator[Stubs]:
    s = Stubs()
    yield s
    s.close()


def start_brokers(cluster: Cluster, layout: list[tuple[str, str]]) -> list[BrokerProcess]:
    return [cluster.add_broker(zone, bid, extra_args=LEASE) for zone, bid in layout]


def apply_journal(stub: pb_grpc.JournalStub, name: str, *, replication: int = 3,
                  length: int = 1 << 20, refresh: int = 60) -> None:
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.labels.labels.add(name="content-type", value="application/x-ndjson")
    spec.fragment.length = length
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.CopyFrom(Duration(seconds=refresh))
    req = pb.ApplyRequest()
    req.changes.add(upsert=spec, expect_mod_revision=0)
    assert stub.Apply(req, timeout=DEADLINE).status == pb.OK


def route_of(stub: pb_grpc.JournalStub, name: str) -> pb.Route:
    req = pb.ListRequest()
    req.selector.include.labels.add(name="name", value=name)
    for resp in stub.List(req, timeout=DEADLINE):
        for j in resp.journals:
            route: pb.Route = j.route
            return route
    raise AssertionError(f"journal {name} not listed")


def member_id(b: BrokerProcess) -> tuple[str, str]:
    return (b.zone, b.broker_id)


def primary_of(stub: pb_grpc.JournalStub, name: str, brokers: list[BrokerProcess]) -> BrokerProcess | None:
    route = route_of(stub, name)
    if route.primary == -1:
        return None
    m = route.members[route.primary]
    return next((b for b in brokers if member_id(b) == (m.zone, m.suffix)), None)


def append(stub: pb_grpc.JournalStub, name: str, data: bytes, timeout: float = DEADLINE) -> pb.AppendResponse:
    """One Append RPC; raises grpc.RpcError on transport or replication failure."""
    reqs = [pb.AppendRequest(journal=name), pb.AppendRequest(content=data), pb.AppendRequest()]
    resp: pb.AppendResponse = stub.Append(iter(reqs), timeout=timeout)
    return resp


def append_eventually(stub: pb_grpc.JournalStub, name: str, data: bytes) -> pb.AppendResponse:
    """Appends once the journal accepts appends (it may still be assigning or synchronising).
    Only refusals which leave nothing behind are retried."""
    def attempt() -> pb.AppendResponse | None:
        resp = append(stub, name, data)
        if resp.status in (pb.NO_JOURNAL_PRIMARY_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS):
            return None
        return resp

    resp = eventually_sync(attempt, f"{name} accepts appends", DEADLINE)
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    return resp


def wait_replicated(stub: pb_grpc.JournalStub, name: str, n: int) -> pb.Route:
    def full() -> pb.Route | None:
        r = route_of(stub, name)
        return r if len(r.members) == n and r.primary != -1 else None

    return eventually_sync(full, f"{name} assigned to {n} brokers", DEADLINE)


def read_local(stub: pb_grpc.JournalStub, name: str) -> bytes:
    """Everything a broker serves of `name` from its own replica (do_not_proxy), from offset 0
    to its write head. Content only: the test's fragments stay local (no fragment URLs)."""
    out = bytearray()
    req = pb.ReadRequest(journal=name, offset=0, block=False, do_not_proxy=True)
    for resp in stub.Read(req, timeout=DEADLINE):
        if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
            break
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert not resp.fragment_url, "expected only local fragments"
        if resp.content:
            assert resp.offset == len(out), (resp.offset, len(out))
            out += resp.content
    return bytes(out)


def http_read(broker: BrokerProcess, name: str) -> bytes:
    """The journal from offset 0 to its head, read through `broker`'s HTTP gateway (which
    proxies, and reads persisted fragments)."""
    out = bytearray()
    while True:
        try:
            with urllib.request.urlopen(f"{broker.url(name)}?offset={len(out)}", timeout=DEADLINE) as resp:  # noqa: S310
                body = resp.read()
        except urllib.error.HTTPError as err:
            if err.code == 416:
                return bytes(out)
            raise
        if not body:
            return bytes(out)
        out += body


def stop_all(brokers: list[BrokerProcess], timeout: float = DEADLINE) -> None:
    """SIGTERM every running broker at once (none can take another's journals, so each
    persists what it holds and exits); waits for every exit."""
    running = [b for b in brokers if b.is_running()]
    for b in running:
        assert b.pid is not None
        os.kill(b.pid, signal.SIGTERM)  # a second SIGTERM (as `stop` would send) means "now"
    deadline = time.monotonic() + timeout
    for b in running:
        assert b.wait_exit(max(0.0, deadline - time.monotonic())) == 0, b.log_text()[-4000:]


def stored_fragments(cluster: Cluster, name: str) -> list[tuple[int, int, bytes]]:
    """(begin, end, content) of every fragment file of `name`, checked against its name's SHA1."""
    out = []
    directory = cluster.file_root / name
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        m = FRAGMENT_NAME.match(path.name)
        if not m:
            continue
        begin, end, sha, ext = int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4) or ""
        raw = codecs.decompress(codecs.codec_for_extension(ext), path.read_bytes())
        assert len(raw) == end - begin, path.name
        assert hashlib.sha1(raw).hexdigest() == sha, path.name
        out.append((begin, end, raw))
    return out


def assert_tiles(fragments: list[tuple[int, int, bytes]], content: bytes) -> None:
    """Fragments cover [0, len(content)) without gaps, and each agrees with `content`."""
    covered = 0
    for begin, end, raw in sorted(fragments):
        assert begin <= covered, f"gap in stored fragments at [{covered}, {begin})"
        covered = max(covered, end)
        assert raw == content[begin:end], f"fragment [{begin}, {end}) differs from the journal"
    assert covered == len(content), (covered, len(content))


def assert_no_tracebacks(brokers: list[BrokerProcess]) -> None:
    for b in brokers:
        assert "Traceback" not in b.log_text(), b.log_text()[-4000:]


@dataclass
class Writer:
    """Appends unique records through one broker until stopped; remembers every acknowledged
    record with its commit offsets. Failed appends are retried as new records (a failed
    append may or may not have landed: Gazette's at-least-once)."""

    stub: pb_grpc.JournalStub
    journal: str
    tag: str
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            data = f'{{"w": "{self.tag}", "n": {n}, "pad": "{"x" * (n % 50)}"}}\n'.encode()
            try:
                resp = append(self.stub, self.journal, data, timeout=10.0)
            except grpc.RpcError:
                self.failures += 1
                time.sleep(0.05)  # back off before retrying: not a synchronisation
                continue
            if resp.status != pb.OK:
                self.failures += 1
                time.sleep(0.05)
                continue
            assert resp.commit.end - resp.commit.begin == len(data)
            self.acked.append((resp.commit.begin, resp.commit.end, data))


def assert_acked_exactly_once(content: bytes, writers: list[Writer]) -> None:
    """Every acknowledged record is at its committed offsets, and nowhere else."""
    lines = content.splitlines(keepends=True)
    counts: dict[bytes, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    for w in writers:
        last = -1
        for begin, end, data in w.acked:
            assert content[begin:end] == data, (begin, end, data)
            assert counts.get(data) == 1, (data, counts.get(data))
            assert begin > last  # a writer's acknowledged appends land in its order
            last = begin


# --- tests --------------------------------------------------------------------------------


@contextlib.contextmanager
def writing(writers: list[Writer]) -> Iterator[None]:
    """Runs each writer in a thread for the block; stops and joins them however it ends."""
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        for w in writers:
            w.stop.set()
        for t in threads:
            t.join(DEADLINE)


def wait_acked(writers: list[Writer], more: int, message: str) -> None:
    """Waits until every writer has ``more`` acknowledged appends beyond its count now."""
    before = [len(w.acked) for w in writers]
    eventually_sync(lambda: all(len(w.acked) >= n + more for w, n in zip(writers, before, strict=True)), message, DEADLINE)


def test_appends_through_any_broker_land_once_on_every_replica(cluster: Cluster, stubs: Stubs) -> None:
    brokers = start_brokers(cluster, [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")])
    name = f"repl/{uuid.uuid4().hex[:8]}"
    apply_journal(stubs(brokers[0]), name)
    route = wait_replicated(stubs(brokers[0]), name, 3)
    assert {m.zone for m in route.members} == {"zone-a", "zone-b"}
    first = append_eventually(stubs(brokers[1]), name, b'{"first": true}\n')
    assert (first.commit.begin, first.commit.end) == (0, 16)

    # Raced appends through every broker (two of them proxy to the primary).
    per_broker = 25

    def write(b: BrokerProcess) -> list[tuple[int, int, bytes]]:
        out = []
        for k in range(per_broker):
            data = f'{{"via": "{b.broker_id}", "k": {k}}}\n'.encode()
            resp = append(stubs(b), name, data)
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            out.append((resp.commit.begin, resp.commit.end, data))
        return out

    with ThreadPoolExecutor(len(brokers)) as pool:
        results = list(pool.map(write, brokers))

    commits = sorted([(first.commit.begin, first.commit.end, b'{"first": true}\n')]
                     + [c for r in results for c in r])
    expected = b"".join(d for _, _, d in commits)
    offset = 0
    for begin, end, data in commits:  # commits tile the journal: once each, one order
        assert (begin, end) == (offset, offset + len(data))
        offset = end
    for r in results:  # each writer's appends land in its order
        assert [c[0] for c in r] == sorted(c[0] for c in r)

    # Every replica serves the same content from its own spool.
    for b in brokers:
        assert read_local(stubs(b), name) == expected, b.broker_id
    assert http_read(brokers[2], name) == expected
    assert_no_tracebacks(brokers)


def grouped_appends(broker: BrokerProcess) -> float:
    """``gazette_grouped_appends_total`` of ``broker``'s metrics."""
    with urllib.request.urlopen(broker.url("/debug/metrics"), timeout=DEADLINE) as resp:  # noqa: S310
        for line in resp.read().decode().splitlines():
            if line.startswith("gazette_grouped_appends_total "):
                return float(line.split()[1])
    raise AssertionError("no gazette_grouped_appends_total metric")


def test_appends_arriving_together_commit_in_groups(cluster: Cluster, stubs: Stubs) -> None:
    """Rounds of 16 appends sent at once on one connection (our channel writes them in one
    flush), to the primary and through a broker that proxies: the primary commits them in
    groups (broker/group_commit.py), and each append is answered the range and SHA-1 of exactly
    its own content, once, on every replica."""
    brokers = start_brokers(cluster, [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")])
    name = f"repl/{uuid.uuid4().hex[:8]}"
    apply_journal(stubs(brokers[0]), name)
    wait_replicated(stubs(brokers[0]), name, 3)
    append_eventually(stubs(brokers[0]), name, b'{"first": true}\n')
    primary = primary_of(stubs(brokers[0]), name, brokers)
    assert primary is not None
    other = next(b for b in brokers if b is not primary)
    before = grouped_appends(primary)

    async def rounds(broker: BrokerProcess, tag: str) -> list[tuple[int, int, bytes, pb.SHA1Sum]]:
        channel = insecure_channel(f"127.0.0.1:{broker.port}")
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

        async def one(data: bytes) -> tuple[int, int, bytes, pb.SHA1Sum]:
            reqs = [pb.AppendRequest(journal=name), pb.AppendRequest(content=data), pb.AppendRequest()]
            resp = await stub.Append(iter(reqs), timeout=DEADLINE)
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            return resp.commit.begin, resp.commit.end, data, resp.commit.sum

        try:
            out = []
            for r in range(20):
                out += await asyncio.gather(*(one(f'{{"{tag}": {r}, "w": {w}}}\n'.encode()) for w in range(16)))
            return out
        finally:
            await channel.close()

    commits = asyncio.run(rounds(primary, "direct")) + asyncio.run(rounds(other, "proxied"))
    assert grouped_appends(primary) > before
    offset = 16
    for begin, end, data, digest in sorted(commits):
        assert (begin, end) == (offset, offset + len(data))
        assert digest == sha1_sum(data)
        offset = end
    expected = b'{"first": true}\n' + b"".join(d for _, _, d, _ in sorted(commits))
    for b in brokers:
        assert read_local(stubs(b), name) == expected, b.broker_id
    assert_no_tracebacks(brokers)


def sha1_sum(data: bytes) -> pb.SHA1Sum:
    d = hashlib.sha1(data).digest()  # Gazette's content sum
    return pb.SHA1Sum(part1=int.from_bytes(d[:8], "big"), part2=int.from_bytes(d[8:16], "big"),
                      part3=int.from_bytes(d[16:], "big"))


def test_primary_killed_mid_stream_loses_no_acknowledged_append(cluster: Cluster, stubs: Stubs) -> None:
    brokers = start_brokers(cluster, [("zone-a", "broker-a1"), ("zone-a", "broker-a2"),
                                      ("zone-b", "broker-b1"), ("zone-b", "broker-b2")])
    name = f"repl/{uuid.uuid4().hex[:8]}"
    apply_journal(stubs(brokers[0]), name, length=4096)
    wait_replicated(stubs(brokers[0]), name, 3)
    append_eventually(stubs(brokers[0]), name, b'{"first": true}\n')

    victim = eventually_sync(lambda: primary_of(stubs(brokers[0]), name, brokers), "a primary", DEADLINE)
    survivors = [b for b in brokers if b is not victim]
    writers = [Writer(stubs(b), name, b.broker_id) for b in survivors[:2]]
    with writing(writers):
        wait_acked(writers, 20, "appends flowing")
        victim.kill()  # SIGKILL mid-stream: no drain, no hand-off
        acked = [len(w.acked) for w in writers]

        def new_primary() -> BrokerProcess | None:
            p = primary_of(stubs(survivors[0]), name, brokers)
            return p if p is not None and p is not victim else None

        eventually_sync(new_primary, "a new primary once the lease expired", DEADLINE)
        eventually_sync(lambda: all(len(w.acked) >= n + 20 for w, n in zip(writers, acked, strict=True)), "appends acknowledged under the new primary", DEADLINE)

    content = http_read(survivors[0], name)
    assert content.startswith(b'{"first": true}\n')
    assert_acked_exactly_once(content, writers)
    assert all(line.startswith(b"{") and line.endswith(b"}\n") for line in content.splitlines(keepends=True))

    # Readers of every survivor agree; then, once every broker has persisted what it holds,
    # the stored fragments tile the journal.
    # (A broker that joined the route after the kill has the older content only in the store:
    # it reads it once its index has listed what the new primary persisted.)
    for b in survivors:
        def serves(b: BrokerProcess = b) -> bool:
            return http_read(b, name) == content

        eventually_sync(serves, f"{b.broker_id} serves the journal", DEADLINE)
    stop_all(survivors)
    assert_tiles(stored_fragments(cluster, name), content)
    assert_no_tracebacks(survivors)


def test_index_beyond_the_head_needs_reset_head(cluster: Cluster, stubs: Stubs) -> None:
    brokers = start_brokers(cluster, [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")])
    name = f"repl/{uuid.uuid4().hex[:8]}"
    stub = stubs(brokers[0])
    apply_journal(stub, name, refresh=1)
    wait_replicated(stub, name, 3)
    head = append_eventually(stub, name, b'{"before": 1}\n').commit.end

    # Content written beyond our head by brokers we cannot see (say, partitioned from etcd):
    # a fragment file in the store, found by the next index refresh.
    far = head + 1000
    lost = b'{"lost": "content"}\n'
    sha = hashlib.sha1(lost).hexdigest()
    directory = cluster.file_root / name
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".tmp-fragment"
    tmp.write_bytes(lost)
    tmp.rename(directory / f"{far:016x}-{far + len(lost):016x}-{sha}")

    def refused() -> bool:
        return append(stub, name, b'{"during": 1}\n').status == pb.INDEX_HAS_GREATER_OFFSET

    eventually_sync(refused, "INDEX_HAS_GREATER_OFFSET", DEADLINE)
    rc, out, err = cluster.gazctl("journals", "reset-head", "-l", f"name={name}")
    assert rc == 0, err
    resp = append(stub, name, b'{"after": 1}\n')
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    assert resp.commit.begin == far + len(lost)
    assert_no_tracebacks(brokers)


def test_replicate_rpc_refuses_bad_streams(cluster: Cluster, stubs: Stubs) -> None:
    """Replicate is a broker-to-broker RPC: anything but a well-formed stream of a route this
    broker serves gets a clear refusal, and the broker carries on."""
    (broker,) = start_brokers(cluster, [("zone-a", "broker-a1")])
    stub = stubs(broker)
    name = f"repl/{uuid.uuid4().hex[:8]}"
    apply_journal(stub, name, replication=1)
    wait_replicated(stub, name, 1)
    append_eventually(stub, name, b'{"before": 1}\n')

    def replicate(*reqs: pb.ReplicateRequest) -> list[pb.ReplicateResponse]:
        return list(stub.Replicate(iter(reqs), timeout=DEADLINE))

    def refused(code: grpc.StatusCode, needle: str, *reqs: pb.ReplicateRequest) -> None:
        with pytest.raises(grpc.RpcError) as info:
            replicate(*reqs)
        assert info.value.code() == code, info.value
        assert needle in (info.value.details() or ""), info.value.details()

    # The broker's own view of the journal, as a primary's first request would carry it.
    listed = route_of(stub, name)
    hdr = pb.Header()
    hdr.route.CopyFrom(listed)
    etcd = pb.ListRequest()
    hdr.etcd.CopyFrom(next(iter(stub.List(etcd, timeout=DEADLINE))).header.etcd)
    proposal = pb.Fragment(journal=name, begin=0, end=0, compression_codec=pb.NONE)

    refused(grpc.StatusCode.INVALID_ARGUMENT, "initial ReplicateRequest")
    refused(grpc.StatusCode.INVALID_ARGUMENT, "proposal", pb.ReplicateRequest(content=b"x"))
    refused(grpc.StatusCode.INVALID_ARGUMENT, "Header",
            pb.ReplicateRequest(proposal=proposal, acknowledge=True))
    bad_cluster = pb.Header()
    bad_cluster.CopyFrom(hdr)
    bad_cluster.etcd.cluster_id += 1
    refused(grpc.StatusCode.FAILED_PRECONDITION, "ClusterId",
            pb.ReplicateRequest(header=bad_cluster, proposal=proposal, acknowledge=True))

    # A route this broker does not serve that way: WRONG_ROUTE, with the broker's own header.
    other = pb.Header()
    other.CopyFrom(hdr)
    other.route.members.add(zone="zone-z", suffix="elsewhere")
    other.route.primary = 1
    del other.route.endpoints[:]
    (resp,) = replicate(pb.ReplicateRequest(header=other, proposal=proposal, acknowledge=True))
    assert resp.status == pb.WRONG_ROUTE
    assert [(m.zone, m.suffix) for m in resp.header.route.members] == [("zone-a", "broker-a1")]
    # A journal it is not assigned: NOT_JOURNAL_BROKER.
    ghost = pb.Fragment(journal="repl/no-such-journal", begin=0, end=0, compression_codec=pb.NONE)
    (resp,) = replicate(pb.ReplicateRequest(header=hdr, proposal=ghost, acknowledge=True))
    assert resp.status == pb.JOURNAL_NOT_FOUND

    # Still healthy: appends and reads carry on where they were.
    resp2 = append(stub, name, b'{"after": 1}\n')
    assert resp2.status == pb.OK and resp2.commit.begin == 14
    assert read_local(stub, name) == b'{"before": 1}\n{"after": 1}\n'
    assert_no_tracebacks([broker])


@pytest.mark.soak
def test_rolling_restart_under_appends(cluster: Cluster, stubs: Stubs, tmp_path: Path) -> None:
    layout = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1"), ("zone-b", "broker-b2")]
    brokers = start_brokers(cluster, layout)
    names = [f"roll/{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    for n in names:
        apply_journal(stubs(brokers[0]), n, length=8192)
    for n in names:
        wait_replicated(stubs(brokers[0]), n, 3)
        append_eventually(stubs(brokers[0]), n, b'{"first": true}\n')

    # Writers go through a broker that is not restarted meanwhile: a dedicated fifth broker
    # without capacity for journals would be cleaner, but any broker proxies; they are
    # recreated against whichever broker is up.
    gateway = cluster.add_broker("zone-c", "broker-gw", extra_args=(*LEASE, "--broker.limit", "0"))
    writers = [Writer(stubs(gateway), n, f"w{i}") for i, n in enumerate(names)]
    with writing(writers):
        for i, (zone, bid) in [*enumerate(layout)] * ROLLS:
            before = [len(w.acked) for w in writers]
            assert brokers[i].stop(DEADLINE) == 0, brokers[i].log_text()[-4000:]
            brokers[i] = cluster.add_broker(zone, bid, extra_args=LEASE)

            def flowing(before: list[int] = before) -> bool:
                return all(len(w.acked) >= n + 10 for w, n in zip(writers, before, strict=True))

            eventually_sync(flowing, f"appends flowing after restarting {bid}", DEADLINE)

    for n, w in zip(names, writers, strict=True):
        content = http_read(gateway, n)
        assert_acked_exactly_once(content, [w])
    stop_all([*brokers, gateway])
    for n in names:
        assert_tiles(stored_fragments(cluster, n), http_read_all_from_store(cluster, n))
    assert_no_tracebacks(brokers)


def http_read_all_from_store(cluster: Cluster, name: str) -> bytes:
    """The journal as the union of its stored fragments (checked to agree where they overlap)."""
    out = bytearray()
    for begin, end, raw in sorted(stored_fragments(cluster, name)):
        assert begin <= len(out), f"gap at {len(out)}"
        assert bytes(out[begin:end]) == raw[: max(0, len(out) - begin)]
        if end > len(out):
            out += raw[len(out) - begin:]
    return bytes(out)


@pytest.mark.soak
def test_repeated_primary_kills_under_appends(cluster: Cluster, stubs: Stubs) -> None:
    layout = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1"), ("zone-b", "broker-b2")]
    brokers = start_brokers(cluster, layout)
    gateway = cluster.add_broker("zone-c", "broker-gw", extra_args=(*LEASE, "--broker.limit", "0"))
    name = f"kill/{uuid.uuid4().hex[:8]}"
    apply_journal(stubs(gateway), name, length=8192)
    wait_replicated(stubs(gateway), name, 3)
    append_eventually(stubs(gateway), name, b'{"first": true}\n')
    writers = [Writer(stubs(gateway), name, f"w{i}") for i in range(2)]
    with writing(writers):
        for round_ in range(3):
            victim = eventually_sync(lambda: primary_of(stubs(gateway), name, brokers), "a primary", DEADLINE)
            before = [len(w.acked) for w in writers]
            victim.kill()
            brokers.remove(victim)
            brokers.append(cluster.add_broker(victim.zone, f"{victim.broker_id[:9]}-r{round_}", extra_args=LEASE))

            def flowing(before: list[int] = before) -> bool:
                return all(len(w.acked) >= n + 20 for w, n in zip(writers, before, strict=True))

            eventually_sync(flowing, f"appends acknowledged after kill {round_}", DEADLINE)

    content = http_read(gateway, name)
    assert_acked_exactly_once(content, writers)
    running = [b for b in brokers if b.is_running()]
    for b in running:
        def serves(b: BrokerProcess = b) -> bool:
            return http_read(b, name) == content

        eventually_sync(serves, f"{b.broker_id} serves the journal", DEADLINE)
    stop_all([*running, gateway])
    stored = http_read_all_from_store(cluster, name)
    assert stored[: len(content)] == content
    assert_no_tracebacks(running)


@pytest.mark.soak
def test_frozen_peer_is_routed_around(cluster: Cluster, stubs: Stubs) -> None:
    """A peer that stops answering while its sockets stay open (SIGSTOP: as a partition looks
    to TCP) must not hang the journal: its lease expires, the allocator replaces it, the primary
    rebuilds its pipeline over the new route, and appends go on with nothing acknowledged lost
    or doubled."""
    brokers = start_brokers(cluster, [("zone-a", "broker-a1"), ("zone-a", "broker-a2"),
                                      ("zone-b", "broker-b1"), ("zone-b", "broker-b2")])
    name = f"repl/{uuid.uuid4().hex[:8]}"
    apply_journal(stubs(brokers[0]), name, length=4096)
    wait_replicated(stubs(brokers[0]), name, 3)
    append_eventually(stubs(brokers[0]), name, b'{"first": true}\n')

    primary = eventually_sync(lambda: primary_of(stubs(brokers[0]), name, brokers), "a primary", DEADLINE)
    route = route_of(stubs(primary), name)
    members = {(m.zone, m.suffix) for m in route.members}
    frozen = next(b for b in brokers if b is not primary and member_id(b) in members)
    others = [b for b in brokers if b is not frozen]
    writers = [Writer(stubs(b), name, b.broker_id) for b in others[:2]]
    pid = frozen.pid
    assert pid is not None
    try:
        with writing(writers):
            wait_acked(writers, 20, "appends flowing")
            os.kill(pid, signal.SIGSTOP)
            wait_acked(writers, 20, "appends acknowledged with the peer frozen")
            assert member_id(frozen) not in {(m.zone, m.suffix) for m in route_of(stubs(primary), name).members}
    finally:
        os.kill(pid, signal.SIGCONT)
        frozen.kill()

    content = http_read(others[0], name)
    assert content.startswith(b'{"first": true}\n')
    assert_acked_exactly_once(content, writers)

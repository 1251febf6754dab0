"""Appender, append() and route following against the fake Journal service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from gazette.client import Appender, AppendError, JournalClient, TransportError, append
from gazette.client.route_cache import RouteCache, pick
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSelector, LabelSet
from gazette.testing.fake_broker import FakeBroker, FakeCluster, start_broker


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    cluster = FakeCluster()
    cluster.create("a/journal")
    b = await start_broker(cluster)
    yield b
    await b.stop()


@pytest.fixture
async def client(broker: FakeBroker) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.endpoint) as c:
        yield c


async def no_sleep(_: float) -> None:
    pass


async def test_appender_streams_and_commits(broker: FakeBroker, client: JournalClient) -> None:
    app = Appender(client, "a/journal")
    await app.write(b"hello ")
    await app.write(memoryview(b"world\n"))
    resp = await app.commit()
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 12)
    assert bytes(broker.cluster.journals["a/journal"].fragments[0].content) == b"hello world\n"


async def test_aborted_append_commits_nothing(broker: FakeBroker, client: JournalClient) -> None:
    with pytest.raises(RuntimeError):
        async with Appender(client, "a/journal") as app:
            await app.write(b"never")
            raise RuntimeError("boom")
    assert broker.cluster.journals["a/journal"].head == 0


async def test_append_with_registers(broker: FakeBroker, client: JournalClient) -> None:
    owner = LabelSet.of("author", "me")
    resp = await append(client, "a/journal", b"one\n", union_registers=owner.to_proto())
    assert LabelSet.from_proto(resp.registers) == owner

    resp = await append(client, "a/journal", [b"two", b"\n"],
                        check_registers=LabelSelector.parse("author=me").to_proto())
    assert (resp.commit.begin, resp.commit.end) == (4, 8)

    with pytest.raises(AppendError) as exc:
        await append(client, "a/journal", b"three\n",
                     check_registers=LabelSelector.parse("author=you").to_proto())
    assert exc.value.status == pb.REGISTER_MISMATCH
    assert "author=you" in str(exc.value) and "author=me" in str(exc.value)
    assert exc.value.response is not None

    resp = await append(client, "a/journal", None, subtract_registers=owner.to_proto())
    assert len(resp.registers.labels) == 0
    assert broker.cluster.journals["a/journal"].head == 8


async def test_append_offset_check(broker: FakeBroker, client: JournalClient) -> None:
    await append(client, "a/journal", b"abc")
    with pytest.raises(AppendError, match="WRONG_APPEND_OFFSET"):
        await append(client, "a/journal", b"x", offset=1)
    resp = await append(client, "a/journal", b"d", offset=3)
    assert resp.commit.end == 4


async def test_append_retries_transient_errors_when_replayable(broker: FakeBroker, client: JournalClient) -> None:
    broker.append_failures = [grpc.StatusCode.UNAVAILABLE, pb.NOT_JOURNAL_PRIMARY_BROKER]
    resp = await append(client, "a/journal", b"payload", sleep=no_sleep)
    assert resp.commit.end == 7
    assert [c for c in broker.calls if c[0] == "Append"] == [("Append", "a/journal")] * 3


async def test_append_does_not_replay_a_consumed_iterator(broker: FakeBroker, client: JournalClient) -> None:
    broker.append_failures = [grpc.StatusCode.UNAVAILABLE]

    def gen() -> Iterator[bytes]:
        yield b"once"

    with pytest.raises(TransportError, match="UNAVAILABLE"):
        await append(client, "a/journal", gen(), sleep=no_sleep)


async def test_append_does_not_retry_permanent_errors(broker: FakeBroker, client: JournalClient) -> None:
    broker.append_failures = [pb.SUSPENDED]
    with pytest.raises(AppendError, match="SUSPENDED"):
        await append(client, "a/journal", b"x", sleep=no_sleep)
    with pytest.raises(AppendError, match="JOURNAL_NOT_FOUND"):
        await append(client, "no/such", b"x", sleep=no_sleep)


async def test_route_cache_follows_response_headers(broker: FakeBroker) -> None:
    # A second broker sharing the journals; the first advertises it as the primary.
    other = await start_broker(broker.cluster, suffix="other")
    broker.route_to = other
    try:
        async with JournalClient(broker.endpoint) as client:
            await append(client, "a/journal", b"first")  # Default address; learns the route.
            route = client.routes.route("a/journal")
            assert route is not None and list(route.endpoints) == [other.endpoint]
            await append(client, "a/journal", b"second")  # Direct to the primary.
            assert [c[0] for c in broker.calls] == ["Append"]
            assert [c[0] for c in other.calls] == ["Append"]

            # When the routed broker goes away, the next attempt falls back to the default.
            await other.stop()
            with pytest.raises(TransportError, match="UNAVAILABLE"):
                await append(client, "a/journal", b"x", max_attempts=1)
            assert client.routes.route("a/journal") is None
            broker.route_to = None
            await append(client, "a/journal", b"third", sleep=no_sleep)
            assert [c[0] for c in broker.calls] == ["Append", "Append"]
    finally:
        await other.stop()


def test_route_cache_expiry_and_pick() -> None:
    now = [0.0]
    rc = RouteCache(size=2, ttl=10, clock=lambda: now[0])
    route = pb.Route(members=[pb.ProcessSpec.ID(zone="a", suffix="x"),
                              pb.ProcessSpec.ID(zone="b", suffix="y")],
                     endpoints=["http://x:1", "http://y:2"], primary=1)
    rc.update("j", route)
    assert rc.route("j") == route
    assert pick(route, True) == "http://y:2"
    assert pick(route, False, zone="a") == "http://x:1"
    assert pick(route, False, connected={"http://x:1"}) == "http://x:1"
    assert pick(pb.Route(primary=-1), False) is None
    rc.update("k", route)
    rc.update("l", route)  # Evicts the least recently used ("j").
    assert rc.route("j") is None and len(rc) == 2
    now[0] = 11
    assert rc.route("k") is None
    rc.update("l", pb.Route())
    assert rc.route("l") is None


@pytest.mark.parametrize("one_shot", [True, False])
async def test_append_of_content_at_hand_commits_it_in_order(broker: FakeBroker, client: JournalClient,
                                                            monkeypatch: pytest.MonkeyPatch, one_shot: bool) -> None:
    # Content up to ONE_SHOT_BYTES goes as one batch of request messages (Appender.commit_all);
    # larger content streams a message at a time. Both commit the same bytes, in order, with
    # chunks over MAX_CHUNK split and empty chunks skipped.
    from gazette.client import appender

    monkeypatch.setattr(appender, "MAX_CHUNK", 1000)
    monkeypatch.setattr(appender, "ONE_SHOT_BYTES", 1 << 20 if one_shot else 10)
    chunks = [b"a" * 2500, b"", bytearray(b"b" * 10), memoryview(b"c" * 1000), b"d"]
    resp = await append(client, "a/journal", chunks)
    want = b"".join(bytes(c) for c in chunks)
    assert (resp.commit.begin, resp.commit.end) == (0, len(want))
    assert bytes(broker.cluster.journals["a/journal"].fragments[0].content) == want

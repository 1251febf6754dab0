"""TLS, mTLS and bearer-token capabilities on real brokers (issue: security and hardening).

Two brokers serve one module-scoped cluster with mTLS on their port (a client CA), TLS and
client certificates on their dials to each other, and ``--auth-keys``. Tokens are signed here
with PyJWT as a third party would (Gazette's claims: ``cap``, ``sel``, ``iat``, ``exp``).

The authorization matrix: every Journal RPC and gateway method, with a token for each single
capability and with missing, expired and badly signed tokens; permitted calls succeed, the
others are refused (UNAUTHENTICATED/PERMISSION_DENIED, 401/403) and change nothing. A token
scoped by a selector sees only what it selects: other journals are unlisted, not found to
read or append, and cannot be applied.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
import trustme
from consumer_support import CountingApp
from google.protobuf.duration_pb2 import Duration

from gazette import auth
from gazette.auth import BearerAuth, KeyedAuth
from gazette.client.journal_client import JournalClient, channel_for
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import consumer_pb2_grpc as pc_grpc
from gazette.protocol import protocol_pb2 as pb
from gazette.rpc.channel import insecure_channel
from gazette.rpc.tls import ClientTLS, ServerTLS
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix
from gazette.testing.etcd_process import EtcdProcess

KEY = b"the cluster's signing key, 32+ bytes"
DEADLINE = 30.0


@dataclass
class PKI:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_tls(self, *, with_cert: bool = True) -> ClientTLS:
        if with_cert:
            return ClientTLS(str(self.ca), str(self.client_cert), str(self.client_key))
        return ClientTLS(str(self.ca))

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _write_pki(d: Path) -> PKI:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.example")
    pki = PKI(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")
    ca.cert_pem.write_to_path(str(pki.ca))
    for cert, chain, key in ((server, pki.server_cert, pki.server_key), (client, pki.client_cert, pki.client_key)):
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
    return pki


def token(cap: int, selector: str = "", *, ttl: float = 3600, key: bytes = KEY,
          issued: float | None = None) -> str:
    """A token as any HS256 signer makes it (Gazette's claims)."""
    now = time.time() if issued is None else issued
    sel = auth._selector_json(auth.LabelSelector.parse(selector)) if selector else {
        "include": {"labels": None}, "exclude": {"labels": None}}
    return jwt.encode({"cap": cap, "sel": sel, "iat": int(now), "exp": int(now + ttl)}, key, algorithm="HS256")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return _write_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(etcd_server: EtcdProcess, pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    args = (
        "--broker.server-cert-file", str(pki.server_cert), "--broker.server-cert-key-file", str(pki.server_key),
        "--broker.server-ca-file", str(pki.ca),
        "--broker.peer-cert-file", str(pki.client_cert), "--broker.peer-cert-key-file", str(pki.client_key),
        "--broker.peer-ca-file", str(pki.ca),
        "--auth-keys", base64.b64encode(KEY).decode(),
    )
    with Cluster(etcd_server.url, unique_prefix(), tmp_path_factory.mktemp("secure")) as c:
        for name in ("guarded-owl", "guarded-elk"):
            c.add_broker("local", name, extra_args=args, ssl_context=pki.ssl_context())
        yield c


def _spec(name: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=2)
    spec.labels.labels.add(name="content-type", value="application/x-ndjson")
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.CopyFrom(Duration(seconds=60))
    return spec


def client(c: Cluster, pki: PKI, tok: str | None, *, address: str | None = None,
           with_cert: bool = True) -> JournalClient:
    return JournalClient(address or c.address, tls=pki.client_tls(with_cert=with_cert),
                         auth=BearerAuth(tok) if tok else None)


async def _append(stub: Any, journal: str, data: bytes) -> pb.AppendResponse:
    call = stub.Append()
    await call.write(pb.AppendRequest(journal=journal))
    await call.write(pb.AppendRequest(content=data))
    await call.write(pb.AppendRequest())
    await call.done_writing()
    resp: pb.AppendResponse = await call
    return resp


async def _read_all(stub: Any, journal: str) -> tuple[int, bytes]:
    """(status, content) of a non-blocking read from offset 0."""
    out = b""
    status = pb.OK
    async for resp in stub.Read(pb.ReadRequest(journal=journal, offset=0, block=False)):
        if resp.status != pb.OK:
            if resp.status != pb.OFFSET_NOT_YET_AVAILABLE:  # else: read to the write head
                status = resp.status
            break
        out += resp.content
    return status, out


@pytest.fixture(scope="module")
def journals(secure: Cluster, pki: PKI) -> dict[str, str]:
    """a/<id> and b/<id>, each with one line."""
    run = uuid.uuid4().hex[:8]
    names = {"a": f"a/{run}", "b": f"b/{run}"}
    asyncio.run(_create(secure, pki, names))
    return names


async def _create(secure: Cluster, pki: PKI, names: dict[str, str]) -> None:
    async with client(secure, pki, token(auth.ALL)) as jc:
        req = pb.ApplyRequest()
        for name in names.values():
            req.changes.add(upsert=_spec(name), expect_mod_revision=0)
        resp = await jc.stub().Apply(req)
        assert resp.status == pb.OK
        for name in names.values():
            # The journal is assigned within a few allocator rounds: poll with a deadline (a
            # count of attempts ran out in 0.1 s on a busy machine, before the first round).
            deadline = time.monotonic() + 60
            while True:
                r = await _append(jc.stub(), name, b'{"hello": 1}\n')
                if r.status == pb.OK or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)  # polling the broker's assignment
            assert r.status == pb.OK, pb.Status.Name(r.status)


async def _state(c: Cluster, pki: PKI, names: dict[str, str]) -> tuple[list[str], dict[str, bytes]]:
    """Every journal name, and each test journal's content: what a refused call must not change."""
    async with client(c, pki, token(auth.ALL)) as jc:
        listed = [j.spec.name async for r in jc.stub().List(pb.ListRequest()) for j in r.journals]
        content = {n: (await _read_all(jc.stub(), n))[1] for n in names.values()}
    return sorted(listed), content


# -- the matrix ------------------------------------------------------------------------

Call = Callable[[Any, dict[str, str]], Awaitable[Any]]


async def _list(stub: Any, names: dict[str, str]) -> Any:
    return [r async for r in stub.List(pb.ListRequest())]


async def _apply(stub: Any, names: dict[str, str]) -> Any:
    req = pb.ApplyRequest()
    req.changes.add(upsert=_spec(f"a/applied-{uuid.uuid4().hex[:8]}"), expect_mod_revision=0)
    return await stub.Apply(req)


async def _read(stub: Any, names: dict[str, str]) -> Any:
    return await _read_all(stub, names["a"])


async def _append_a(stub: Any, names: dict[str, str]) -> Any:
    return await _append(stub, names["a"], b'{"matrix": 1}\n')


async def _fragments(stub: Any, names: dict[str, str]) -> Any:
    return await stub.ListFragments(pb.FragmentsRequest(journal=names["a"]))


async def _health(stub: Any, names: dict[str, str]) -> Any:
    return await stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store="file:///"))


async def _replicate(stub: Any, names: dict[str, str]) -> Any:
    call = stub.Replicate()
    await call.write(pb.ReplicateRequest())  # malformed: a permitted caller is refused for that
    await call.done_writing()
    return [r async for r in call]


RPCS: dict[str, tuple[int, Call, bool]] = {
    # name: (capability needed, call, whether it changes state when permitted)
    "List": (auth.LIST, _list, False),
    "Apply": (auth.APPLY, _apply, True),
    "Read": (auth.READ, _read, False),
    "Append": (auth.APPEND, _append_a, True),
    "ListFragments": (auth.READ, _fragments, False),
    "FragmentStoreHealth": (auth.APPLY, _health, False),  # Gazette: READ (see broker/service.py)
    "Replicate": (auth.REPLICATE, _replicate, False),
}
CAPS = {"LIST": auth.LIST, "APPLY": auth.APPLY, "READ": auth.READ, "APPEND": auth.APPEND,
        "REPLICATE": auth.REPLICATE}
BAD_TOKENS: dict[str, Callable[[], str | None]] = {
    "missing": lambda: None,
    "expired": lambda: token(auth.ALL, ttl=60, issued=time.time() - 3600),
    "badly signed": lambda: token(auth.ALL, key=b"some other key, also 32 bytes long"),
    "not a JWT": lambda: "not-a-token",
    "issued in the future": lambda: token(auth.ALL, issued=time.time() + 3600),
}


async def _outcome(jc: JournalClient, call: Call, names: dict[str, str]) -> tuple[str, Any]:
    try:
        return "ok", await call(jc.stub(), names)
    except grpc.aio.AioRpcError as err:
        return err.code().name, err.details()


@pytest.mark.parametrize("rpc", sorted(RPCS))
async def test_each_rpc_needs_its_capability(secure: Cluster, pki: PKI, journals: dict[str, str], rpc: str) -> None:
    need, call, changes = RPCS[rpc]
    for cap_name, cap in CAPS.items():
        before = await _state(secure, pki, journals)
        async with client(secure, pki, token(cap)) as jc:
            code, detail = await _outcome(jc, call, journals)
        if cap & need:
            # Permitted: served (Replicate's malformed request is refused for what it is).
            assert code in ("ok", "INVALID_ARGUMENT", "FAILED_PRECONDITION"), (rpc, cap_name, code, detail)
            assert code != "PERMISSION_DENIED"
        else:
            assert code == "PERMISSION_DENIED", (rpc, cap_name, code, detail)
            assert "capability" in detail
            assert await _state(secure, pki, journals) == before, (rpc, cap_name)
    for what, make in BAD_TOKENS.items():
        before = await _state(secure, pki, journals)
        async with client(secure, pki, make()) as jc:
            code, detail = await _outcome(jc, call, journals)
        assert code == "UNAUTHENTICATED", (rpc, what, code, detail)
        assert await _state(secure, pki, journals) == before, (rpc, what)
    if changes:
        async with client(secure, pki, token(need)) as jc:
            assert (await _outcome(jc, call, journals))[0] == "ok"


async def test_a_selector_scopes_every_rpc(secure: Cluster, pki: PKI, journals: dict[str, str]) -> None:
    a, b = journals["a"], journals["b"]
    before = await _state(secure, pki, journals)
    async with client(secure, pki, token(auth.ALL, "prefix=a/")) as jc:
        stub = jc.stub()
        listed = [j.spec.name for r in await _list(stub, journals) for j in r.journals]
        assert a in listed and b not in listed and all(n.startswith("a/") for n in listed)
        assert (await _read_all(stub, b))[0] == pb.JOURNAL_NOT_FOUND
        assert (await _append(stub, b, b'{"sneaky": 1}\n')).status == pb.JOURNAL_NOT_FOUND
        assert (await stub.ListFragments(pb.FragmentsRequest(journal=b))).status == pb.JOURNAL_NOT_FOUND
        for change in ({"upsert": _spec(f"b/new-{uuid.uuid4().hex[:6]}"), "expect_mod_revision": 0},
                       {"delete": b, "expect_mod_revision": -1}):
            req = pb.ApplyRequest()
            req.changes.add(**change)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Apply(req)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert b.split("/")[0] in (err.value.details() or "")
        assert await _state(secure, pki, journals) == before
        # What it selects it may use.
        assert (await _read_all(stub, a))[0] == pb.OK
        assert (await _append(stub, a, b'{"scoped": 1}\n')).status == pb.OK


async def test_peers_replicate_and_proxy_over_mtls_with_signed_tokens(
        secure: Cluster, pki: PKI, journals: dict[str, str]) -> None:
    """Replication 2 journals append only if the primary's Replicate to its peer (TLS, its
    client certificate, a token it signs) succeeds; an append sent to each broker is proxied
    by the one that is not primary."""
    for broker in secure.brokers:
        async with client(secure, pki, token(auth.APPEND | auth.READ), address=broker.address) as jc:
            line = f'{{"via": "{broker.broker_id}"}}\n'.encode()
            assert (await _append(jc.stub(), journals["a"], line)).status == pb.OK
            assert line in (await _read_all(jc.stub(), journals["a"]))[1]


async def test_mtls_refuses_clients_without_a_certificate(secure: Cluster, pki: PKI, journals: dict[str, str]) -> None:
    async with client(secure, pki, token(auth.ALL), with_cert=False) as jc:
        code, _ = await _outcome(jc, _list, journals)
    assert code == "UNAVAILABLE"
    plain = secure.address.replace("https://", "http://")
    async with JournalClient(plain, auth=BearerAuth(token(auth.ALL))) as jc:
        code, _ = await _outcome(jc, _list, journals)
    assert code == "UNAVAILABLE"


def test_mtls_refuses_https_without_a_certificate(secure: Cluster, pki: PKI) -> None:
    # TLS 1.3: the client finishes its side of the handshake, then the server's alert ends it.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"{secure.address}/debug/ready",  # noqa: S310 - loopback
                               context=ssl.create_default_context(cafile=str(pki.ca)), timeout=DEADLINE)


def _http(c: Cluster, pki: PKI, method: str, path: str, tok: str | None, body: bytes | None = None) -> int:
    req = urllib.request.Request(f"{c.address}/{path}", data=body, method=method)
    if tok:
        req.add_header("Authorization", f"Bearer {tok}")
    try:
        with urllib.request.urlopen(req, context=pki.ssl_context(), timeout=DEADLINE) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


async def test_gateway_needs_read_and_append(secure: Cluster, pki: PKI, journals: dict[str, str]) -> None:
    a, b = journals["a"], journals["b"]
    before = await _state(secure, pki, journals)
    read = f"{a}?offset=0&block=false"
    assert _http(secure, pki, "GET", read, None) == 401
    assert _http(secure, pki, "GET", read, token(auth.ALL, key=b"a wrong key of thirty-two bytes!")) == 401
    assert _http(secure, pki, "GET", read, token(auth.APPEND)) == 403
    assert _http(secure, pki, "GET", f"{b}?offset=0&block=false", token(auth.READ, "prefix=a/")) == 404
    assert _http(secure, pki, "PUT", a, None, b'{"gw": 1}\n') == 401
    assert _http(secure, pki, "PUT", a, token(auth.READ), b'{"gw": 1}\n') == 403
    assert _http(secure, pki, "PUT", b, token(auth.APPEND, "prefix=a/"), b'{"gw": 1}\n') == 404
    assert await _state(secure, pki, journals) == before
    assert _http(secure, pki, "GET", read, token(auth.READ)) == 206
    assert _http(secure, pki, "PUT", a, token(auth.APPEND), b'{"gw": 2}\n') == 204


def test_gazctl_speaks_https_with_a_token(secure: Cluster, pki: PKI, journals: dict[str, str]) -> None:
    env = {"BROKER_TRUSTED_CA_FILE": str(pki.ca), "BROKER_CERT_FILE": str(pki.client_cert),
           "BROKER_CERT_KEY_FILE": str(pki.client_key)}
    ok = secure.gazctl("journals", "list", "-l", "prefix=a/",
                       env={**env, "BROKER_AUTH_TOKEN": token(auth.LIST)})
    assert ok.rc == 0, ok.stderr
    assert journals["a"] in ok.stdout and journals["b"] not in ok.stdout
    signed = secure.gazctl("journals", "list", "-l", "prefix=b/",
                           env={**env, "BROKER_AUTH_KEYS": base64.b64encode(KEY).decode()})
    assert signed.rc == 0, signed.stderr
    assert journals["b"] in signed.stdout
    refused = secure.gazctl("journals", "list", "-l", "prefix=a/", env=env)
    assert refused.rc == 1
    assert "UNAUTHENTICATED" in refused.stderr or "missing or empty Authorization" in refused.stderr
    bad_ca = secure.gazctl("journals", "list", env={**env, "BROKER_TRUSTED_CA_FILE": "/nonexistent/ca.pem"})
    assert bad_ca.rc == 1 and "/nonexistent/ca.pem" in bad_ca.stderr


def test_grpcio_fallback_serves_tls(etcd_server: EtcdProcess, pki: PKI, tmp_path: Path) -> None:
    """With GAZETTE_RPC=grpcio the TLS port relays gRPC to grpcio through the loop."""
    args = ("--broker.server-cert-file", str(pki.server_cert), "--broker.server-cert-key-file", str(pki.server_key))
    with Cluster(etcd_server.url, unique_prefix(), tmp_path) as c:
        c.add_broker("local", "relay-bat", extra_args=args, extra_env={"GAZETTE_RPC": "grpcio"},
                     ssl_context=ssl.create_default_context(cafile=str(pki.ca)))
        env = {"BROKER_TRUSTED_CA_FILE": str(pki.ca)}
        name = f"tls/{uuid.uuid4().hex[:8]}"
        spec = _spec(name)
        spec.replication = 1
        applied = c.gazctl("journals", "apply", stdin=_yaml(spec), env=env)
        assert applied.rc == 0, applied.stderr
        for _ in range(50):
            put = c.gazctl("journals", "append", "-l", f"name={name}", stdin='{"relayed": 1}\n', env=env)
            if put.rc == 0:
                break
        assert put.rc == 0, put.stderr
        got = c.gazctl("journals", "read", "-l", f"name={name}", env=env)
        assert got.rc == 0 and '{"relayed": 1}' in got.stdout, got.stderr


def _yaml(spec: pb.JournalSpec) -> str:
    return (f"name: {spec.name}\nreplication: {spec.replication}\n"
            "labels:\n  - name: content-type\n    value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [\"file:///\"]\n"
            "  refresh_interval: 1m\n")


# -- consumers -----------------------------------------------------------------------------

SHARD_CALLS: dict[str, tuple[int, Callable[[Any, str], Awaitable[Any]]]] = {
    "List": (auth.LIST, lambda s, sid: s.List(pc.ListRequest())),
    "Stat": (auth.READ, lambda s, sid: s.Stat(pc.StatRequest(shard=sid))),
    "GetHints": (auth.READ, lambda s, sid: s.GetHints(pc.GetHintsRequest(shard=sid))),
    "Unassign": (auth.APPLY, lambda s, sid: s.Unassign(pc.UnassignRequest(shards=[sid], dry_run=True))),
}


@pytest.mark.timeout(120)
async def test_consumer_serves_tls_and_tokens_and_dials_brokers_with_them(
        secure: Cluster, pki: PKI, journals: dict[str, str]) -> None:
    """A consumer with mTLS on its port and --auth-keys, reading the secure brokers over TLS
    with tokens it signs: its Shard API needs Gazette's capabilities, scoped by the shard id."""
    run = uuid.uuid4().hex[:6]
    source = f"a/in-{run}"
    async with client(secure, pki, token(auth.ALL)) as jc:
        req = pb.ApplyRequest()
        req.changes.add(upsert=_spec(source), expect_mod_revision=0)
        assert (await jc.stub().Apply(req)).status == pb.OK
    keys = base64.b64encode(KEY).decode()
    app = CountingApp()
    proc = ConsumerProcess(ConsumerConfig(
        port=0, broker_address=secure.address, etcd_address=secure.etcd_url,
        etcd_prefix=unique_prefix("/gazette-test-consumers"), etcd_lease=5,
        tls=ServerTLS(str(pki.server_cert), str(pki.server_key), str(pki.ca)),
        broker_tls=pki.client_tls(), auth_keys=keys, broker_auth=KeyedAuth(keys)), app)
    task = asyncio.create_task(proc.run())
    try:
        async with asyncio.timeout(30):
            await proc.ready.wait()
        assert proc.endpoint.startswith("https://")

        def shards(tok: str | None) -> Any:
            ch = channel_for(proc.endpoint, insecure_channel, [], pki.client_tls(),
                             BearerAuth(tok) if tok else None)
            return ch, pc_grpc.ShardStub(ch)  # type: ignore[no-untyped-call]

        mine, theirs = f"mine-{run}", f"theirs-{run}"
        ch, stub = shards(token(auth.APPLY))
        req = pc.ApplyRequest()
        for sid in (mine, theirs):
            change = req.changes.add(upsert=pc.ShardSpec(id=sid))
            change.upsert.sources.add(journal=source)
            change.upsert.max_txn_duration.seconds = 1
        assert (await stub.Apply(req)).status == pc.Status.OK  # sources checked with the brokers
        await ch.close()
        # Each RPC needs its capability; tokens missing or wrong are refused.
        for name, (need, call) in SHARD_CALLS.items():
            for cap in CAPS.values():
                ch, stub = shards(token(cap))
                try:
                    await call(stub, mine)
                    code = "ok"
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                finally:
                    await ch.close()
                assert code == ("ok" if cap & need else "PERMISSION_DENIED"), (name, cap, code)
            ch, stub = shards(None)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(stub, mine)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            await ch.close()
        # A token scoped to mine-* sees only mine.
        ch, stub = shards(token(auth.ALL, f"id:prefix=mine-{run}"))
        listed = [s.spec.id for s in (await stub.List(pc.ListRequest())).shards]
        assert listed == [mine]
        assert (await stub.Stat(pc.StatRequest(shard=theirs))).status == pc.Status.SHARD_NOT_FOUND
        assert (await stub.GetHints(pc.GetHintsRequest(shard=theirs))).status == pc.Status.SHARD_NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Unassign(pc.UnassignRequest(shards=[theirs]))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        delete = pc.ApplyRequest()
        delete.changes.add(delete=theirs, expect_mod_revision=-1)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Apply(delete)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The shard reads the brokers over TLS with its own tokens: it counts what we append.
        async with client(secure, pki, token(auth.APPEND)) as jc:
            assert (await _append(jc.stub(), source, b'{"key": "k"}\n')).status == pb.OK
        async with asyncio.timeout(60):
            while True:
                if app.counts["k"] == 2:  # both shards read the one source
                    break
                await asyncio.sleep(0.05)  # polling the app's counts, not synchronisation
        await ch.close()
    finally:
        proc.stop()
        async with asyncio.timeout(30):
            await task

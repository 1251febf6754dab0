"""An application's own flags, gRPC service and HTTP routes on the consumer's port
(Gazette's NewConfig/InitApplication), its route resolving shards through the Resolver
(read-your-writes), and the port's readiness and ``gazette_shard_*`` metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from consumer_support import CountingApp, journals_yaml

from gazette.client import AppendService, JournalClient
from gazette.consumer.initialize import InitArgs
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.consumer.run import config_from_args, consumer_parser
from gazette.message import JSONMessage, Publisher
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol import protocol_pb2_grpc as pb_grpc
from gazette.rpc.channel import insecure_channel
from gazette.testing.cluster import Cluster
from gazette.testing.etcd import unique_prefix


class _Journals(pb_grpc.JournalServicer):
    """The app's own gRPC service (any generated servicer works; this one answers List)."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    async def List(self, request: pb.ListRequest, context: Any) -> Any:
        resp = pb.ListResponse(status=pb.OK)
        resp.journals.add().spec.name = f"{self.greeting}/journal"
        yield resp


class ServingApp(CountingApp):
    def __init__(self) -> None:
        super().__init__()
        self.args: InitArgs | None = None

    def add_flags(self, parser: Any) -> None:
        parser.add_argument("--greeting", default="hello", help="What the app's service says")

    async def init_application(self, args: InitArgs) -> None:
        assert args.config is not None
        self.args = args
        args.add_service(pb.DESCRIPTOR.services_by_name["Journal"], _Journals(args.config.greeting))

        async def count(request: web.Request) -> web.Response:
            shard = request.query["shard"]
            through = {k: int(v) for k, v in request.query.items() if k.startswith("in/")}
            res = await args.resolver.resolve(shard, read_through=through)
            if res.status != pc.Status.OK:
                return web.Response(status=404, text=pc.Status.Name(res.status))  # type: ignore[arg-type]
            if res.shard is None:
                return web.Response(status=421, text=res.endpoint)  # the app would proxy here
            return web.Response(text=str(self.counts[request.query["key"]]))

        args.routes.append(web.get("/count", count))


@pytest.mark.timeout(120)
async def test_app_flags_services_routes_and_readiness(cluster: Cluster) -> None:
    cluster.add_broker("local", "lively-lynx")
    rc, _, err = cluster.gazctl("journals", "apply", stdin=journals_yaml("part-000"))
    assert rc == 0, err
    prefix = unique_prefix("/gazette-test-app-init")
    app = ServingApp()
    ns = consumer_parser(app, "test").parse_args([
        "--consumer.port", "0", "--consumer.id", "app-proc", "--broker.address", cluster.broker.address,
        "--etcd.address", cluster.etcd_url, "--etcd.prefix", prefix, "--etcd.lease", "5s",
        "--greeting", "bonjour"])
    config: ConsumerConfig = config_from_args(ns)
    proc = ConsumerProcess(config, app)
    task = asyncio.create_task(proc.run())
    try:
        async with asyncio.timeout(30):
            await proc.ready.wait()
        base = f"http://127.0.0.1:{proc.bound_port}"
        channel = insecure_channel(f"127.0.0.1:{proc.bound_port}")
        try:
            listed = [r async for r in pb_grpc.JournalStub(channel).List(pb.ListRequest())]  # type: ignore[no-untyped-call]
            assert listed[0].journals[0].spec.name == "bonjour/journal"
        finally:
            await channel.close()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/debug/ready") as r:
                assert r.status == 200  # announced, and no shard assigned yet
            req = pc.ApplyRequest()
            ch = req.changes.add(upsert=pc.ShardSpec(id="count-000"))
            ch.upsert.sources.add(journal="in/part-000")
            ch.upsert.max_txn_duration.seconds = 1
            from gazette.consumer.client import ShardClient

            async with ShardClient(proc.endpoint) as shards:
                await shards.apply(req)
            async with asyncio.timeout(30):
                while "count-000" not in proc.shards:  # assigned by the allocator shortly
                    await proc.wait_reconciled()
            async with JournalClient(cluster.broker.address) as client, AppendService(client) as svc:
                pub = Publisher(svc)
                for _ in range(50):
                    await pub.publish_committed(lambda m: ("in/part-000", "application/x-ndjson"),
                                                JSONMessage(key="k"))
                await svc.flush()
                head = await _head(client, "in/part-000")
            # Read-your-writes through the app's route: answers once a transaction read through.
            async with http.get(f"{base}/count", params={"shard": "count-000", "key": "k",
                                                          "in/part-000": str(head)}) as r:
                assert r.status == 200 and await r.text() == "50"
            async with http.get(f"{base}/count", params={"shard": "nope", "key": "k"}) as r:
                assert r.status == 404 and await r.text() == "SHARD_NOT_FOUND"
            async with http.get(f"{base}/debug/ready") as r:
                assert r.status == 200
            async with http.get(f"{base}/debug/metrics") as r:
                text = await r.text()
            assert 'gazette_shard_transactions_total{shard="count-000"}' in text
            assert 'gazette_shard_read_messages_total{shard="count-000"}' in text
            assert 'gazette_shard_up{shard="count-000",status="PRIMARY"} 1.0' in text
            assert f'gazette_shard_read_head{{journal="in/part-000",shard="count-000"}} {float(head)}' in text
            assert 'gazette_shard_read_lag_bytes{journal="in/part-000",shard="count-000"} 0.0' in text
    finally:
        proc.stop()
        async with asyncio.timeout(30):
            await task


async def _head(client: JournalClient, journal: str) -> int:
    from gazette.cli.gazctl.shards.list import write_head

    return await write_head(client, journal)

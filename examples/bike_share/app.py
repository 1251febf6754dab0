"""The bike-share consumer application: cycles found in rides, exactly once.

Run it with ``gazette consume --app examples.bike_share.app:BikeShare`` (the repository root on
``PYTHONPATH``; ``--postgres URL`` or ``BIKE_SHARE_POSTGRES`` for shards labelled
``store=postgres``). Each shard reads a ``rides/part-NNN`` journal of CSV rides and, per ride,
in the store's own transaction: loads it into ``rides``, keeps the bike's ``WINDOW`` most
recent rides, and runs the cycle query (see ``sql``); a cycle found is published, uncommitted,
as a ``Cycle`` to ``cycles/part-NNN`` (by bike). The transaction commits with its checkpoint,
so every ride is loaded and every cycle published exactly once.

``GET /api/bikes?id=N`` on any consumer process answers with the bike's rides in the window,
one JSON object per line: the process maps the bike to its rides journal (as ``gazctl
journals append --mapping modulo`` did), that journal to the shard reading it, and resolves
the shard; a process that is not its primary proxies the request to the one that is.

Invariants: a ride that is not a 16-column record with numeric ids is logged with its journal
offset, counted (``bike_share_malformed_rides_total``) and skipped, by this app's choice; any
other failure fails the shard (a framework error is never hidden). Results do not depend on
the store: times are published as ISO 8601 UTC with milliseconds.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web
from google.protobuf import json_format
from prometheus_client import Counter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from examples.bike_share import sql
from examples.bike_share.messages import (
    CYCLE_TYPE,
    MIN_CYCLE,
    RIDE_TYPE,
    WINDOW,
    BikeShareError,
    Cycle,
    iso_ms,
)
from gazette.client import list_journals
from gazette.consumer import (
    InitArgs,
    Shard,
    ShardPublisher,
    SQLiteStore,
    SQLStore,
    StatefulApplication,
)
from gazette.consumer.stores.sql import CHECKPOINTS
from gazette.message import CSVRecord, Envelope, modulo_mapping
from gazette.protocol import consumer_pb2 as pc
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSet
from gazette.recoverylog import Recorder

__all__ = ["BikeShare", "parse_ride"]

log = logging.getLogger("bike_share")

MALFORMED = Counter("bike_share_malformed_rides", "Ride records skipped as malformed", ["journal"])
PROXY_HEADER = "X-Proxy-Header"


def parse_ride(rec: Sequence[str]) -> dict[str, Any]:
    """A ride record's statement parameters; ValueError naming the problem if malformed."""
    if len(rec) != 16:
        raise ValueError(f"{len(rec)} columns, expected 16 (a UUID and Citi Bike's 15)")
    (uuid, duration, start, end, s_id, s_name, s_lat, s_lon, e_id, e_name, e_lat, e_lon, bike, user_type,
     birth, gender) = rec
    for name, value in (("starttime", start), ("stoptime", end)):
        try:
            dt.datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{name} {value!r} is not a time") from None
    return dict(uuid=uuid, trip_duration=int(duration), start_time=start, end_time=end, start_station_id=int(s_id),
                start_station_name=s_name, start_station_latitude=float(s_lat), start_station_longitude=float(s_lon),
                end_station_id=int(e_id), end_station_name=e_name, end_station_latitude=float(e_lat),
                end_station_longitude=float(e_lon), bike=int(bike), user_type=user_type,
                birth_year=int(birth or 0), gender=int(gender or 0))




def _cycle(bike: int, rows: Sequence[Sequence[Any]]) -> Cycle:
    steps = [{"Time": iso_ms(r[1]), "Station": r[2]} for r in rows]
    steps.append({"Time": iso_ms(rows[-1][3]), "Station": rows[-1][4]})
    return Cycle(BikeID=bike, Steps=steps)


Store = SQLStore | SQLiteStore
Rides = list[dict[str, Any]]
"""A shard's state: the rides of its current transaction, parsed (statement parameters)."""


class BikeShare(StatefulApplication[Store, CSVRecord, Rides]):
    receive_acks = False  # transaction acknowledgements are not rides: not handed over

    def __init__(self) -> None:
        self.engine: AsyncEngine | None = None
        self.args: InitArgs | None = None
        self._rides = pb.ListResponse()
        self._cycles = pb.ListResponse()
        self._ride_mapping = modulo_mapping(lambda bike: str(bike).encode(), lambda: self._rides)
        self._cycle_mapping = modulo_mapping(lambda c: str(c.doc["BikeID"]).encode(), lambda: self._cycles)

    # --- configuration -------------------------------------------------------------------

    def add_flags(self, parser: Any) -> None:
        parser.add_argument("--postgres", default=os.environ.get("BIKE_SHARE_POSTGRES", ""),
                            help="SQLAlchemy URL of the PostgreSQL database of shards labelled store=postgres "
                                 "(e.g. postgresql+psycopg://user@host/db; env BIKE_SHARE_POSTGRES)")

    async def init_application(self, args: InitArgs) -> None:
        self.args = args
        url = getattr(args.config, "postgres", "") if args.config is not None else ""
        if url:
            self.engine = create_async_engine(url, pool_size=8)
            async with self.engine.begin() as conn:
                # Processes starting together would race their CREATE TABLE IF NOT EXISTS (a
                # unique violation in PostgreSQL's catalog): one at a time.
                await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('bike_share.schema'))"))
                await conn.run_sync(lambda c: CHECKPOINTS.create(c, checkfirst=True))
                await conn.execute(text(sql.CREATE_POSTGRES))
        args.routes.append(web.get("/api/bikes", self.history))

    async def _partitions(self, message_type: str) -> pb.ListResponse:
        assert self.args is not None
        parts = await list_journals(self.args.journal_client, f"app.gazette.dev/message-type={message_type}")
        if not parts.journals:
            raise BikeShareError(f"no journal is labelled app.gazette.dev/message-type={message_type}")
        return parts

    # --- the application --------------------------------------------------------------------

    async def new_store(self, shard: Shard[Rides], recorder: Recorder | None) -> Store:
        self._cycles = await self._partitions(CYCLE_TYPE)
        kind = (LabelSet.from_proto(shard.spec.labels).value_of("store") or "").lower()
        if kind == "postgres":
            if self.engine is None:
                raise BikeShareError(f"shard {shard.spec.id} is labelled store=postgres but no database is "
                                     "configured: pass --postgres URL (or BIKE_SHARE_POSTGRES)")
            return SQLStore(self.engine)
        if kind == "sqlite":
            store = SQLiteStore(recorder)
            store.conn.execute(sql.CREATE_SQLITE)
            store.conn.commit()
            return store
        raise BikeShareError(f"shard {shard.spec.id}: label 'store' must be 'postgres' or 'sqlite' (got {kind!r})")

    def new_shard_state(self, shard: Shard[Rides], store: Store) -> Rides:
        return []

    def new_message(self, spec: pb.JournalSpec) -> type[CSVRecord]:
        return CSVRecord

    def consume_message(self, shard: Shard[Rides], store: Store, env: Envelope[CSVRecord],
                        publisher: ShardPublisher) -> None:
        rec = env.message
        try:
            ride = parse_ride(rec)
        except ValueError as err:
            MALFORMED.labels(env.journal).inc()
            log.warning("skipping malformed ride at %s:%d: %s", env.journal, env.begin, err)
            return
        shard.state.append(ride)

    async def finalize_txn(self, shard: Shard[Rides], store: Store, publisher: ShardPublisher) -> None:
        rides = list(shard.state)
        shard.state.clear()
        if not rides:
            return
        cycles: list[Cycle] = []
        if isinstance(store, SQLiteStore):
            conn = store.conn
            for ride in rides:
                conn.execute(sql.INSERT_SQLITE, ride)
                conn.execute(sql.WINDOW, {"bike": ride["bike"], "keep": WINDOW})
                rows = conn.execute(sql.CYCLE, {"bike": ride["bike"], "min": MIN_CYCLE}).fetchall()
                if rows:
                    cycles.append(_cycle(ride["bike"], rows))
        else:
            txn = await store.transaction()
            insert, window, cycle = text(sql.INSERT_POSTGRES), text(sql.WINDOW), text(sql.CYCLE)
            for ride in rides:
                await txn.execute(insert, ride)
                await txn.execute(window, {"bike": ride["bike"], "keep": WINDOW})
                found = (await txn.execute(cycle, {"bike": ride["bike"], "min": MIN_CYCLE})).fetchall()
                if found:
                    cycles.append(_cycle(ride["bike"], found))
        if cycles:
            await publisher.publish_uncommitted_many(self._cycle_mapping, cycles)

    # --- the history API ----------------------------------------------------------------------

    async def history(self, request: web.Request) -> web.StreamResponse:
        bike = request.query.get("id", "")
        if not bike.isdigit():
            return web.Response(status=400, text=f"expected ?id=<numeric bike id>, got {bike!r}\n")
        assert self.args is not None
        if not self._rides.journals:
            self._rides = await self._partitions(RIDE_TYPE)
        journal, _ = self._ride_mapping(bike)
        specs = self.args.resolver.shards_with_source(journal)
        if not specs:
            return web.Response(status=503, text=f"no shard reads {journal}\n")
        proxied = request.headers.get(PROXY_HEADER)
        header = json_format.Parse(proxied, pb.Header()) if proxied else None
        res = await self.args.resolver.resolve(specs[0].id, may_proxy=header is None, proxy_header=header)
        if res.status != pc.Status.OK:
            return web.Response(status=503, text=f"shard {specs[0].id}: {pc.Status.Name(res.status)}\n")  # type: ignore[arg-type]
        if res.shard is None:
            return await self._proxy(request, res.endpoint, res.header)
        rows = await self._history_rows(res.store, int(bike))
        body = "".join(json.dumps({"UUID": str(r[0]), "StartTime": iso_ms(r[1]), "EndTime": iso_ms(r[2]),
                                   "StartStation": r[3], "EndStation": r[4]}) + "\n" for r in rows)
        return web.Response(text=body, content_type="application/x-ndjson", headers={"X-Shard-ID": specs[0].id})

    async def _history_rows(self, store: Any, bike: int) -> Sequence[Sequence[Any]]:
        if isinstance(store, SQLiteStore):
            return store.conn.execute(sql.HISTORY, {"bike": bike}).fetchall()
        assert self.engine is not None
        async with self.engine.connect() as conn:
            return (await conn.execute(text(sql.HISTORY), {"bike": bike})).fetchall()

    async def _proxy(self, request: web.Request, endpoint: str, header: pb.Header) -> web.Response:
        url = endpoint.rstrip("/") + request.path_qs
        hdr = json_format.MessageToJson(header, indent=None)
        async with aiohttp.ClientSession() as session, session.get(url, headers={PROXY_HEADER: hdr}) as resp:
            body = await resp.read()
            return web.Response(status=resp.status, body=body, content_type=resp.content_type,
                                headers={k: v for k, v in resp.headers.items() if k == "X-Shard-ID"})

"""bike-share analytics: Spark over what the pipeline produced.

Reads the ``rides`` journals (CSV, committed: each ride once, malformed rows skipped) and the
``cycles`` journals (JSON lines the shards published, committed) with ``format("gazette")``,
and computes

* cycles per start station (the station a cycle leaves from and returns to),
* the longest cycles (most rides),
* ride-duration percentiles (50th, 90th, 99th) per hour of the day,

writes each as Parquet under ``--out``, and prints them. Persisted fragments are read from the
file store when ``--file-root`` names the brokers' (else through the brokers); what is not yet
persisted is read from the brokers.

    python -m examples.bike_share.analytics [--broker URL] [--out DIR] [--file-root DIR]

BROKER_ADDRESS is the default broker; spark-submit runs the same file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from examples.bike_share.messages import CYCLE_TYPE, RIDE_TYPE

__all__ = ["CYCLES_SCHEMA", "RIDES_SCHEMA", "Results", "main", "run"]

RIDES_SCHEMA = (
    "_journal string, _offset long, tripduration long, starttime string, stoptime string, "
    "start_station_id long, start_station_name string, start_station_latitude double, "
    "start_station_longitude double, end_station_id long, end_station_name string, "
    "end_station_latitude double, end_station_longitude double, bikeid long, usertype string, "
    "birth_year long, gender long"
)
"""Citi Bike's 2019 columns in order (the UUID, column 0, is the source's own)."""
CYCLES_SCHEMA = ("_journal string, _offset long, _publish_time timestamp, BikeID long, "
                 "Steps array<struct<Time: string, Station: string>>")


@dataclass
class Results:
    rides: int
    cycles: int
    per_station: list[tuple[str, int]]
    longest: list[tuple[int, int, str, str, str]]
    by_hour: list[tuple[int, int, float, float, float]]


def _source(spark: Any, broker: str, message_type: str, schema: str,
            file_root: str | None) -> Any:
    reader = (spark.read.format("gazette").option("broker", broker)
              .option("selector", f"app.gazette.dev/message-type={message_type}")
              .option("mode", "committed").option("malformed", "skip"))
    if file_root:
        reader = reader.option("file_root", file_root)
    return reader.schema(schema).load()


def run(spark: Any, broker: str, out: str, *, top: int = 10, file_root: str | None = None,
        ) -> Results:
    """Compute the three tables, write them as Parquet under ``out``, return them."""
    from pyspark.sql import functions as F

    # Each is read once (the journals may be large; Spark spills what does not fit).
    rides = _source(spark, broker, RIDE_TYPE, RIDES_SCHEMA, file_root).persist()
    cycles = _source(spark, broker, CYCLE_TYPE, CYCLES_SCHEMA, file_root).persist()

    per_station = (cycles.select(F.col("Steps")[0]["Station"].alias("station"))
                   .groupBy("station").count().orderBy(F.desc("count"), "station"))
    longest = (cycles.select(
        "BikeID", (F.size("Steps") - 1).alias("rides"),
        F.col("Steps")[0]["Station"].alias("station"),
        F.col("Steps")[0]["Time"].alias("left"),
        F.element_at("Steps", -1)["Time"].alias("returned"))
        .orderBy(F.desc("rides"), "left", "BikeID").limit(top))
    by_hour = (rides.withColumn("hour", F.hour(F.to_timestamp("starttime")))
               .where(F.col("hour").isNotNull())
               .groupBy("hour").agg(
                   F.count("*").alias("rides"),
                   F.percentile_approx("tripduration", [0.5, 0.9, 0.99], 10000).alias("p"))
               .select("hour", "rides", F.col("p")[0].alias("p50_s"),
                       F.col("p")[1].alias("p90_s"), F.col("p")[2].alias("p99_s"))
               .orderBy("hour"))

    for name, df in (("cycles_per_station", per_station), ("longest_cycles", longest),
                     ("duration_by_hour", by_hour)):
        df.write.mode("overwrite").parquet(os.path.join(out, name))
    result = Results(
        rides=rides.count(),
        cycles=cycles.count(),
        per_station=[(r.station, r["count"]) for r in per_station.collect()],
        longest=[(r.BikeID, r.rides, r.station, r.left, r.returned) for r in longest.collect()],
        by_hour=[(r.hour, r.rides, float(r.p50_s), float(r.p90_s), float(r.p99_s))
                 for r in by_hour.collect()],
    )
    rides.unpersist()
    cycles.unpersist()
    return result


def _print(results: Results, out: str) -> None:
    print(f"bike-share analytics: {results.rides} rides, {results.cycles} cycles "
          f"(Parquet under {out})")
    print("\ncycles per start station")
    for station, count in results.per_station[:10]:
        print(f"  {count:4d}  {station}")
    print("\nlongest cycles")
    print("  bike     rides  station                          left                      returned")
    for bike, n, station, left, returned in results.longest:
        print(f"  {bike:<8d} {n:5d}  {station:<32.32s} {left:<25s} {returned}")
    print("\nride duration by hour of day (seconds)")
    print("  hour  rides    p50    p90    p99")
    for hour, n, p50, p90, p99 in results.by_hour:
        print(f"  {hour:4d}  {n:5d}  {p50:5.0f}  {p90:5.0f}  {p99:5.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="bike-share analytics over the rides and cycles "
                                             "journals (Spark)")
    ap.add_argument("--broker", default=os.environ.get("BROKER_ADDRESS", "http://localhost:8080"))
    ap.add_argument("--out", default="var/bike-share-analytics")
    ap.add_argument("--file-root", default=None,
                    help="the brokers' --broker.file-root, to read persisted fragments directly")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession

    from gazette.spark import Progress, SparkSourceError, local_session

    started = time.monotonic()
    active = SparkSession.getActiveSession()  # Under spark-submit, or a caller's session.
    try:
        spark = active or local_session("bike-share-analytics")
    except SparkSourceError as err:
        print(f"analytics: {err}", file=sys.stderr)
        return 1
    try:
        with Progress(spark):
            results = run(spark, args.broker, os.path.abspath(args.out), top=args.top,
                          file_root=args.file_root)
    except Exception as err:  # Spark wraps the source's errors: show their message only.
        text = str(err).split("\n")
        print(f"analytics: {next((t for t in text if 'Error:' in t), text[0])}", file=sys.stderr)
        return 1
    finally:
        if active is None:
            spark.stop()
    _print(results, args.out)
    print(f"\n(analytics took {time.monotonic() - started:.1f}s, Spark start-up included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A generator of Citi Bike rides (the 2019 trip-data CSV schema) with known cycles.

There is no network here to download Citi Bike's files, so this writes rides in their header
and column order: realistic stations (names, ids, coordinates), bikes, times and durations,
and relocations (a bike's next ride starting elsewhere than its last ended). Each bike's rides
are *segments*, each beginning with a relocation:

* ordinary segments of 1 to 8 rides, a random walk: any cycle in one is shorter than
  ``MIN_CYCLE`` rides, so none is reported;
* planted cycles: from a station T through ``MIN_CYCLE`` to 14 rides that never pass T,
  back to T: each must be reported exactly once, with its steps;
* decoys: a long walk from T back to T that passes T in between (so each cycle in it is
  short), and one broken by a relocation: neither may be reported.

``--expect FILE`` writes the planted cycles as the app must publish them (JSON lines, sorted
by bike and time); ``--malformed N`` adds rows the app must skip (logged with their offset).
Rows are ordered by start time, as a real trip-data file is.

Run: ``python -m examples.bike_share.rides --bikes 200 --days 30 --seed 1 > rides.csv``
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import random
import sys
from dataclasses import dataclass
from typing import IO, Any

from examples.bike_share.messages import CSV_HEADER, MIN_CYCLE, iso_ms

__all__ = ["Ride", "Station", "generate", "main", "write_csv"]

_STREETS = ["E 2 St", "E 7 St", "E 10 St", "E 17 St", "W 21 St", "W 26 St", "W 33 St", "W 41 St", "W 52 St",
            "Lafayette St", "Grand St", "Canal St", "Broome St", "Bond St", "Wyckoff St", "Berkeley Pl", "Park Pl",
            "Atlantic Ave", "Fulton St", "Clinton St", "Henry St", "Water St", "Pearl St", "Greenwich St"]
_AVENUES = ["Avenue A", "Avenue B", "1 Ave", "2 Ave", "3 Ave", "Lexington Ave", "Park Ave S", "Broadway", "7 Ave",
            "8 Ave", "10 Ave", "Vanderbilt Ave", "Flatbush Ave", "Schermerhorn St", "Court St", "Church St"]
_EPOCH = dt.datetime(2019, 9, 1)


@dataclass(frozen=True)
class Station:
    id: int
    name: str
    lat: float
    lon: float


@dataclass(frozen=True)
class Ride:
    bike: int
    start: dt.datetime
    end: dt.datetime
    frm: Station
    to: Station
    user_type: str
    birth_year: int
    gender: int

    def row(self) -> list[str]:
        return [str(int((self.end - self.start).total_seconds())), _fmt(self.start), _fmt(self.end),
                str(self.frm.id), self.frm.name, f"{self.frm.lat:.8f}", f"{self.frm.lon:.8f}",
                str(self.to.id), self.to.name, f"{self.to.lat:.8f}", f"{self.to.lon:.8f}",
                str(self.bike), self.user_type, str(self.birth_year), str(self.gender)]


def _fmt(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 100:04d}"  # Citi Bike's 4 digits



def stations(rng: random.Random, n: int = 120) -> list[Station]:
    names = sorted({f"{s} & {a}" for s in _STREETS for a in _AVENUES})
    picked = rng.sample(names, n)
    ids = rng.sample(range(72, 3800), n)
    return [Station(i, name, round(40.68 + rng.random() * 0.1, 8), round(-74.02 + rng.random() * 0.08, 8))
            for i, name in zip(ids, picked, strict=True)]


class _Bike:
    def __init__(self, bike: int, rng: random.Random, where: Station, when: dt.datetime) -> None:
        self.bike, self.rng, self.where, self.when = bike, rng, where, when
        self.rides: list[Ride] = []

    def ride(self, to: Station) -> Ride:
        rng = self.rng
        start = self.when + dt.timedelta(seconds=rng.randrange(300, 8 * 3600), milliseconds=rng.randrange(1000))
        end = start + dt.timedelta(seconds=rng.randrange(180, 2400), milliseconds=rng.randrange(1000))
        r = Ride(self.bike, start, end, self.where, to, "Subscriber" if rng.random() < 0.88 else "Customer",
                 rng.randrange(1950, 2002), rng.choice((0, 1, 1, 2)))
        self.rides.append(r)
        self.where, self.when = to, end
        return r

    def relocate(self, to: Station) -> None:
        self.where = to  # moved by truck: the next ride starts here


def _walk(rng: random.Random, choices: list[Station], n: int, avoid: Station | None) -> list[Station]:
    pool = [s for s in choices if s is not avoid]
    return rng.sample(pool, n)


def generate(rng: random.Random, *, bikes: int, days: int, cycles: int,
             ) -> tuple[list[Ride], list[dict[str, Any]]]:
    """Rides ordered by start time, and the planted cycles as the app must publish them."""
    all_stations = stations(rng)
    ids = rng.sample(range(14529, 41000), bikes)
    fleet = [_Bike(b, rng, rng.choice(all_stations), _EPOCH + dt.timedelta(seconds=rng.randrange(3600)))
             for b in ids]
    horizon = _EPOCH + dt.timedelta(days=days)
    kinds = ["cycle"] * cycles + ["revisit", "relocated"] * max(1, cycles // 2)
    rng.shuffle(kinds)
    expected: list[dict[str, Any]] = []
    live = list(fleet)
    while live:
        bike = rng.choice(live)
        if bike.when >= horizon:
            live.remove(bike)
            continue
        # Every segment begins with a relocation (a no-op for a bike's very first ride).
        kind = kinds.pop() if kinds and rng.random() < 0.05 else "walk"
        t = rng.choice([s for s in all_stations if s is not bike.where]) if bike.rides else bike.where
        bike.relocate(t)
        if kind == "walk":
            for _ in range(rng.randrange(1, 9)):
                bike.ride(rng.choice([s for s in all_stations if s is not bike.where]))
        elif kind == "cycle":
            n = rng.randrange(MIN_CYCLE, 15)
            path = [bike.ride(s) for s in (*_walk(rng, all_stations, n - 1, t), t)]
            steps = [{"Time": iso_ms(r.start), "Station": r.frm.name} for r in path]
            steps.append({"Time": iso_ms(path[-1].end), "Station": t.name})
            expected.append({"BikeID": bike.bike, "Steps": steps})
        elif kind == "revisit":  # T ... T ... T, 12 rides: each closed loop has 6
            for s in (*_walk(rng, all_stations, 5, t), t, *_walk(rng, all_stations, 5, t), t):
                bike.ride(s)
        else:  # relocated: 6 rides from T, a truck, 6 rides back to T
            for s in _walk(rng, all_stations, 6, t):
                bike.ride(s)
            bike.relocate(rng.choice([s for s in all_stations if s is not t and s is not bike.where]))
            for s in (*_walk(rng, all_stations, 5, t), t):
                if s is bike.where:
                    continue
                bike.ride(s)
    rides = sorted((r for b in fleet for r in b.rides), key=lambda r: (r.start, r.bike))
    expected.sort(key=lambda c: (c["BikeID"], c["Steps"][0]["Time"]))
    return rides, expected


def write_csv(out: IO[str], rides: list[Ride], malformed: int = 0, rng: random.Random | None = None) -> None:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_HEADER)
    bad = sorted((rng or random.Random(0)).sample(range(len(rides)), min(malformed, len(rides))))
    for i, r in enumerate(rides):
        w.writerow(r.row())
        if bad and bad[0] == i:
            bad.pop(0)
            w.writerow([*r.row()[:11], "not-a-bike", "Subscriber", "1980"])  # short, and a bad id



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.bike_share.rides", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bikes", type=int, default=200)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--cycles", type=int, default=12, help="cycles to plant")
    ap.add_argument("--malformed", type=int, default=0, help="malformed rows to add")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--expect", type=argparse.FileType("w"), help="write the planted cycles here (JSON lines)")
    a = ap.parse_args(argv)
    if a.bikes < 1 or a.days < 1 or a.cycles < 0:
        ap.error("--bikes and --days must be positive, --cycles not negative")
    rng = random.Random(a.seed)
    rides, expected = generate(rng, bikes=a.bikes, days=a.days, cycles=a.cycles)
    write_csv(sys.stdout, rides, a.malformed, rng)
    if a.expect:
        for c in expected:
            a.expect.write(json.dumps(c) + "\n")
        a.expect.close()
    print(f"rides: {len(rides)} rides of {a.bikes} bikes, {len(expected)} planted cycles", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bike-share's messages and names: the ``Cycle`` published per found cycle, and the
Citi Bike 2019 CSV schema of rides (after ``gazctl attach-uuids``, column 0 is the UUID)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from gazette.errors import GazetteError
from gazette.message import JSONMessage

__all__ = ["BIKE_COLUMN", "CSV_HEADER", "CYCLE_TYPE", "MIN_CYCLE", "RIDE_TYPE", "WINDOW", "BikeShareError",
           "Cycle", "iso_ms"]

RIDE_TYPE: Final = "bike_share.Ride"
CYCLE_TYPE: Final = "bike_share.Cycle"
CSV_HEADER: Final = ("tripduration", "starttime", "stoptime", "start station id", "start station name",
                     "start station latitude", "start station longitude", "end station id", "end station name",
                     "end station latitude", "end station longitude", "bikeid", "usertype", "birth year",
                     "gender")
"""The column order of Citi Bike's 2019 trip-data files."""
BIKE_COLUMN: Final = 12
"""The bike id's column in a ride message (the UUID is column 0): awk's ``$13``."""
WINDOW: Final = 20
"""Rides kept per bike."""
MIN_CYCLE: Final = 10
"""The fewest rides of a reported cycle."""


class BikeShareError(GazetteError):
    """A bike-share configuration or input error."""


class Cycle(JSONMessage):
    """``{"UUID": ..., "BikeID": n, "Steps": [{"Time": ..., "Station": ...}, ...]}``: the
    stations a bike passed through, from leaving the terminus to returning to it."""

    __slots__ = ()


def iso_ms(t: Any) -> str:
    """A time as bike-share publishes it, whichever store gave it (a ``datetime`` from
    PostgreSQL, the CSV's text from SQLite): ISO 8601, milliseconds, UTC."""
    when = t if isinstance(t, dt.datetime) else dt.datetime.fromisoformat(str(t))
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"

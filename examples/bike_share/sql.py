"""bike-share's SQL, for PostgreSQL (``SQLStore``) and SQLite (``SQLiteStore``) alike.

Statements take named parameters (``:bike``), which both SQLAlchemy's ``text()`` and the
stdlib ``sqlite3`` accept. Only the table's types and the insert's timestamp casts differ:
SQLite keeps the CSV's timestamps as text (which sorts as time does), PostgreSQL as
``TIMESTAMP``.

The cycle query, for the bike of the ride just loaded: number the bike's rides newest first;
the *terminus* is where the newest ride ended. Walk back from the newest ride while each
earlier ride ended where the later one started (a bike that did not is one that was
relocated: the walk stops) and until a ride started at the terminus. If the walk got back
to the terminus, the bike just completed a cycle that did not pass through its start in
between; it is reported when it took at least ``:min`` rides.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CREATE_POSTGRES", "CREATE_SQLITE", "CYCLE", "HISTORY", "INSERT_POSTGRES", "INSERT_SQLITE", "WINDOW"]

_COLUMNS = """
    trip_duration           INTEGER     NOT NULL,
    bike_id                 INTEGER     NOT NULL,
    user_type               VARCHAR(16) NOT NULL,
    birth_year              SMALLINT    NOT NULL,
    gender                  SMALLINT    NOT NULL,
    start_time              {ts}        NOT NULL,
    start_station_id        INTEGER     NOT NULL,
    start_station_name      VARCHAR(64) NOT NULL,
    start_station_latitude  {real}      NOT NULL,
    start_station_longitude {real}      NOT NULL,
    end_time                {ts}        NOT NULL,
    end_station_id          INTEGER     NOT NULL,
    end_station_name        VARCHAR(64) NOT NULL,
    end_station_latitude    {real}      NOT NULL,
    end_station_longitude   {real}      NOT NULL,
    PRIMARY KEY (bike_id, start_time)"""

CREATE_SQLITE: Final = f"CREATE TABLE IF NOT EXISTS rides (uuid TEXT NOT NULL,{_COLUMNS.format(ts='TEXT', real='REAL')})"
CREATE_POSTGRES: Final = (f"CREATE TABLE IF NOT EXISTS rides (uuid UUID NOT NULL,"
                          f"{_COLUMNS.format(ts='TIMESTAMP', real='DOUBLE PRECISION')})")

_INSERT = """INSERT INTO rides (uuid, trip_duration, start_time, end_time, start_station_id, start_station_name,
    start_station_latitude, start_station_longitude, end_station_id, end_station_name, end_station_latitude,
    end_station_longitude, bike_id, user_type, birth_year, gender)
VALUES ({uuid}, :trip_duration, {start}, {end}, :start_station_id, :start_station_name, :start_station_latitude,
    :start_station_longitude, :end_station_id, :end_station_name, :end_station_latitude, :end_station_longitude,
    :bike, :user_type, :birth_year, :gender)"""
INSERT_SQLITE: Final = _INSERT.format(uuid=":uuid", start=":start_time", end=":end_time")
INSERT_POSTGRES: Final = _INSERT.format(uuid="CAST(:uuid AS UUID)", start="CAST(:start_time AS TIMESTAMP)",
                                        end="CAST(:end_time AS TIMESTAMP)")

WINDOW: Final = """DELETE FROM rides WHERE bike_id = :bike AND start_time < (
    SELECT MIN(start_time) FROM (
        SELECT start_time FROM rides WHERE bike_id = :bike ORDER BY start_time DESC LIMIT :keep) AS kept)"""
"""Keeps the bike's ``:keep`` most recent rides."""

CYCLE: Final = """WITH RECURSIVE
ordered AS (
    SELECT ROW_NUMBER() OVER (ORDER BY start_time DESC) AS ind, start_time, start_station_id AS start_id,
           start_station_name AS start_name, end_time, end_station_id AS end_id, end_station_name AS end_name
    FROM rides WHERE bike_id = :bike),
terminus AS (SELECT end_id AS id FROM ordered WHERE ind = 1),
walk (ind, start_id) AS (
    SELECT ind, start_id FROM ordered WHERE ind = 1
    UNION ALL
    SELECT o.ind, o.start_id FROM ordered AS o JOIN walk AS w
        ON o.ind = w.ind + 1
        AND o.end_id = w.start_id
        AND w.start_id <> (SELECT id FROM terminus)),
closed AS (
    SELECT COUNT(*) AS rides FROM walk
    HAVING MAX(CASE WHEN ind = (SELECT MAX(ind) FROM walk) THEN start_id END) = (SELECT id FROM terminus))
SELECT o.ind, o.start_time, o.start_name, o.end_time, o.end_name
FROM walk JOIN ordered AS o ON o.ind = walk.ind
WHERE (SELECT rides FROM closed) >= :min
ORDER BY o.ind DESC"""
"""The rides of the cycle the bike just completed (oldest first), if any: see the module
docstring."""

HISTORY: Final = """SELECT uuid, start_time, end_time, start_station_name, end_station_name
FROM rides WHERE bike_id = :bike ORDER BY start_time"""
"""The bike's rides in the window, oldest first."""

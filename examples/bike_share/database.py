"""Finds the PostgreSQL of bike-share's ``store=postgres`` shards: prints its SQLAlchemy URL
(creating the database if needed) and exits 0, or says why not and exits 1, so a demo falls
back to SQLite for every shard.

``python -m examples.bike_share.database [--host 127.0.0.1] [--port 5432] [--user postgres]
[--database bike_share] [--fresh]``
"""

from __future__ import annotations

import argparse
import sys

import psycopg
from psycopg import sql


def ensure(host: str, port: int, user: str, database: str, fresh: bool = False) -> str:
    """The URL of ``database`` on that server, created if absent (dropped first if ``fresh``);
    psycopg's error if the server cannot be reached."""
    with psycopg.connect(host=host, port=port, user=user, dbname="postgres", connect_timeout=3,
                         autocommit=True) as conn:
        if fresh:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return f"postgresql+psycopg://{user}@{host}:{port}/{database}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.bike_share.database", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5432)
    ap.add_argument("--user", default="postgres")
    ap.add_argument("--database", default="bike_share")
    ap.add_argument("--fresh", action="store_true", help="drop the database first")
    a = ap.parse_args(argv)
    try:
        print(ensure(a.host, a.port, a.user, a.database, a.fresh))
    except psycopg.Error as err:
        print(f"no PostgreSQL at {a.host}:{a.port} as {a.user}: {str(err).strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

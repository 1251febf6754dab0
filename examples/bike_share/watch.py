"""Prints bike-share's cycles as they are found: a read-committed tail of every journal labelled
``app.gazette.dev/message-type=bike_share.Cycle`` (each committed cycle once; the
acknowledgements that commit them are not shown).

``python -m examples.bike_share.watch`` runs until Ctrl-C; ``--count N`` stops after N cycles
(exit status 1 if ``--timeout`` seconds pass first), as the one-shot demo does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Any

from examples.bike_share.messages import CYCLE_TYPE
from gazette.client import JournalClient
from gazette.consumer import is_ack
from gazette.message import JSONMessage, read_committed

__all__ = ["describe", "main"]


def describe(doc: dict[str, Any]) -> str:
    """One line for a cycle: bike, rides, the stations passed and the hours it took."""
    steps = doc["Steps"]
    names = [s["Station"] for s in steps]
    start, end = steps[0]["Time"], steps[-1]["Time"]
    return (f"bike {doc['BikeID']}: a cycle of {len(steps) - 1} rides from {start[:16].replace('T', ' ')} to "
            f"{end[:16].replace('T', ' ')}: {names[0]} -> {' -> '.join(names[1:-1])} -> {names[-1]}")


async def watch(address: str, count: int, limit: float) -> int:
    seen = 0
    started = time.monotonic()
    async with JournalClient(address) as client:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit if count else None):
                async for env in read_committed(client, f"app.gazette.dev/message-type={CYCLE_TYPE}", JSONMessage):
                    if is_ack(env):
                        continue
                    seen += 1
                    print(f"[{time.monotonic() - started:5.1f}s] {describe(env.message.doc)}", flush=True)
                    if count and seen >= count:
                        return 0
    print(f"watch: {seen} of {count} cycles after {limit:g}s", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.bike_share.watch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker.address", dest="broker", default=os.environ.get("BROKER_ADDRESS", "http://localhost:8080"))
    ap.add_argument("--count", type=int, default=0, help="stop after this many cycles (0: never)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds --count may take")
    a = ap.parse_args(argv)
    try:
        return asyncio.run(watch(a.broker, a.count, a.timeout))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

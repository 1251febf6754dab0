"""Append JSON messages to a journal and read them back, committed, exactly once.

Run against a broker (the demo's, or the tutorial's) whose journals include
``examples/greetings`` (``gazctl journals apply --specs examples/journals.yaml``)::

    BROKER_ADDRESS=http://localhost:8080 python examples/hello_messages.py Ada Grace Linus

It publishes one greeting per name (a ``JSONMessage``: Gazette stamps each with a UUID), waits
for the appends to commit, then reads the journal from its start with read-committed
semantics and prints the greetings of this run. Only names from ``gazette`` itself are used.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import gazette


async def main(names: list[str]) -> int:
    address = os.environ.get("BROKER_ADDRESS", "http://localhost:8080")
    journal = os.environ.get("JOURNAL", "examples/greetings")
    run = uuid.uuid4().hex[:8]  # tells this run's greetings from earlier runs'

    async with gazette.JournalClient(address) as client:
        # Messages of one name always go to the same journal (here there is just one).
        listing = await gazette.list_journals(client, f"name={journal}")
        mapping = gazette.modulo_mapping(lambda m: m.doc["name"].encode(), lambda: listing)

        async with gazette.AppendService(client) as service:
            publisher = gazette.Publisher(service)
            for name in names:
                await publisher.publish_committed(
                    mapping, gazette.JSONMessage(run=run, name=name, greeting=f"Hello, {name}!"))
            await service.flush()  # every append committed
        print(f"published {len(names)} greetings (run {run})")

        seen = 0
        async for env in gazette.read_committed(client, journal, block=False):
            doc = env.message.doc
            if doc.get("run") == run:
                print(f"{env.journal}@{env.begin}: {doc['greeting']}")
                seen += 1
        print(f"read {seen} of them back, committed")
        return 0 if seen == len(names) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:] or ["Gazette"])))

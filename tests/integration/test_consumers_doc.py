"""docs/consumers.md stays true: its whole application runs, through the test harness, on a
real broker and PostgreSQL, counting words and publishing derived counts exactly once."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from gazette.message.reading import read_committed
from gazette.message.uuid import ACK_TXN, get_flags

DOC = Path(__file__).resolve().parents[2] / "docs" / "consumers.md"


def _tree(prefix: str, n: int) -> str:
    children = "".join(f"- name: {prefix}part-00{i}\n" for i in range(n))
    return (f"name: {prefix}\nreplication: 1\nlabels:\n- name: content-type\n  value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [file:///]\n"
            "  refresh_interval: 1s\nchildren:\n" + children)


@pytest.mark.timeout(120)
async def test_the_guides_application_runs(gazette_consumer: Any, postgres_db: str) -> None:
    doc = DOC.read_text()
    code = re.search(r"```python\n(# wordcount.py\n.*?)```", doc, re.S)
    assert code is not None
    module = types.ModuleType("wordcount")
    exec(compile(code.group(1), "wordcount.py", "exec"), module.__dict__)  # noqa: S102 - our own doc
    shards = re.search(r"```yaml\n# shards.yaml\n(.*?)```", doc, re.S)
    assert shards is not None
    dsn = postgres_db.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_async_engine(dsn)
    await module.SQLStore.create_tables(engine)
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS words"))
        await conn.execute(text("CREATE TABLE words (w TEXT PRIMARY KEY, n BIGINT NOT NULL)"))
    try:
        app = module.WordCount()
        journals = _tree("words/", 2) + "---\n" + _tree("counts/", 2)
        async with gazette_consumer(app, journals=journals, shards=shards.group(1),
                                    app_args=["--store.dsn", dsn]) as h:
            assert h.client is not None
            await h.publish("words/part-000", {"word": "a"}, {"word": "b"})
            await h.publish("words/part-001", {"word": "a"})
            await h.read_through()
            async with engine.connect() as conn:
                words = dict((await conn.execute(text("SELECT w, n FROM words"))).all())
            assert words == {"a": 2, "b": 1}
            derived = [env.message.doc async for env in read_committed(h.client, "prefix=counts/", block=False)
                       if get_flags(env.message.get_uuid()) != ACK_TXN]
            assert sorted((d["word"], d["count"]) for d in derived) == [("a", 1), ("a", 2), ("b", 1)]
    finally:
        await engine.dispose()

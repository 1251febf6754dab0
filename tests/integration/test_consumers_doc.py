"""docs/consumers.md stays true: every python block in it runs. Its whole application runs,
through the test harness, on a real broker and PostgreSQL, counting words and publishing
derived counts exactly once; its testing example runs as written against that application;
its store fragment runs and builds the store it shows."""

from __future__ import annotations

import inspect
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
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_every_python_block_is_one_a_test_runs() -> None:
    """A block added to the guide must be given a test here (this fails until it is)."""
    assert len(BLOCKS) == 4, "a python block was added to or removed from the guide"
    assert BLOCKS[0].startswith("# wordcount.py\n")
    assert "def new_store(self, shard, recorder)" in BLOCKS[1]
    assert "async def test_wordcount(gazette_consumer)" in BLOCKS[2]
    # Run by tests/integration/test_sql_store_sync.py::test_the_guides_sync_app_runs.
    assert BLOCKS[3].startswith("# sync_wordcount.py\n")


def test_the_guides_blocks_import_only_the_public_packages() -> None:
    """An app is written from ``gazette.consumer`` and ``gazette.message`` names (and the test
    harness's fixture): no block reaches into a module under them (the sync block once took
    ``SyncSQLStore`` from ``gazette.consumer.stores.sql`` and ACK flags from the UUID module)."""
    modules = {m for block in BLOCKS for m in re.findall(r"^(?:from|import) (gazette[\w.]*)", block, re.M)}
    assert modules == {"gazette.consumer", "gazette.message"}, modules


def _wordcount() -> types.ModuleType:
    module = types.ModuleType("wordcount")
    exec(compile(BLOCKS[0], "wordcount.py", "exec"), module.__dict__)  # noqa: S102 - our own doc
    return module


async def _words_table(engine: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS words"))
        await conn.execute(text("CREATE TABLE words (w TEXT PRIMARY KEY, n BIGINT NOT NULL)"))


def _tree(prefix: str, n: int) -> str:
    children = "".join(f"- name: {prefix}part-00{i}\n" for i in range(n))
    return (f"name: {prefix}\nreplication: 1\nlabels:\n- name: content-type\n  value: application/x-ndjson\n"
            "fragment:\n  length: 1048576\n  compression_codec: NONE\n  stores: [file:///]\n"
            "  refresh_interval: 1s\nchildren:\n" + children)


@pytest.mark.timeout(120)
async def test_the_guides_application_runs(gazette_consumer: Any, postgres_db: str) -> None:
    doc = DOC.read_text()
    module = _wordcount()
    shards = re.search(r"```yaml\n# shards.yaml\n(.*?)```", doc, re.S)
    assert shards is not None
    dsn = postgres_db.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_async_engine(dsn)
    await module.SQLStore.create_tables(engine)
    await _words_table(engine)
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


@pytest.mark.timeout(120)
async def test_the_guides_testing_example_runs(gazette_consumer: Any, postgres_db: str) -> None:
    module = _wordcount()
    shards = re.search(r"```yaml\n# shards.yaml\n(.*?)```", DOC.read_text(), re.S)
    assert shards is not None
    dsn = postgres_db.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_async_engine(dsn)
    await module.SQLStore.create_tables(engine)
    await _words_table(engine)
    try:
        # The names the example takes from its test module.
        ns: dict[str, Any] = {"WordCount": module.WordCount, "DSN": dsn, "SHARDS_YAML": shards.group(1),
                              "JOURNALS_YAML": _tree("words/", 2) + "---\n" + _tree("counts/", 2)}
        exec(compile(BLOCKS[2], "consumers.md", "exec"), ns)  # noqa: S102 - our own doc
        await ns["test_wordcount"](gazette_consumer)
        async with engine.connect() as conn:
            assert dict((await conn.execute(text("SELECT w, n FROM words"))).all()) == {"a": 2}
    finally:
        await engine.dispose()


def test_the_guides_store_fragment_runs(tmp_path: Path) -> None:
    ns: dict[str, Any] = {}
    exec(compile(BLOCKS[1], "consumers.md", "exec"), ns)  # noqa: S102 - our own doc
    store_type = ns["RocksDBStore"]
    # new_store as the guide writes it, given a recorder: the options it passes are accepted.
    inspect.signature(store_type).bind(object(), options={"write_buffer_size": 8 << 20})
    # And with a directory (no recovery log) the same options build a working store.
    store = store_type(None, directory=str(tmp_path / "db"), options={"write_buffer_size": 8 << 20})
    try:
        store.put(b"k", b"v")
        assert store.get(b"k") == b"v"
    finally:
        store.destroy()

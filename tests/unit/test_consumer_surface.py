"""``gazette.consumer`` is an app's one import: its names resolve (the SQL and embedded stores
on first use), and importing it loads neither SQLAlchemy nor rocksdict."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

import gazette.consumer
from gazette.client import JournalClient
from gazette.consumer.shard import ShardRuntime
from gazette.protocol import consumer_pb2 as pc


def test_every_exported_name_resolves() -> None:
    for name in gazette.consumer.__all__:
        assert getattr(gazette.consumer, name) is not None, name
    from gazette.consumer.initialize import InitArgs
    from gazette.consumer.stores.rocksdb import RocksDBStore
    from gazette.consumer.stores.sql import SQLStore
    from gazette.consumer.stores.sqlite import SQLiteStore
    assert gazette.consumer.SQLStore is SQLStore and gazette.consumer.SQLiteStore is SQLiteStore
    assert gazette.consumer.RocksDBStore is RocksDBStore and gazette.consumer.InitArgs is InitArgs
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        gazette.consumer.Nope  # noqa: B018


def test_importing_the_package_loads_no_store_backend() -> None:
    code = ("import sys, gazette.consumer; "
            "print(sorted(m for m in ('sqlalchemy', 'rocksdict') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_shard_done_is_a_deprecated_alias_of_stopping() -> None:
    async def write_status(shard: str, status: pc.ReplicaStatus) -> None:
        pass

    client = JournalClient("http://127.0.0.1:1")  # never dialled
    rt = ShardRuntime("/p/items/s", pc.ShardSpec(id="s"), object(), client, write_status)  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match="Shard.stopping"):
        assert rt.done is rt.stopping
    assert isinstance(rt.stopping, asyncio.Event)


@pytest.mark.parametrize("blocked, store, extra", [
    ("sqlalchemy", "SQLStore", "gazette[postgres]"),
    ("rocksdict", "RocksDBStore", "gazette[rocksdb]"),
])
def test_a_store_without_its_driver_names_the_extra(blocked: str, store: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "import gazette.consumer as c\n"
            "try:\n"
            f"    getattr(c, {store!r})\n"
            "except ImportError as err:\n"
            "    print(type(err).__name__, err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingExtraError") and extra in out.stdout, out.stdout

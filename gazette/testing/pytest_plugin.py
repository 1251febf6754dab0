"""pytest fixtures for consumer application tests (registered as the ``gazette`` pytest plugin).

* ``gazette_etcd_url``: one real etcd for the test session (its URL).
* ``gazette_consumer``: a factory of :class:`~gazette.testing.consumer.ConsumerHarness` bound to
  that etcd and the test's temporary directory::

      async def test_my_app(gazette_consumer):
          async with gazette_consumer(MyApp(), journals=JOURNALS, shards=SHARDS) as h:
              ...

Async tests need an asyncio pytest plugin (pytest-asyncio, as this project uses).

pytest loads this plugin into every session of an environment where gazette is installed
(its ``pytest11`` entry point): importing it loads only pytest and this module. The harness
(etcd's client, gRPC, the consumer stack) is imported when a fixture is first used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gazette.testing.consumer import ConsumerHarness

__all__ = ["gazette_consumer", "gazette_etcd_url"]


@pytest.fixture(scope="session")
def gazette_etcd_url() -> Iterator[str]:
    from gazette.testing.etcd import start_test_etcd

    server = start_test_etcd()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def gazette_consumer(gazette_etcd_url: str, tmp_path: Path) -> Callable[..., ConsumerHarness]:
    from gazette.testing.consumer import ConsumerHarness

    counter = iter(range(1 << 30))

    def make(app: Any, **kwargs: Any) -> ConsumerHarness:
        kwargs.setdefault("etcd_url", gazette_etcd_url)
        kwargs.setdefault("root", tmp_path / f"harness-{next(counter)}")
        return ConsumerHarness(app, **kwargs)

    return functools.partial(make)

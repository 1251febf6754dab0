"""The consumer test harness as an app author uses it: the ``gazette_consumer`` fixture (from
the installed pytest plugin) runs etcd, a broker and consumers, applies the specs, and waits."""

from __future__ import annotations

from typing import Any

import pytest
from consumer_support import CountingApp, journals_yaml

from gazette.testing.consumer import ConsumerHarness

SHARDS = """\
common:
  max_txn_duration: 1s
shards:
- id: count-000
  sources:
  - journal: in/part-000
- id: count-001
  sources:
  - journal: in/part-001
"""


@pytest.mark.timeout(120)
async def test_an_app_test_in_a_few_lines(gazette_consumer: Any) -> None:
    app = CountingApp()
    async with gazette_consumer(app, journals=journals_yaml("part-000", "part-001"), shards=SHARDS,
                                processes=2) as h:
        assert isinstance(h, ConsumerHarness)
        assert {p.local_id.suffix for p in h.processes} == {"harness-0", "harness-1"}
        await h.publish("in/part-000", {"key": "a"}, {"key": "b"}, {"key": "a"})
        await h.append_lines("in/part-001", [{"key": "a"}] * 4)
        await h.read_through()
        assert app.counts == {"a": 6, "b": 1}
        assert h.runtime("count-000") is not None and h.store("count-001") is not None

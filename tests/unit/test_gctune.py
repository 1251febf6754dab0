"""gctune: a server process freezes what it imported and collects less often; an operator's
``GAZETTE_GC=default`` keeps CPython's collector as it is."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gazette import gctune


@pytest.fixture
def collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_freezes_the_start_and_raises_the_thresholds(collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GAZETTE_GC", raising=False)
    gc.unfreeze()
    assert gctune.tune()
    assert gc.get_threshold() == gctune.THRESHOLDS
    assert gc.get_freeze_count() > 0  # what was alive is no longer visited by collections
    # The collector still runs: a cycle made after tuning is freed by a collection.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


def test_gazette_gc_default_leaves_the_collector_alone(collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAZETTE_GC", "default")
    gc.unfreeze()
    before = gc.get_threshold()
    assert not gctune.tune()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0

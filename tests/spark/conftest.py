"""A real local Spark session (one per run: it takes 20-60 s to start on 2 cores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gazette.spark import local_session

    session = local_session("gazette-tests", cores=2,
                            scratch=str(tmp_path_factory.mktemp("spark")))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def spark_dir(tmp_path: Path) -> Path:
    d = tmp_path / "spark-out"
    d.mkdir()
    return d

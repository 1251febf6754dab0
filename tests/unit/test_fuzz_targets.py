"""The fuzz targets (``fuzz/targets.py``) hold on every regression input kept under
``fuzz/regressions/<target>/`` and on a short hypothesis run each; the coverage-guided
campaigns themselves run with atheris (``python fuzz/run.py``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.targets import TARGETS

REGRESSIONS = Path(__file__).resolve().parents[2] / "fuzz" / "regressions"


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)  # refused input is logged at info/warning: not news here
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _regressions() -> list[tuple[str, Path]]:
    return sorted((d.name, p) for d in REGRESSIONS.iterdir() if d.is_dir() for p in d.iterdir())


@pytest.mark.parametrize(("target", "path"), _regressions(), ids=lambda v: str(v)[-40:])
def test_regression_inputs_hold(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


@pytest.mark.parametrize("target", sorted(TARGETS))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=512))
def test_targets_hold_on_random_input(target: str, data: bytes) -> None:
    TARGETS[target](data)

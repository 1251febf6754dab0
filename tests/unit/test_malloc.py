"""gazette.malloc: freed megabyte buffers are reused instead of page-faulted in afresh."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_CHURN = """
import resource, sys
from gazette import malloc
print(malloc.tune())
def churn():
    for _ in range(20):
        bufs = [b"x" * (1 << 20) for _ in range(8)]
        del bufs
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 160)
"""


def _run(env: dict[str, str]) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", _CHURN], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    return out[0] == "True", float(out[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GAZETTE_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    env.update(extra)
    return env


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_tuned_process_reuses_megabyte_buffers() -> None:
    tuned, faults_per_mib = _run(_env())
    assert tuned
    # A fresh mapping faults in all 256 pages of a MiB; reused heap memory faults in none.
    assert faults_per_mib < 8


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_untuned_process_page_faults_every_buffer() -> None:
    # The opt-out, and the reason tune() exists: without it the same churn maps fresh pages.
    tuned, faults_per_mib = _run(_env(GAZETTE_MALLOC="default"))
    assert not tuned
    assert faults_per_mib > 128


def test_operator_settings_win() -> None:
    tuned, _ = _run(_env(MALLOC_TRIM_THRESHOLD_="131072"))
    assert not tuned

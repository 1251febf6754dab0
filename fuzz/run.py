"""Runs a fuzz target coverage-guided with atheris (libFuzzer), or every target briefly.

    python fuzz/run.py selector -runs=1000000          # a campaign (libFuzzer's flags)
    python fuzz/run.py --all --seconds 10              # each target for ~10 s (CI)

A campaign keeps its corpus under ``fuzz/corpus/<target>/`` (not committed) and writes a
crashing input to ``fuzz/crash-<target>-*``; add it to ``fuzz/regressions/<target>/`` and the
unit tests replay it from then on. Only gazette's modules are instrumented.

atheris is in the ``fuzz`` extra, not ``dev`` (it has wheels for Linux x86-64 only):
``bash scripts/bootstrap.sh dev,fuzz`` (as ``.ci/run`` does) or ``pip install -e '.[fuzz]'``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def fuzz_one(target: str, libfuzzer_args: list[str]) -> None:
    import logging

    try:
        import atheris
    except ImportError:
        sys.exit("fuzz/run.py needs atheris: pip install -e '.[fuzz]' (Linux x86-64)")

    logging.disable(logging.CRITICAL)  # refused input is logged: millions of lines, no news

    sys.path.insert(0, ROOT)
    with atheris.instrument_imports(include=["gazette"]):
        from fuzz.targets import TARGETS
    if target not in TARGETS:
        raise SystemExit(f"fuzz: unknown target {target!r} (one of {', '.join(sorted(TARGETS))})")
    corpus = os.path.join(HERE, "corpus", target)
    os.makedirs(corpus, exist_ok=True)
    seeds = os.path.join(HERE, "regressions", target)
    dirs = [corpus] + ([seeds] if os.path.isdir(seeds) else [])
    args = [sys.argv[0], f"-artifact_prefix={os.path.join(HERE, 'crash-' + target + '-')}",
            "-rss_limit_mb=4096", "-timeout=10", *libfuzzer_args, *dirs]
    atheris.Setup(args, TARGETS[target])
    atheris.Fuzz()


def run_all(seconds: float) -> int:
    sys.path.insert(0, ROOT)
    from fuzz.targets import TARGETS

    failed = []
    for target in TARGETS:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, __file__, target, f"-max_total_time={int(seconds)}"],
                              capture_output=True, text=True, check=False)
        done = [ln for ln in proc.stderr.splitlines() if "DONE" in ln or "pulse" in ln]
        print(f"{target:16} rc={proc.returncode} {time.monotonic() - started:5.1f}s "
              f"{done[-1].strip() if done else ''}", flush=True)
        if proc.returncode != 0:
            failed.append(target)
            print(proc.stderr[-4000:], file=sys.stderr)
    if failed:
        print(f"fuzz: crashes in {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--all"]:
        seconds = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 10.0
        return run_all(seconds)
    if not argv:
        raise SystemExit(__doc__)
    fuzz_one(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())

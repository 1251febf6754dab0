"""The allocator's solver, interpreted beside compiled, in one run (issues 31 and 32).

A leader re-solves the whole assignment as items change, and at 50,000 journals of replication
2 a solve is 100,000 item slots of min-cost max flow. This bench builds that problem (three
members in two zones; half the items already assigned, as mid-way through a large apply) and
times ``solve_problem`` on:

* ``interpreted``: ``gazette/allocator/solver.py`` and ``_flow.py`` loaded from their ``.py``
  sources (under another package name, so the installed modules are left alone);
* ``installed``: the modules this installation imports: compiled (mypyc) in a compiled wheel,
  the same sources otherwise (then the ratio is noise around 1.0).

Each figure is the best of ``--runs``; the answers of both are checked equal.

    python bench/solver_bench.py                       # 10,000 and 50,000 items
    python bench/solver_bench.py --items 100000 --runs 1

Run it with a compiled installation's python (``scripts/compiled_check.sh`` keeps one at
``$COMPILED_VENV``) from outside the checkout, e.g. ``cd bench && $COMPILED_VENV/bin/python
solver_bench.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import types
from typing import Any

import gazette
from gazette._compiled import build_line, is_compiled
from gazette.allocator import solver as installed


def load_interpreted() -> Any:
    """``solver`` and ``_flow`` from their ``.py`` files, as package ``_interpreted_allocator``."""
    directory = os.path.dirname(os.path.abspath(installed.__file__ or ""))
    package = types.ModuleType("_interpreted_allocator")
    package.__path__ = [directory]
    sys.modules[package.__name__] = package
    module: Any = None
    for name in ("_flow", "solver"):  # solver's `from ._flow import ...` finds the first
        spec = importlib.util.spec_from_file_location(f"{package.__name__}.{name}",
                                                      os.path.join(directory, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def problem(solver: Any, n: int) -> Any:
    members = [("zone-a", "broker-1", 10**6), ("zone-b", "broker-2", 10**6), ("zone-a", "broker-3", 10**6)]
    pairs = [(0, 1), (1, 2), (2, 1)]  # every item spans both zones
    current = [pairs[i % 3] if i < n // 2 else () for i in range(n)]
    return solver.Problem(names=[f"j-{i:06d}" for i in range(n)], replication=[2] * n, members=members,
                          current=current, item_slots=2 * n, member_slots=3 * 10**6)


def best_of(solver: Any, n: int, runs: int) -> tuple[float, list[tuple[int, int]]]:
    p, best, answer = problem(solver, n), float("inf"), []
    for _ in range(runs):
        t = time.perf_counter()
        answer = solver.solve_problem(p)
        best = min(best, time.perf_counter() - t)
    return best, answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", default="10000,50000", help="item counts (replication 2 each)")
    ap.add_argument("--runs", type=int, default=3, help="solves per figure (the best is kept)")
    a = ap.parse_args()
    interpreted = load_interpreted()
    flow_compiled = is_compiled("gazette.allocator._flow")
    print(f"# solver_bench.py (gazette {gazette.__version__}; {build_line()}; installed _flow "
          f"{'compiled' if flow_compiled else 'interpreted'}; {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} CPUs)")
    print("| items | item slots | interpreted s | installed s | interpreted / installed |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in a.items.split(",")):
        pure_s, pure_answer = best_of(interpreted, n, a.runs)
        inst_s, inst_answer = best_of(installed, n, a.runs)
        assert pure_answer == inst_answer, "the two builds answered differently"
        print(f"| {n:,} | {2 * n:,} | {pure_s:.2f} | {inst_s:.2f} | {pure_s / inst_s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

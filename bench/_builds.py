"""The builds a bench compares in one run: gazette interpreted or compiled (mypyc), on
asyncio's event loop or uvloop.

A bench given ``--builds interpreted,compiled,compiled+uvloop`` becomes a *parent*: it runs
itself once per build as a *child* (the same script and arguments, by that build's python, with
``GAZETTE_EVENT_LOOP`` set), collects each child's figures from the JSON file the child writes
(``--json-out``), and prints one table of them beside the peer and the ceiling.

Invariants:

* Without ``--builds`` nothing here changes a bench: it runs in its own process as before
  (``run`` is ``asyncio.run`` then).
* A build is a name, a python and an event loop. ``compiled`` is the compiled virtualenv's
  python (``--compiled-venv``), whose gazette is the wheel ``scripts/compiled_check.sh``
  builds; ``interpreted`` the interpreted virtualenv's (``--interpreted-venv``), whose gazette
  is the pure wheel of the same checkout (the same script with ``GAZETTE_PURE=1``) beside the
  same packages. Both are installed as users install them, byte-compiled: the development
  virtualenv's editable gazette is not a fair "interpreted" (it runs with
  ``PYTHONDONTWRITEBYTECODE`` here, so every lazy import compiles its source inside whatever
  is being timed: the first publish case ran at 0.55-0.6x of the installed wheel's rate for
  that alone). Each child reports the build it actually loaded
  (``gazette._compiled.build_line``), in its own process and in the brokers it starts
  (``python -m gazette.cli.serve``), and the parent stops if either is not the build it asked
  for: a compiled build that fell back to its ``.py`` modules would make the comparison a lie.
  So that no checkout shadows a build's installed gazette, children run with
  ``PYTHONSAFEPATH`` set (neither the script's nor the working directory on ``sys.path``,
  in them or in the brokers they start) and without ``PYTHONPATH``.
* Each virtualenv is (re)built when absent, on ``--rebuild``, or when its stamp (a hash of
  what the wheel is built from and of the packages installed beside it) differs from the one
  written after its last successful provisioning; the stamp is written only then.
* Children run one after another, never at once: they would share the cores they measure.
  Each runs in a session of its own and is stopped by its PID alone (SIGINT, a bounded wait,
  then SIGKILL) when the parent is interrupted, so its ``finally`` blocks stop its peers.
* The peer (JetStream, Bytewax) runs once, in the first build's child; the others get
  ``--no-peer``. A child's gazette runs on the build's loop: brokers it starts inherit
  ``GAZETTE_EVENT_LOOP``, and gazette run in the bench's own process runs under ``run``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["Build", "Combined", "Figure", "add_arguments", "is_parent", "run", "run_builds",
           "write_result"]

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]  # the checkout the bench (and the wheel) comes from
DEFAULT_VENV = ROOT / "var/bench/compiled-venv"
DEFAULT_PURE_VENV = ROOT / "var/bench/interpreted-venv"
STAMP_NAME = ".gazette-bench-stamp"
BUILD_ENV = "GAZETTE_BENCH_BUILD"  # the build a child runs as (set by the parent)
# (build name, compiled, event loop): the loop is explicit, never "auto", so that a build
# means the same on every machine.
BUILDS: dict[str, tuple[bool, str]] = {
    "interpreted": (False, "asyncio"),
    "interpreted+uvloop": (False, "uvloop"),
    "compiled": (True, "asyncio"),
    "compiled+uvloop": (True, "uvloop"),
}
# What the four benches import beyond the wheel and what compiled_check.sh installs with it
# ([uvloop,etcd], trustme, pytest...): nats-py (JetStream), bytewax (consumer_bench's peer),
# the rocksdb extra's packages (recoverylog_bench). Part of the stamp: a change reinstalls.
BENCH_PACKAGES = ("nats-py", "bytewax", "rocksdict", "inotify_simple", "trustme")
STOP_GRACE = 60.0  # seconds a child has to stop its peers after SIGINT


@dataclass(frozen=True)
class Build:
    """One build a bench runs under: its name, python and event loop."""

    name: str
    python: str
    event_loop: str  # "asyncio" or "uvloop": the child's GAZETTE_EVENT_LOOP

    @property
    def compiled(self) -> bool:
        return BUILDS[self.name][0]

    @property
    def tag(self) -> str:
        """A short name for the ratio columns."""
        return self.name.replace("interpreted", "int").replace("compiled", "cmp") \
            .replace("uvloop", "uv")


@dataclass
class Figure:
    """One workload's figure in one child: its value (in ``unit``), and where the bench has
    them the peer's figure and this build's ceiling in the same unit."""

    workload: str
    unit: str
    value: float | None
    detail: str = ""  # shown beside the value (e.g. appends/s beside MB/s)
    peer: float | None = None
    peer_detail: str = ""
    ceiling: float | None = None
    lower_is_better: bool = False  # a latency: ratios read the other way
    compare: bool = True  # gazette's work, checked for regressions (not a file copy's)


# -- arguments -------------------------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The parent's options (``--builds``, ``--compiled-venv``, ``--rebuild``) and the child's
    hidden ones (``--json-out``, ``--no-peer``)."""
    ap.add_argument("--builds", default="", metavar="LIST",
                    help="run once per build and print them side by side: comma-separated of "
                         f"{', '.join(BUILDS)} (default: this process only)")
    ap.add_argument("--compiled-venv", metavar="DIR", default=str(DEFAULT_VENV),
                    help="the compiled build's virtualenv, made or refreshed as needed "
                         "(default: var/bench/compiled-venv in the checkout)")
    ap.add_argument("--interpreted-venv", metavar="DIR", default=str(DEFAULT_PURE_VENV),
                    help="the interpreted build's virtualenv (the pure wheel of this checkout), "
                         "made or refreshed as needed (default: var/bench/interpreted-venv)")
    ap.add_argument("--rebuild", action="store_true",
                    help="rebuild the virtualenvs' wheels even if their sources are unchanged")
    ap.add_argument("--json-out", metavar="PATH", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-peer", action="store_true", help=argparse.SUPPRESS)


def is_parent(args: argparse.Namespace) -> bool:
    """Whether this process runs the builds (a child never does, even if given ``--builds``:
    no recursion however the options were spelled)."""
    return bool(args.builds) and not args.json_out


def parse_builds(text: str, venv: Path, pure_venv: Path) -> list[Build]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BUILDS]
    if unknown or not names:
        raise SystemExit(f"--builds: unknown build(s) {', '.join(unknown) or '(none)'}; "
                         f"expected a comma-separated list of {', '.join(BUILDS)}")
    if len(set(names)) != len(names):
        raise SystemExit(f"--builds: a build is named twice in {text!r}")
    builds = []
    for name in names:
        compiled, loop = BUILDS[name]
        python = str((venv if compiled else pure_venv) / "bin" / "python")
        builds.append(Build(name, python, loop))
    return builds


# -- the compiled virtualenv -----------------------------------------------------------------


def source_stamp() -> str:
    """A hash of what the compiled wheel is built from: every file git lists under
    ``gazette/`` (tracked, and untracked but not ignored, as compiled_check.sh packs them),
    ``setup.py`` and ``pyproject.toml``, as they are in the working tree; and the extra
    packages installed beside the wheel."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
         "gazette", "setup.py", "pyproject.toml"],
        cwd=ROOT, capture_output=True, check=True).stdout
    digest = hashlib.sha256()
    for name in sorted(set(filter(None, listed.split(b"\0")))):
        path = ROOT / os.fsdecode(name)
        if not path.is_file():  # deleted in the working tree: not packed either
            continue
        digest.update(name + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(BENCH_PACKAGES).encode())
    return digest.hexdigest()


def _stream(argv: Sequence[str], prefix: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> int:
    """Runs ``argv``, printing its output (stdout and stderr) line by line behind ``prefix``."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd, text=True, bufsize=1,
                          start_new_session=True) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(f"{prefix}{line}", end="", flush=True)
            return proc.wait()
        except BaseException:  # KeyboardInterrupt included: stop it before going on
            _stop(proc)
            raise


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stops a child by its PID: SIGINT (its ``finally`` blocks stop its peers), a bounded
    wait, then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def provision(venv: Path, rebuild: bool, compiled: bool = True) -> str:
    """Makes ``venv`` hold the compiled (else the pure) build of this checkout and the
    benches' packages; returns its ``gazette --version`` line."""
    kind = "compiled" if compiled else "interpreted"
    stamp_file = venv / STAMP_NAME
    stamp = source_stamp()
    python = venv / "bin" / "python"
    current = stamp_file.read_text().strip() if stamp_file.is_file() else ""
    if rebuild or not python.exists() or current != stamp:
        why = ("--rebuild" if rebuild else "absent" if not python.exists()
               else "sources changed since its last build")
        print(f"{kind} build: building the wheel into {venv} ({why}"
              f"{'; mypyc takes 1-3 minutes' if compiled else ''})", flush=True)
        stamp_file.unlink(missing_ok=True)  # stale until this provisioning succeeds
        venv.parent.mkdir(parents=True, exist_ok=True)
        # One script builds both: the wheel of this checkout, compiled or (GAZETTE_PURE=1)
        # pure, installed with the suite's extras.
        env = dict(os.environ, COMPILED_VENV=str(venv), COMPILED_ONLY_INSTALL="1",
                   GAZETTE_PURE="0" if compiled else "1")
        if _stream(["bash", "scripts/compiled_check.sh"], f"[{kind}-venv] ", env=env, cwd=ROOT):
            raise SystemExit(f"{kind} build: scripts/compiled_check.sh failed (output above)")
        print(f"{kind} build: installing the benches' packages: {' '.join(BENCH_PACKAGES)}",
              flush=True)
        if _stream([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-c", str(ROOT / "constraints/dev.txt"), *BENCH_PACKAGES],
                   f"[{kind}-venv] ", cwd=ROOT):
            raise SystemExit(f"{kind} build: pip install of the benches' packages failed")
        stamp_file.write_text(stamp + "\n")
    else:
        print(f"{kind} build: {venv} is current (its sources' stamp matches)", flush=True)
    version = subprocess.run([str(venv / "bin" / "gazette"), "--version"], capture_output=True,
                             text=True, check=True, cwd=venv).stdout.strip()
    print(f"{kind} build: {version}", flush=True)
    return version


# -- the child's side ------------------------------------------------------------------------


def run(main: Coroutine[Any, Any, T]) -> T:
    """Runs ``main`` as ``asyncio.run`` does; in a build's child, on the build's event loop
    (``GAZETTE_EVENT_LOOP``, made as gazette's own processes make it)."""
    if not os.environ.get(BUILD_ENV):
        return asyncio.run(main)  # as before --builds existed
    from gazette.server.loop import loop_factory

    _, factory = loop_factory(os.environ.get("GAZETTE_EVENT_LOOP", "auto"))
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def build_info() -> dict[str, str]:
    """The build this process runs: what its gazette is (compiled or not) and its loop."""
    import gazette
    from gazette._compiled import build_line
    from gazette.server.loop import loop_factory

    # What the brokers this process starts load: they are ``python -m gazette.cli.serve``
    # (or the console script beside it) in this environment and working directory.
    servers = subprocess.run([sys.executable, "-m", "gazette.cli.serve", "--version"],
                             capture_output=True, text=True, check=True).stdout.strip()
    return {
        "name": os.environ.get(BUILD_ENV, ""),
        "python": sys.executable,
        "gazette": f"gazette {gazette.__version__}; {build_line()}",
        "source": str(Path(gazette.__file__).resolve().parent),
        "servers": servers,
        "event_loop": loop_factory(os.environ.get("GAZETTE_EVENT_LOOP", "auto"))[0],
    }


def write_result(path: str, figures: Sequence[Figure], notes: Sequence[str] = (),
                 extra: dict[str, Any] | None = None) -> None:
    """The child's figures, for its parent: written to ``path`` (``--json-out``)."""
    data = {"build": build_info(), "figures": [asdict(f) for f in figures],
            "notes": list(notes), "extra": extra or {}}
    Path(path).write_text(json.dumps(data, indent=1))


# -- the parent's side -----------------------------------------------------------------------

# Options only the parent reads: not passed on to a child.
_PARENT_OPTIONS = {"--builds": True, "--compiled-venv": True, "--interpreted-venv": True,
                   "--rebuild": False}


def child_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without the parent's options (``--opt value`` and ``--opt=value`` forms)."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in _PARENT_OPTIONS:
            skip = _PARENT_OPTIONS[name] and "=" not in token
            continue
        out.append(token)
    return out


def run_child(build: Build, script: Path, argv: Sequence[str], peer: bool) -> dict[str, Any]:
    """Runs ``script`` with ``argv`` as ``build``, streaming its output behind ``[name] ``;
    returns the JSON it wrote."""
    fd, out = tempfile.mkstemp(prefix="gazette-bench-", suffix=".json")
    os.close(fd)
    env = dict(os.environ, GAZETTE_EVENT_LOOP=build.event_loop, PYTHONUNBUFFERED="1")
    env[BUILD_ENV] = build.name
    # No directory of the checkout may shadow the build's installed gazette: not the script's
    # nor the working directory (``python -m gazette.cli.serve`` would import from a checkout
    # it is run in). The benches put bench/ on sys.path themselves.
    env["PYTHONSAFEPATH"] = "1"
    env.pop("PYTHONPATH", None)
    argv = [build.python, str(script), *argv, "--json-out", out]
    if not peer:
        argv.append("--no-peer")
    try:
        code = _stream(argv, f"[{build.name}] ", env=env)
        if code != 0:
            raise SystemExit(f"build {build.name}: the bench exited with status {code}")
        data: dict[str, Any] = json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)
    for what in ("gazette", "servers"):
        got = data["build"][what]
        if ("compiled (mypyc)" in got) != build.compiled:
            raise SystemExit(f"build {build.name}: its child's {what} ran {got!r} "
                             f"({build.python}); not the build asked for")
    return data


@dataclass
class Combined:
    """Every child's figures, by workload (in the order the children printed them)."""

    builds: list[Build]
    info: dict[str, dict[str, str]] = field(default_factory=dict)  # build name -> build_info
    rows: dict[str, dict[str, Figure]] = field(default_factory=dict)  # workload -> build -> fig
    notes: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, build: Build, data: dict[str, Any]) -> None:
        self.info[build.name] = data["build"]
        self.notes[build.name] = data["notes"]
        self.extra[build.name] = data["extra"]
        for f in data["figures"]:
            fig = Figure(**f)
            self.rows.setdefault(fig.workload, {})[build.name] = fig

    def value(self, workload: str, build: str) -> float | None:
        fig = self.rows.get(workload, {}).get(build)
        return fig.value if fig is not None else None

    def peer(self, workload: str) -> Figure | None:
        """The figure of the child that ran the peer on ``workload``, if any did."""
        for fig in self.rows.get(workload, {}).values():
            if fig.peer is not None:
                return fig
        return None

    def of_peer(self, workload: str, build: str) -> float | None:
        p, v = self.peer(workload), self.value(workload, build)
        return _ratio(v, p.peer if p is not None else None)

    def of_ceiling(self, workload: str, build: str) -> float | None:
        fig = self.rows.get(workload, {}).get(build)
        return _ratio(fig.value, fig.ceiling) if fig is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(c: Combined, peer_name: str, ceiling_name: str) -> str:
    """One row per workload: each build's figure, the peer's, each build's ratio to the peer
    and to its ceiling, and the last build over the first."""
    names = [b.name for b in c.builds]
    tags = [b.tag for b in c.builds]
    has_peer = any(c.peer(w) is not None for w in c.rows)
    has_ceiling = any(f.ceiling is not None for r in c.rows.values() for f in r.values())
    first, last = c.builds[0], c.builds[-1]
    # (group, header, cells) per column; the group is printed above its first column.
    cols: list[tuple[str, str, list[str]]] = []
    workloads = list(c.rows)
    units = [next(iter(c.rows[w].values())).unit for w in workloads]
    cols.append(("", "workload", workloads))
    cols.append(("", "unit", units))
    for name in names:
        cells = []
        for w in workloads:
            fig = c.rows[w].get(name)
            cells.append("-" if fig is None or fig.value is None
                         else _num(fig.value) + (f" ({fig.detail})" if fig.detail else ""))
        cols.append(("figures" if name == names[0] else "", name, cells))
    if has_peer:
        cells = []
        for w in workloads:
            p = c.peer(w)
            cells.append("-" if p is None else
                         _num(p.peer) + (f" ({p.peer_detail})" if p.peer_detail else ""))
        cols.append(("peer", peer_name, cells))
        for i, name in enumerate(names):
            cols.append((f"/ {peer_name}" if i == 0 else "", tags[i],
                         [_times(c.of_peer(w, name)) for w in workloads]))
    if has_ceiling:
        for i, name in enumerate(names):
            cols.append((f"/ {ceiling_name}" if i == 0 else "", tags[i],
                         [_times(c.of_ceiling(w, name)) for w in workloads]))
    if len(c.builds) > 1:
        cols.append(("builds", f"{last.tag} / {first.tag}",
                     [_times(_ratio(c.value(w, last.name), c.value(w, first.name)))
                      for w in workloads]))
    widths = [max(len(h), *(len(x) for x in cells)) for _, h, cells in cols]
    # A group's label is printed over its columns (up to the next label): widen its last
    # column if the label is longer than they are.
    starts = [i for i, (g, _, _) in enumerate(cols) if g] + [len(cols)]
    for a, b in zip(starts, starts[1:], strict=False):
        span = sum(widths[a:b]) + 2 * (b - a - 1)
        widths[b - 1] += max(0, len(cols[a][0]) - span)
    offsets = [sum(widths[:i]) + 2 * i for i in range(len(cols))]
    group_line = ""
    for (g, _, _), at in zip(cols, offsets, strict=True):
        if g:
            group_line = group_line.ljust(at) + g
    lines = [group_line]
    for r in range(-1, len(workloads)):  # -1: the header
        texts = [h if r < 0 else cells[r] for _, h, cells in cols]
        lines.append("  ".join(t.ljust(wd) if i == 0 else t.rjust(wd)
                               for i, (t, wd) in enumerate(zip(texts, widths, strict=True))))
        if r < 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)


def regressions(c: Combined) -> list[str]:
    """Workloads where a compiled build is below 0.95x the interpreted build of the same
    loop (else of ``interpreted``): "compiled against interpreted: no regression"."""
    by_name = {b.name: b for b in c.builds}
    out = []
    for b in c.builds:
        if not b.compiled:
            continue
        base = by_name.get(b.name.replace("compiled", "interpreted")) or by_name.get("interpreted")
        if base is None:
            continue
        checked, below = 0, 0
        for w, figs in c.rows.items():
            v, ref = c.value(w, b.name), c.value(w, base.name)
            if v is None or not ref or not figs[b.name].compare:
                continue
            checked += 1
            r = v / ref
            if figs[b.name].lower_is_better:
                r = ref / v if v else float("inf")
            if r < 0.95:
                below += 1
                out.append(f"  {b.name} vs {base.name}: {w}: {r:.3f}x (REGRESSION: below 0.95x)")
        if checked and not below:
            out.append(f"  {b.name} vs {base.name}: no workload below 0.95x ({checked} compared)")
    return out


Acceptance = Callable[[Combined], list[str]]


def run_builds(args: argparse.Namespace, argv: Sequence[str], script: str, *,
               peer_name: str | None = "peer", ceiling_name: str = "ceiling",
               acceptance: Acceptance | None = None,
               acceptance_title: str = "acceptance (issue 32, native speed)",
               peer_note: str = "") -> int:
    """The parent: provisions what the builds need, runs one child per build (the first also
    runs the peer; ``peer_name`` None: the bench has none), and prints the combined table,
    the acceptance bars and regressions."""
    # A shell starts background jobs with SIGINT ignored, which the children would inherit:
    # restore Python's handler so that they (and this process) can be interrupted.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    venv = Path(args.compiled_venv).resolve()
    pure_venv = Path(args.interpreted_venv).resolve()
    builds = parse_builds(args.builds, venv, pure_venv)
    if any(not b.compiled for b in builds):
        provision(pure_venv, args.rebuild, compiled=False)
    if any(b.compiled for b in builds):
        provision(venv, args.rebuild)
    combined = Combined(builds)
    for i, build in enumerate(builds):
        print(f"\n=== build {build.name}: {build.python}, GAZETTE_EVENT_LOOP={build.event_loop}"
              f"{f', with the peer ({peer_name})' if i == 0 and peer_name else ''}", flush=True)
        combined.add(build, run_child(build, Path(script).resolve(), child_argv(argv), i == 0))

    print(f"\n=== {Path(script).name}: {len(builds)} builds, one run each, one after another")
    for build in builds:
        info = combined.info[build.name]
        print(f"  {build.name:<19} {info['gazette']}; loop {info['event_loop']}; "
              f"{info['python']}")
        if info["servers"] != info["gazette"]:
            print(f"  {'':<19} its brokers: {info['servers']}")
    figs = [f for row in combined.rows.values() for f in row.values()]
    if any(f.peer is not None for f in figs):
        print(f"  peer ({peer_name}): measured once, in the {builds[0].name} child"
              f"{'; ' + peer_note if peer_note else ''}")
    elif peer_note:
        print(f"  peer: {peer_note}")
    if any(f.ceiling is not None for f in figs):
        print(f"  ceiling ({ceiling_name}): measured in each build's child, on that build")
    print()
    print(table(combined, peer_name or "peer", ceiling_name))
    for build in builds:
        if combined.notes[build.name]:
            print(f"\n{build.name}, the bench's own summary:")
            for note in combined.notes[build.name]:
                print(f"  {note}")
    if acceptance is not None:
        lines = acceptance(combined)
        if lines:
            print(f"\n{acceptance_title}:")
            print("\n".join(lines))
    found = regressions(combined)
    if found:
        print("\ncompiled against interpreted (no regression: >= 0.95x on every workload):")
        print("\n".join(found))
    return 0

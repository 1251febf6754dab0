"""What the package declares agrees with what is checked: every direct dependency's floor in
pyproject.toml is the version constraints/floors.txt pins (which scripts/floors.sh installs
and tests), the generators and linters are pinned in constraints/dev.txt, and the version is
written once (gazette.__version__)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import gazette

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Extras that are not the library's: the dev tools (pinned in constraints/dev.txt instead) and
# the benchmarks' comparison systems and the docs site's tools (pinned in constraints/dev.txt too).
UNCHECKED_EXTRAS = {"dev", "bench", "docs"}


def _pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def _declared_floors() -> dict[str, str]:
    reqs = list(PYPROJECT["project"]["dependencies"])
    for extra, deps in PYPROJECT["project"]["optional-dependencies"].items():
        if extra not in UNCHECKED_EXTRAS:
            reqs += [d for d in deps if not d.startswith("gazette[")]
    floors: dict[str, str] = {}
    for text in reqs:
        req = Requirement(text)
        lows = [s.version for s in req.specifier if s.operator == ">="]
        assert len(lows) == 1, f"{text!r} declares no single >= floor"
        name = canonicalize_name(req.name)
        assert floors.get(name, lows[0]) == lows[0], f"{name} has two different floors"
        floors[name] = lows[0]
    return floors


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def test_every_floor_is_pinned_in_the_floors_constraints() -> None:
    floors = _declared_floors()
    pins = _pins(ROOT / "constraints" / "floors.txt")
    assert sorted(floors) == sorted(pins)
    mismatched = {n: (floors[n], pins[n]) for n in floors if _release(floors[n]) != _release(pins[n])}
    assert mismatched == {}, "pyproject floor vs constraints/floors.txt pin"


def test_the_generated_modules_runtime_floor_is_declared() -> None:
    """The floors of grpcio and protobuf are at least what the checked-in generated modules
    validate at import: regenerating with newer tools raises them, and this says so."""
    floors = _declared_floors()
    proto = (ROOT / "gazette" / "protocol" / "protocol_pb2.py").read_text()
    m = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
                  proto)
    assert m is not None
    assert _release(floors["protobuf"]) >= tuple(int(g) for g in m.groups())
    grpc_gen = (ROOT / "gazette" / "protocol" / "protocol_pb2_grpc.py").read_text()
    g = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_gen)
    assert g is not None
    assert _release(floors["grpcio"]) >= _release(g.group(1))


def test_the_generators_linters_and_type_checker_are_pinned() -> None:
    pins = _pins(ROOT / "constraints" / "dev.txt")
    for tool in ("grpcio-tools", "mypy-protobuf", "ruff", "mypy", "import-linter",
                 "types-protobuf", "types-pyyaml", "build", "twine"):
        assert tool in pins, tool
    dev = {canonicalize_name(Requirement(d).name) for d in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert dev - {"gazette", "psycopg"} <= set(pins), "a dev tool without a pin"


def test_the_version_is_written_once() -> None:
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gazette.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", gazette.__version__)


def test_the_images_pins_satisfy_the_packages_requirements() -> None:
    """deploy/requirements.txt pins every requirement of what the image installs (the core and
    its extras), at a version the requirement allows."""
    pins = _pins(ROOT / "deploy" / "requirements.txt")
    extras = PYPROJECT["project"]["optional-dependencies"]
    reqs = [Requirement(t) for t in [*PYPROJECT["project"]["dependencies"], *extras["s3"],
                                     *extras["postgres"], *extras["sql-sqlite"], *extras["rocksdb"]]]
    wrong = [str(r) for r in reqs if (r.marker is None or r.marker.evaluate())
             and not r.specifier.contains(pins.get(canonicalize_name(r.name), "0"))]
    assert wrong == [], "unpinned, or pinned outside the requirement, in deploy/requirements.txt"
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "USER 10001" in dockerfile and "-c /tmp/requirements.txt" in dockerfile
    assert re.search(r"ARG PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+", dockerfile)

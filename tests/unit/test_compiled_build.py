"""The compiled build (setup.py, gazette/_compiled.py): what it compiles, how it is forced
pure, and, in a compiled install (``GAZETTE_EXPECT_COMPILED=1``, as scripts/compiled_check.sh
runs these tests), that every listed module really is an extension module."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gazette import _compiled
from gazette.cli import version_text

ROOT = Path(__file__).resolve().parents[2]
EXPECT_COMPILED = os.environ.get("GAZETTE_EXPECT_COMPILED", "") not in ("", "0")


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gazette_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the helpers; setup() runs only as __main__
    return module


@pytest.mark.skipif(not EXPECT_COMPILED, reason="not a compiled install")
def test_every_listed_module_is_compiled() -> None:
    fallen_back = []
    for name in _compiled.COMPILED_MODULES:
        path = importlib.import_module(name).__file__ or ""
        if not path.endswith(".so"):
            fallen_back.append(f"{name}: {path}")
    assert not fallen_back, f"imported from source, not compiled: {fallen_back}"
    n = len(_compiled.COMPILED_MODULES)
    assert _compiled.build_line() == f"compiled (mypyc): {n} modules"
    assert version_text("gazette").endswith(f"; compiled (mypyc): {n} modules")


@pytest.mark.skipif(EXPECT_COMPILED, reason="a compiled install")
def test_source_tree_runs_interpreted() -> None:
    # Outside a compiled install every listed module is a .py file: in the checkout (an
    # extension left beside one, a stray in-place build, would shadow the source being edited
    # and tested) and in a pure wheel (compiled_check.sh where no C compiler works).
    assert _compiled.compiled_modules() == []
    assert _compiled.build_line() == "interpreted"
    assert version_text("gazctl").endswith("; interpreted")


@pytest.mark.skipif(EXPECT_COMPILED, reason="a compiled install: no checkout")
def test_listed_modules_exist_and_the_mypyc_pin_is_the_type_checkers() -> None:
    for name in _compiled.COMPILED_MODULES:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name
    setup = _setup_module()
    assert setup._compiled_list() == list(_compiled.COMPILED_MODULES)
    pin = re.search(r"^mypy==(\S+)$", (ROOT / "constraints/dev.txt").read_text(), re.M)
    assert pin is not None
    assert setup.MYPYC_REQUIREMENT == f"mypy=={pin.group(1)}"


@pytest.mark.skipif(EXPECT_COMPILED, reason="a compiled install: no checkout")
@pytest.mark.parametrize(
    ("env", "argv", "why"),
    [
        ({"GAZETTE_PURE": "1"}, ["setup.py", "bdist_wheel"], "GAZETTE_PURE is set"),
        ({}, ["setup.py", "editable_wheel"], "an editable install"),
        ({"CC": "no-such-compiler-here"}, ["setup.py", "bdist_wheel"], "no C compiler"),
        ({"GAZETTE_PURE": "0"}, ["setup.py", "bdist_wheel"], None),
    ],
)
def test_pure_python_when_forced_or_without_a_compiler(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], why: str | None
) -> None:
    setup = _setup_module()
    monkeypatch.delenv("GAZETTE_PURE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", argv)
    got = setup._why_pure()
    if why is None:
        assert got is None or got.startswith("no C compiler")  # a machine without cc
    else:
        assert got is not None and got.startswith(why)
        assert setup._ext_modules() == []


# -- what mypyc compiles differently: checked in the source of every listed module -------------

_ENUM_BASES = ("Enum", "IntEnum", "Flag", "IntFlag", "StrEnum")


def _listed_sources() -> list[tuple[str, ast.Module]]:
    return [(name, ast.parse((ROOT / (name.replace(".", "/") + ".py")).read_text()))
            for name in _compiled.COMPILED_MODULES]


@pytest.mark.skipif(EXPECT_COMPILED, reason="a compiled install: no checkout")
def test_no_try_binds_one_name_to_two_exception_types() -> None:
    # mypyc types a name by its first binding: ``except A as err: ... except B as err:`` then
    # checks a B against A and raises TypeError in place of the handler (it ended garbage
    # requests UNKNOWN instead of INVALID_ARGUMENT, and HPACK errors without their GOAWAY).
    # Likewise across one function's try statements.
    found = []
    for name, tree in _listed_sources():
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            bound: dict[str, set[str]] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                    bound.setdefault(node.name, set()).add(ast.unparse(node.type))
            found += [f"{name}:{fn.lineno} {fn.name}() {n}: {sorted(t)}"
                      for n, t in bound.items() if len(t) > 1]
    assert not found, f"a name per except clause, please: {found}"


@pytest.mark.skipif(EXPECT_COMPILED, reason="a compiled install: no checkout")
def test_no_coroutine_suspends_in_an_except_or_finally_block() -> None:
    # A compiled coroutine that awaits inside an ``except`` or ``finally`` block mixes up
    # exception states with the other tasks (mypy 2.4's mypyc): one whose finally awaited
    # re-raised another task's CancelledError after its own clean exit (a shard's publisher
    # closing as the shard's transaction loop was cancelled), one that awaited in a handler
    # leaked its handled error into another task. Await outside: catch into a variable,
    # clean up, then raise it (``player._outcome``, ``TransactionLoop.run``).
    found = []
    for name, tree in _listed_sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            blocks = [("finally", node.finalbody)] + [("except", h.body) for h in node.handlers]
            for kind, body in blocks:
                for st in body:
                    bad = next((s for s in ast.walk(st)
                                if isinstance(s, (ast.Await, ast.AsyncFor, ast.AsyncWith))), None)
                    if bad is not None:
                        found.append(f"{name}:{bad.lineno} await in {kind}")
                        break
    assert not found, f"no await inside except or finally blocks of compiled modules: {found}"


@pytest.mark.skipif(EXPECT_COMPILED, reason="a compiled install: no checkout")
def test_class_attributes_of_listed_modules_are_class_vars() -> None:
    # A plain class-level assignment in a compiled class does not override its base's
    # attribute (an error class's ``grpc_code`` read through the class stayed its root's:
    # INVALID_ARGUMENT became UNKNOWN); ``ClassVar`` does. Enum members are exempt.
    found = []
    for name, tree in _listed_sources():
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            if any(ast.unparse(b).split(".")[-1] in _ENUM_BASES for b in cls.bases):
                continue
            for st in cls.body:
                if isinstance(st, ast.Assign):
                    targets = [ast.unparse(t) for t in st.targets]
                    if targets not in (["__slots__"], ["__match_args__"]):
                        found.append(f"{name}:{st.lineno} {cls.name}.{targets[0]}")
    assert not found, f"annotate these ClassVar (or set them in __init__): {found}"

"""The compiled build: mypyc compiles the modules of ``gazette/_compiled.py``'s list into C
extensions when a wheel is built (``pip install``, ``python -m build``).

Everything else about the package is in pyproject.toml; this file only adds ``ext_modules``.

Invariants:

* The compiled modules are the same source as the interpreted ones (mypyc compiles the
  ``mypy --strict`` code as it is); a wheel without them is the pure-Python package, whole.
* Pure Python is built when ``GAZETTE_PURE`` is set (to anything but "" or "0"), for an editable
  install (its extensions would sit beside the sources and go stale as they are edited), or
  when no C compiler works; the build says which on stderr. mypy (hence mypyc) is requested
  as a build requirement only when compiling.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

from setuptools import setup

# The version mypyc must be: the one that type-checks the code (constraints/dev.txt's pin;
# tests/unit/test_compiled_build.py keeps the two equal).
MYPYC_REQUIREMENT = "mypy==2.4.1"


def _compiled_list() -> list[str]:
    """The modules to compile, from gazette/_compiled.py (read as text: importing gazette
    during its own build would need its dependencies)."""
    namespace: dict[str, object] = {}
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "gazette", "_compiled.py"), encoding="utf-8") as f:
        exec(compile(f.read(), "gazette/_compiled.py", "exec"), namespace)
    modules = namespace["COMPILED_MODULES"]
    assert isinstance(modules, tuple)
    return [str(m) for m in modules]


def _why_pure() -> str | None:
    if os.environ.get("GAZETTE_PURE", "") not in ("", "0"):
        return "GAZETTE_PURE is set"
    if "editable_wheel" in sys.argv:
        return "an editable install"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH)"
    return None


def _ext_modules() -> list[object]:
    why = _why_pure()
    if why is not None:
        print(f"gazette: building pure Python ({why})", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # only while setuptools collects the build requirements
        return []
    paths = [m.replace(".", "/") + ".py" for m in _compiled_list()]
    print(f"gazette: compiling {len(paths)} modules with mypyc", file=sys.stderr)
    # The same build wherever it runs: gazette's dependencies are not looked up (pip builds in
    # an isolated environment without them), so their types are Any, and the modules the
    # compiled ones import are analysed for types without reporting what that Any does to
    # them (mypy --strict, with the dependencies installed, is the lint's job, not the build's).
    config = os.path.join(_build_dir(), "mypyc.ini")
    with open(config, "w", encoding="utf-8") as f:
        f.write("[mypy]\npython_version = 3.11\nignore_missing_imports = True\n"
                "no_site_packages = True\nfollow_imports = silent\n")
    # One group whose shared library lives inside the package (not a stray top-level module).
    return list(
        mypycify(["--config-file", config, *paths], opt_level="3", group_name="gazette._mypyc")
    )


def _build_dir() -> str:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build")
    os.makedirs(path, exist_ok=True)
    return path


if __name__ == "__main__":  # as setuptools runs it; tests import it for its helpers
    setup(
        ext_modules=_ext_modules(),
        setup_requires=[] if _why_pure() else [MYPYC_REQUIREMENT],
    )

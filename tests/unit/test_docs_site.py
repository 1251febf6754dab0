"""The docs site builds with ``mkdocs build --strict`` (a broken link, nav entry or docstring
reference fails it), without importing the optional parts it documents, and its API reference
covers gazette, gazette.consumer, gazette.message, gazette.client and gazette.spark: every name
each package exports with a docstring has its entry."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gazette", "gazette.consumer", "gazette.message", "gazette.client", "gazette.spark")


def _script(name: str, needs: str) -> types.ModuleType:
    pytest.importorskip(needs, reason="the docs extra is not installed (the dev extra has it)")
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    for tool in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material"):
        pytest.importorskip(tool, reason="the docs extra is not installed (the dev extra has it)")
    tmp = tmp_path_factory.mktemp("site")
    # pyspark and pyarrow shadowed by modules that fail to import: the reference must be read
    # from the source, never by importing (a docs build needs no spark extra).
    blocked = tmp / "blocked"
    for name in ("pyspark", "pyarrow"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('the docs build imported {name}')\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(blocked), str(ROOT)])}
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    return out, log


@pytest.mark.timeout(300)
def test_the_site_builds_strict_without_warnings(site: tuple[Path, str]) -> None:
    out, log = site
    assert "WARNING" not in log and "ERROR" not in log, log
    for page in ("index.html", "consumers/index.html", "spark/index.html", "security/index.html",
                 "architecture/index.html", "changelog/index.html",
                 "examples/bike_share/index.html"):
        assert (out / page).is_file(), page
    # The home page is the README, its links turned into links between pages.
    home = (out / "index.html").read_text()
    assert 'href="spark/"' in home and 'href="examples/bike_share/"' in home


@pytest.mark.timeout(300)
def test_the_api_reference_covers_each_package(site: tuple[Path, str]) -> None:
    out, _ = site
    for package in PACKAGES:
        html = (out / "reference" / package / "index.html").read_text()
        # Every exported class and function with a docstring (the source's, read statically).
        module = importlib.import_module(package)
        for name in module.__all__:
            if package == "gazette.spark" and name == "GazetteDataSource":
                continue  # importing it needs pyspark; checked below by name
            obj = getattr(module, name)
            if isinstance(obj, type | types.FunctionType) and obj.__doc__ and obj.__module__.startswith("gazette"):
                assert f'id="{package}.{name}"' in html, f"{package}.{name} missing from its page"
    pages = {p: (out / "reference" / p / "index.html").read_text() for p in PACKAGES}
    assert 'id="gazette.JournalClient"' in pages["gazette"]
    assert 'id="gazette.consumer.Application"' in pages["gazette.consumer"]
    assert 'id="gazette.message.Publisher"' in pages["gazette.message"]
    assert 'id="gazette.client.JournalClient"' in pages["gazette.client"]
    assert 'id="gazette.spark.GazetteDataSource"' in pages["gazette.spark"]
    # Sphinx roles rendered as code, not verbatim.
    assert not any(":class:`" in html or ":func:`" in html for html in pages.values())


def test_links_to_published_files_become_links_between_pages() -> None:
    hooks = _script("docs_hooks", "mkdocs")
    readme = "[bike-share](examples/bike_share/README.md) and [Spark](docs/spark.md#modes)"
    assert hooks.rewrite_links(readme, "index.md") == (
        "[bike-share](examples/bike_share.md) and [Spark](spark.md#modes)")
    guide = "[bike-share](../examples/bike_share/README.md), [sec](security.md)"
    assert hooks.rewrite_links(guide, "consumers.md") == (
        "[bike-share](examples/bike_share.md), [sec](security.md)")
    # From an example's page, back to a guide; other links stay as written (strict checks them).
    assert hooks.rewrite_links("[g](../../docs/consumers.md)", "examples/word_count.md") == (
        "[g](../consumers.md)")
    for kept in ("[w](https://gazette.dev)", "[a](#anchor)", "[s](../gazette/auth.py)"):
        assert hooks.rewrite_links(kept, "consumers.md") == kept


def test_sphinx_roles_and_comment_docs() -> None:
    griffe_ext = _script("docs_griffe", "griffe")
    assert griffe_ext.unroled("Write an :class:`Application` or :func:`~gazette.run.run_consumer`.") == (
        "Write an `Application` or `run_consumer`.")
    assert griffe_ext.unroled(":meth:`.Shard.store`") == "`Shard.store`"
    lines = ["x = 1", "#: The label.", "#: Second line.", "LABEL = 'a'"]
    assert griffe_ext.comment_doc(lines, 4) == "The label.\nSecond line."
    assert griffe_ext.comment_doc(lines, 1) is None

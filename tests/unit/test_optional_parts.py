"""Optional parts stay optional: what an install loads into processes that did not ask for it.

* The ``gazette`` pytest plugin, loaded into every pytest session of an environment with
  gazette installed, imports neither etcd's client, gRPC nor the consumer stack.
* ``pyspark_gazette``, imported by Spark's data-source lookup in every Spark job, imports
  nothing of gazette's reader and never fails: not without pyarrow or numpy (the source is
  still registered, and using it names the extra), not without pyspark (nothing registered).

Each case runs in a fresh interpreter, where ``sys.modules`` shows what an import loaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("aetcd", "grpc", "gazette.consumer", "gazette.client", "gazette.spark", "pyarrow",
         "numpy", "boto3", "sqlalchemy")


def _python(code: str) -> dict[str, object]:
    """Runs ``code`` (which sets ``out``) in a fresh interpreter; returns ``out`` and the heavy
    modules it loaded."""
    prog = (f"import json, sys\nout = {{}}\n{code}\n"
            f"out['loaded'] = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} "
            f"or m.startswith({HEAVY!r}))\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", prog], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_pytest_plugin_and_gazette_testing_import_nothing_heavy() -> None:
    out = _python("import gazette.testing.pytest_plugin, gazette.testing")
    assert out["loaded"] == []
    out = _python("import gazette.testing\nout['fn'] = gazette.testing.unique_prefix.__module__")
    assert out["fn"] == "gazette.testing.etcd"  # the names still resolve, on first use


needs_pyspark = pytest.mark.skipif(importlib.util.find_spec("pyspark") is None,
                                   reason="pyspark is not installed (the spark extra)")
needs_pyarrow = pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                                   reason="pyarrow is not installed (the spark extra)")


@needs_pyspark
def test_spark_lookup_registers_the_source_without_loading_it_or_pyarrow() -> None:
    out = _python(
        "sys.modules['pyarrow'] = None; sys.modules['numpy'] = None  # as if not installed\n"
        "from importlib import import_module\n"
        "from pkgutil import iter_modules\n"
        "from pyspark.sql.datasource import DataSource\n"
        # Spark's lookup (pyspark/sql/worker/lookup_data_sources.py), over our module
        "mod = import_module('pyspark_gazette')\n"
        "assert 'pyspark_gazette' in {i.name for i in iter_modules() if i.name.startswith('pyspark_')}\n"
        "assert issubclass(mod.DefaultSource, DataSource)\n"
        "out['name'] = mod.DefaultSource.name()\n"
        "import pickle\n"
        "out['pickles'] = pickle.loads(pickle.dumps(mod.DefaultSource)) is mod.DefaultSource\n"
        "out['before_use'] = sorted(m for m in sys.modules if m.startswith('gazette'))\n"
        "try:\n"
        "    mod.DefaultSource({'broker': 'http://127.0.0.1:1'}).schema()\n"
        "except ImportError as err:\n"
        "    out['error'] = str(err)\n"
        "sys.modules.pop('pyarrow'); sys.modules.pop('numpy')")
    assert out["name"] == "gazette" and out["pickles"] is True
    assert out["before_use"] == []
    assert "pip install 'gazette[spark]'" in str(out["error"]), out


def test_without_pyspark_the_module_imports_and_registers_nothing() -> None:
    out = _python("sys.modules['pyspark'] = None\nimport pyspark_gazette as m\n"
                  "out['has'] = hasattr(m, 'DefaultSource')\nsys.modules.pop('pyspark')")
    assert out["has"] is False and out["loaded"] == []


@needs_pyspark
@needs_pyarrow
def test_with_pyspark_and_pyarrow_the_source_is_gazettes() -> None:
    out = _python("import pyspark_gazette as m\n"
                  "src = m.DefaultSource({'broker': 'http://127.0.0.1:1', 'mode': 'raw', 'selector': 'name=a/b'})\n"
                  "out['schema'] = str(src.schema())")
    assert "journal" in str(out["schema"]).lower()

"""The example programs run against a real broker and use only gazette's public names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gazette
from gazette.testing.cluster import Cluster
from gazette.testing.eventually import eventually_sync

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_hello_messages_uses_only_top_level_names() -> None:
    tree = ast.parse((EXAMPLES / "hello_messages.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(n.startswith("gazette.") for n in imported)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gazette")]
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "gazette"}
    assert used and used <= set(gazette.__all__), used - set(gazette.__all__)


@pytest.mark.timeout(180)
def test_hello_messages_appends_and_reads_committed(cluster: Cluster) -> None:
    cluster.add_broker("local", "calm-otter")
    rc, _, err = cluster.gazctl("journals", "apply", "--specs", str(EXAMPLES / "journals.yaml"))
    assert rc == 0, err
    eventually_sync(lambda: "examples/greetings" in cluster.gazctl("journals", "list", "--primary").stdout, "examples/greetings is listed")
    for _attempt in range(2):  # the second run also sees the first's messages, and skips them
        out = subprocess.run([sys.executable, str(EXAMPLES / "hello_messages.py"), "Ada", "Grace"],
                             env=cluster.env(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr + out.stdout
        lines = out.stdout.splitlines()
        assert lines[0].startswith("published 2 greetings")
        assert [ln.split(": ", 1)[1] for ln in lines[1:-1]] == ["Hello, Ada!", "Hello, Grace!"]
        assert lines[-1] == "read 2 of them back, committed"


def test_typed_counter_uses_only_consumer_and_message_names() -> None:
    """examples/typed_counter.py (mypy strict checks it with the examples) is written from
    ``gazette.consumer`` and ``gazette.message`` alone, names each exports."""
    import gazette.consumer
    import gazette.message

    tree = ast.parse((EXAMPLES / "typed_counter.py").read_text())
    modules = {gazette.consumer.__name__: gazette.consumer, gazette.message.__name__: gazette.message}
    froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gazette")]
    assert {n.module for n in froms} == set(modules)
    for n in froms:
        names = {a.name for a in n.names}
        assert names <= set(modules[n.module or ""].__all__), names - set(modules[n.module or ""].__all__)
    assert not [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                if a.name.startswith("gazette")]

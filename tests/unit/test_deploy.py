"""deploy/: the Kubernetes manifests render (``kubectl kustomize``), every resource is valid
against the Kubernetes schemas (``kubernetes-validate``), every Secret and ConfigMap a pod refers
to is defined (with the key it names), and every command our images run is accepted by our own
CLIs' parsers (``gazette serve``, ``gazette consume --app ...`` with the app's flags, ``gazctl``,
and the examples' ``python -m`` tools). No cluster or container engine runs here."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted((ROOT / "deploy" / "kustomize" / "test").iterdir())
K8S_VERSION = "1.32"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) is not installed")


def render(overlay: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec")
        if spec is not None:
            yield f"{d['kind']}/{d['metadata']['name']}", spec


def _parse(parser: argparse.ArgumentParser, argv: list[str], where: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: {shlex.join(argv)} refused: {err.getvalue()}")


def check_command(argv: list[str], where: str) -> int:
    """Checks one command line; returns how many commands were checked."""
    from gazette.cli.gazctl import build_parser as gazctl_parser
    from gazette.cli.serve import build_parser as gazette_parser
    from gazette.consumer.run import consumer_parser, load_app

    if not argv:
        return 0
    if argv[0] == "gazette" and argv[1:2] == ["consume"]:
        app = load_app(argv[argv.index("--app") + 1])
        _parse(consumer_parser(app, "gazette consume", app_flag=True), argv[2:], where)
        return 1
    if argv[0] == "gazette":
        _parse(gazette_parser(), argv[1:], where)
        return 1
    if argv[0] == "gazctl":
        _parse(gazctl_parser(), argv[1:], where)
        return 1
    if argv[:2] == ["python", "-m"] and argv[2].startswith("examples."):
        helptext = subprocess.run([sys.executable, "-m", argv[2], "--help"], cwd=ROOT, capture_output=True,
                                  text=True, check=True, timeout=60).stdout
        for flag in (a.split("=", 1)[0] for a in argv[3:] if a.startswith("--")):
            assert flag in helptext, f"{where}: {argv[2]} has no {flag}"
        return 1
    if argv[0] == "bash" and argv[1].endswith(".sh"):
        assert (ROOT / argv[1]).is_file(), f"{where}: no script {argv[1]} in the image"
        return 1
    return 0


def commands_of(container: dict[str, Any]) -> Iterator[list[str]]:
    """The container's command, or each simple command of its ``/bin/sh -ec`` script (split on
    pipes and lists, quotes respected, leading ``VAR=value`` assignments dropped)."""
    cmd = [*container.get("command", []), *container.get("args", [])]
    if cmd[:2] != ["/bin/sh", "-ec"]:
        yield cmd
        return
    for line in cmd[2].replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars="|;&")
        lex.whitespace_split = True
        words: list[str] = []
        for tok in [*lex, ";"]:
            if tok in ("|", ";", "&&", "||", "&"):
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words.pop(0)
                if words and words[0] not in ("for", "do", "done", "[", "then", "fi") and "$" not in words[0]:
                    yield words
                words = []
            else:
                words.append(tok)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[o.name for o in OVERLAYS])
def test_manifests_render_validate_and_refer_to_what_exists(overlay: Path) -> None:
    import kubernetes_validate

    docs = render(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "StatefulSet", "Deployment", "Service", "Job", "Secret"} <= kinds, kinds
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)

    secrets = {d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})}
               for d in docs if d["kind"] == "Secret"}
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    checked = 0
    for where, spec in pod_specs(docs):
        for c in spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    r = ref["secretKeyRef"]
                    assert r["key"] in secrets.get(r["name"], {}), f"{where}: no secret {r['name']}/{r['key']}"
                if "configMapKeyRef" in ref:
                    r = ref["configMapKeyRef"]
                    assert r["key"] in configmaps.get(r["name"], {}), f"{where}: no configmap {r['name']}/{r['key']}"
            if c["image"].startswith("gazette-py"):
                for argv in commands_of(c):
                    checked += check_command(argv, where)
        for v in spec.get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, f"{where}: no secret {v['secret']['secretName']}"
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, f"{where}: no configmap {v['configMap']['name']}"
    assert checked >= 5  # brokers (two zones), the consumer, the spec-applying jobs, the feeder

    # Brokers in two zones, with replication 3 requested of every example journal.
    zones = {c["command"][c["command"].index("--broker.zone") + 1]
             for _, spec in pod_specs(docs) for c in spec["containers"] if c.get("command", [])[:2] == ["gazette", "serve"]}
    assert zones == {"zone-a", "zone-b"}
    apply = next(spec for where, spec in pod_specs(docs) if where == "Job/apply-journal-specs")
    assert "replication: 3" in apply["containers"][0]["command"][2]

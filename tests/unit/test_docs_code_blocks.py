"""Every code block of the guides (README.md, docs/*.md, the examples' READMEs: the docs site's
pages) is executed or checked here, so a guide cannot show code that no longer works.

* ``python`` blocks run, in order, one namespace per guide, in a scratch directory (a guide's
  fixtures, such as the CA file a TLS example names, are made first: ``PRELUDES``).
* ``sh`` blocks: every ``gazctl`` and ``gazette`` command line parses with the commands' own
  argument parsers (a renamed or removed flag fails), ``gazette consume --app`` loading its app
  (an app defined by a guide's ``# name.py`` block is loaded from that block); every
  ``python -m module`` names an importable module and every script path named exists.
* ``yaml`` and ``json`` blocks parse. ``text`` blocks (diagrams, output) are prose.

A block that cannot run here carries an HTML comment directly above its fence:
``<!-- no-run: why -->`` (its imports still run and it must compile; ``NO_RUN`` lists them all,
so a new one is a deliberate edit here) or ``<!-- run-by: tests/path.py -->`` (another test runs
it; that file must name the guide). A fence without a language fails: say what it holds.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import shlex
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
          *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("examples/*/README.md"))]
LANGS = {"python", "sh", "yaml", "json", "text"}

# The blocks that do not run here, by guide and first line: each needs what a unit test does
# not have (a broker, a JVM). Their imports run; their reasons are in the guides.
NO_RUN = {
    ("README.md", "from gazette.spark import local_session"),
    ("docs/spark.md", "from gazette.spark import local_session"),
    ("docs/spark.md", 'rides = (spark.read.format("gazette")'),
    ("docs/spark.md", 'query = (spark.readStream.format("gazette")'),
}

_FENCE = re.compile(r"^\s*```(\S*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*(no-run|run-by):\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    guide: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    mark: str = ""  # "no-run" or "run-by"
    why: str = ""

    def __str__(self) -> str:
        return f"{self.guide}:{self.line} ({self.lang})"


def blocks(guide: str) -> list[Block]:
    lines = (ROOT / guide).read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not _FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{guide}:{start + 1}: unclosed fence"
        assert _FENCE.match(lines[i]) and not _FENCE.match(lines[i]).group(1), (  # type: ignore[union-attr]
            f"{guide}:{i + 1}: a fence with a language inside a block")
        indent = len(lines[start]) - len(lines[start].lstrip())
        block = Block(guide, start + 1, m.group(1), "\n".join(s[indent:] for s in body) + "\n")
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and (mark := _MARK.match(lines[j])):
            block.mark, block.why = mark.group(1), mark.group(2)
        out.append(block)
        i += 1
    return out


ALL = [b for g in GUIDES for b in blocks(g)]


def test_the_guides_have_blocks_and_each_says_what_it_holds() -> None:
    assert {"README.md", "docs/consumers.md", "docs/spark.md", "docs/security.md"} <= set(GUIDES)
    assert len(ALL) >= 20
    untagged = [str(b) for b in ALL if b.lang not in LANGS]
    assert not untagged, f"blocks without a known language ({sorted(LANGS)}): {untagged}"
    for b in ALL:
        assert not b.mark or b.lang == "python", f"{b}: only python blocks are marked"


def test_the_blocks_not_run_are_the_listed_ones() -> None:
    skipped = [b for b in ALL if b.mark == "no-run"]
    print(f"\n{len(skipped)} code blocks not run here:")
    for b in skipped:
        print(f"  {b}: {b.why}")
    assert {(b.guide, b.code.splitlines()[0]) for b in skipped} == NO_RUN
    assert all(b.why for b in skipped), "a no-run block says why"


def _security_prelude(tmp: Path, ns: dict[str, Any]) -> None:
    trustme = pytest.importorskip("trustme", reason="the guide's CA is made by trustme (a dev tool)")
    trustme.CA().cert_pem.write_to_path(str(tmp / "ca.pem"))
    ns["token"] = "a-token"  # the guide's placeholder for a bearer token


PRELUDES: dict[str, Callable[[Path, dict[str, Any]], None]] = {"docs/security.md": _security_prelude}


def _run(code: str, ns: dict[str, Any], filename: str) -> None:
    compiled = compile(code, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if compiled.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(compiled, ns))  # noqa: S307 - our own guide
    else:
        exec(compiled, ns)  # noqa: S102 - our own guide


def _imports_only(code: str) -> str:
    tree = ast.parse(code)
    return ast.unparse([n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)])


async def _close_all(ns: dict[str, Any]) -> None:
    for value in list(ns.values()):
        close = getattr(value, "close", None)
        if getattr(type(value), "__module__", "").startswith("gazette") and close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result


@pytest.mark.parametrize("guide", [g for g in GUIDES if any(b.lang == "python" for b in blocks(g))])
def test_python_blocks_run(guide: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "__guide__"}
    if guide in PRELUDES:
        PRELUDES[guide](tmp_path, ns)
    ran = 0
    for b in (b for b in blocks(guide) if b.lang == "python"):
        name = f"{guide}:{b.line}"
        if b.mark == "run-by":
            test = ROOT / b.why
            assert test.is_file(), f"{name}: run-by names no test file: {b.why}"
            assert Path(guide).name in test.read_text(), f"{name}: {b.why} does not read {guide}"
            continue
        if b.mark == "no-run":
            compile(b.code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            _run(_imports_only(b.code), ns, name)
            continue
        _run(b.code, ns, name)
        ran += 1
    asyncio.run(_close_all(ns))
    assert ran or all(b.mark for b in blocks(guide) if b.lang == "python")


# --- shell blocks


def _commands(script: str) -> Iterator[list[str]]:
    """The simple commands of ``script``: continuations joined, comments dropped, split at
    pipes, ``&&``, ``;`` and ``&``, command substitutions taken out as commands of their own,
    leading ``VAR=value`` assignments, redirections and a trailing ``...`` (an elision)
    removed."""
    text = script.replace("\\\n", " ")
    for line in text.splitlines():
        subs = re.findall(r"\$\(([^()]*)\)", line)
        line = re.sub(r"\$\(([^()]*)\)", "SUBST", line)
        for piece in [line, *subs]:
            lexer = shlex.shlex(piece, posix=True, punctuation_chars="|&;")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words: list[str] = []
            for tok in [*lexer, ";"]:
                if tok and set(tok) <= set("|&;"):
                    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                        words.pop(0)
                    words = _unredirected(words)
                    if words and words[-1] == "...":
                        words.pop()
                    if words:
                        yield words
                    words = []
                else:
                    words.append(tok)


def _unredirected(words: list[str]) -> list[str]:
    """``words`` without redirections (``> file``, ``2>/dev/null``, ``< in``)."""
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif re.fullmatch(r"\d*(>>?|<)", w):
            skip = True
        elif not re.match(r"\d*(>>?|<)\S", w):
            out.append(w)
    return out


def _guide_module(name: str) -> types.ModuleType | None:
    """A module a guide defines in a block starting ``# name.py``."""
    for b in ALL:
        if b.lang == "python" and b.code.startswith(f"# {name}.py\n"):
            module = types.ModuleType(name)
            exec(compile(b.code, f"{b.guide}:{b.line}", "exec"), module.__dict__)  # noqa: S102
            return module
    return None


def _check_gazette(args: list[str], where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gazette.cli import serve

    if args[:1] == ["consume"]:
        from gazette.consumer.run import consumer_parser, load_app

        spec = next((a.split("=", 1)[-1] if a.startswith("--app=") else args[i + 1]
                     for i, a in enumerate(args) if a.startswith("--app")), None)
        assert spec, f"{where}: gazette consume without --app"
        module_name = spec.split(":", 1)[0]
        if module_name not in sys.modules and (module := _guide_module(module_name)) is not None:
            monkeypatch.setitem(sys.modules, module_name, module)
        parser = consumer_parser(load_app(spec), "gazette consume", app_flag=True)
        _parse(parser, args[1:], where)
    else:
        _parse(serve.build_parser(), args, where)


def _parse(parser: Any, args: list[str], where: str) -> None:
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{where}: {shlex.join(args)!r} does not parse (exit {exc.code})")


SH = [b for b in ALL if b.lang == "sh"]


@pytest.mark.parametrize("block", SH, ids=[f"{b.guide}:{b.line}" for b in SH])
def test_shell_commands_parse(block: Block, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from gazette.cli import gazctl

    monkeypatch.syspath_prepend(str(ROOT))
    checked = 0
    for words in _commands(block.code):
        where = f"{block}: {shlex.join(words)}"
        program, args = Path(words[0]).name, words[1:]
        if program == "gazctl":
            _parse(gazctl.build_parser(), args, where)
        elif program == "gazette":
            _check_gazette(args, where, monkeypatch)
        elif program.startswith("python") and args[:1] == ["-m"]:
            import importlib.util

            assert importlib.util.find_spec(args[1]) is not None, f"{where}: no module {args[1]}"
        elif program.startswith("python") or program == "bash":
            script = next((a for a in args if not a.startswith("-")), "")
            assert (ROOT / script).is_file(), f"{where}: no script {script}"
        else:
            continue  # curl, seq, awk, psql, jq, export, pip: not ours
        checked += 1
    capsys.readouterr()  # argparse's usage lines of a passing parse are not output
    assert checked or not any(w[0].endswith(("gazctl", "gazette")) for w in _commands(block.code))


def test_command_splitting() -> None:
    script = ("export X=$(python -m examples.bike_share.database)   # or leave it\n"
              "seq 10 | .venv/bin/gazctl attach-uuids | awk -F, '{print $2}' \\\n"
              "  | A=1 gazctl journals append --framing lines &\n"
              "gazette serve --flag x ... > out.log 2>/dev/null\n")
    assert list(_commands(script)) == [
        ["export", "X=SUBST"], ["python", "-m", "examples.bike_share.database"],
        ["seq", "10"], [".venv/bin/gazctl", "attach-uuids"], ["awk", "-F,", "{print $2}"],
        ["gazctl", "journals", "append", "--framing", "lines"],
        ["gazette", "serve", "--flag", "x"]]


# --- data blocks


@pytest.mark.parametrize("block", [b for b in ALL if b.lang in ("yaml", "json")],
                         ids=[f"{b.guide}:{b.line}" for b in ALL if b.lang in ("yaml", "json")])
def test_data_blocks_parse(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.code)
    else:
        assert [d for d in yaml.safe_load_all(block.code) if d is not None], f"{block}: empty"

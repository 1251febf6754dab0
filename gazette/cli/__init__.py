"""Command-line programs: ``gazette serve`` and ``gazctl``. Thin: parse, call, print."""

from gazette import __version__
from gazette._compiled import build_line


def version_text(prog: str) -> str:
    """What ``PROG --version`` prints: the one version of the package (``gazette.__version__``,
    which pyproject.toml reads too) and, after it, which build runs (``interpreted``
    or ``compiled (mypyc): N modules``; see gazette/_compiled.py)."""
    return f"{prog} {__version__}; {build_line()}"

"""Command-line programs: ``gazette serve`` and ``gazctl``. Thin: parse, call, print."""

from gazette import __version__


def version_text(prog: str) -> str:
    """What ``PROG --version`` prints: the one version of the package (``gazette.__version__``,
    which pyproject.toml reads too)."""
    return f"{prog} {__version__}"

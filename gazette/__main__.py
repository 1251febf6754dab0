"""``python -m gazette``: the ``gazette`` command (``serve``, ``consume``), as its console
script runs it, for environments without the script on PATH."""

import sys


def main() -> int:
    if sys.argv[1:] == ["--version"]:
        # Answered here as well as by the command's parser, which needs its whole flag set built.
        from gazette.cli import version_text

        print(version_text("gazette"))
        return 0
    from gazette.cli.serve import main as serve

    return serve()


if __name__ == "__main__":  # imported (module walks, docs) it runs nothing
    sys.exit(main())

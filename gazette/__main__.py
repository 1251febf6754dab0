"""``python -m gazette``: the ``gazette`` command (``serve``, ``consume``), as its console
script runs it, for environments without the script on PATH."""

import sys

from gazette.cli import version_text

if sys.argv[1:] == ["--version"]:
    # Answered here as well as by the command's parser, which needs its whole flag set built.
    print(version_text("gazette"))
    sys.exit(0)

from gazette.cli.serve import main  # noqa: E402 - --version needs none of it

sys.exit(main())

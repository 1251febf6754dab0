"""``python -m gazette.cli.gazctl``: the ``gazctl`` command, without its console script."""

import sys

from gazette.cli.gazctl import main

if __name__ == "__main__":  # imported (module walks, docs) it runs nothing
    sys.exit(main())

"""``python -m gazette.cli.gazctl``: the ``gazctl`` command, without its console script."""

import sys

from gazette.cli.gazctl import main

sys.exit(main())

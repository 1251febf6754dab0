"""Command-line programs: ``gazette serve`` and ``gazctl``. Thin: parse, call, print."""

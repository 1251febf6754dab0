"""gazctl starts light: importing it loads neither the consumer framework, the recovery log,
the append service, PyJWT (and cryptography) nor aiohttp. Each is loaded by the commands that
use it; together they were 0.4 s of every gazctl command's start, a fifth of listing 50,000
journals."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ["aiohttp", "cryptography", "jwt", "gazette.client.append_service", "gazette.consumer.process",
         "gazette.message.publisher", "gazette.recoverylog", "rocksdict", "sqlalchemy"]


def test_importing_gazctl_loads_nothing_heavy() -> None:
    code = ("import sys, gazette.cli.gazctl\n"
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_the_lazy_packages_still_export_every_name() -> None:
    code = ("import gazette.client, gazette.consumer, gazette.message\n"
            "for pkg in (gazette.client, gazette.consumer, gazette.message):\n"
            "    for name in pkg.__all__:\n"
            "        getattr(pkg, name)\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"

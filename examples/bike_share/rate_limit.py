"""``pv --line-mode --rate-limit`` for the stream-rides pipeline (pv is not always installed):
copies stdin to stdout at most ``--rate`` lines a second, keeping a key line and its record
together (``--group 2``), flushing as it goes."""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.bike_share.rate_limit", description=__doc__)
    ap.add_argument("--rate", type=float, required=True, help="records per second")
    ap.add_argument("--group", type=int, default=2, help="lines per record")
    a = ap.parse_args(argv)
    if a.rate <= 0 or a.group < 1:
        ap.error("--rate must be positive and --group at least 1")
    started, n = time.monotonic(), 0
    out = sys.stdout.buffer
    lines = iter(sys.stdin.buffer.readline, b"")
    for line in lines:
        out.write(line)
        for _ in range(a.group - 1):
            out.write(next(lines, b""))
        n += 1
        ahead = started + n / a.rate - time.monotonic()
        if ahead > 0:
            out.flush()
            time.sleep(ahead)  # the rate limit itself
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

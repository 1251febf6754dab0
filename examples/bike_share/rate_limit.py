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
    ap.add_argument("--total", type=int, default=0, help="records expected, for the progress line's ETA")
    a = ap.parse_args(argv)
    if a.rate <= 0 or a.group < 1:
        ap.error("--rate must be positive and --group at least 1")
    started, n, said = time.monotonic(), 0, time.monotonic()
    out = sys.stdout.buffer
    lines = iter(sys.stdin.buffer.readline, b"")
    for line in lines:
        out.write(line)
        for _ in range(a.group - 1):
            out.write(next(lines, b""))
        n += 1
        if time.monotonic() - said >= 5:  # progress on stderr, every 5 s
            said = time.monotonic()
            rate = n / (said - started)
            eta = f", about {(a.total - n) / rate:.0f}s to go" if a.total > n else ""
            print(f"stream-rides: {n} records sent ({rate:.0f}/s){eta}", file=sys.stderr, flush=True)
        ahead = started + n / a.rate - time.monotonic()
        if ahead > 0:
            out.flush()
            time.sleep(ahead)  # the rate limit itself
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

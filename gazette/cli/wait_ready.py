"""Waits until an etcd endpoint or an HTTP readiness URL answers (used by scripts/demo.sh)."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback URLs we were given
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--etcd", help="etcd client URL; waits for its /health")
    p.add_argument("--url", help="HTTP URL that must answer 2xx")
    p.add_argument("--timeout", type=float, default=30.0)
    ns = p.parse_args(argv)
    url = ns.url or (ns.etcd.rstrip("/") + "/health" if ns.etcd else None)
    if url is None:
        p.error("one of --etcd or --url is required")
    deadline = time.monotonic() + ns.timeout
    while not _ok(url):
        if time.monotonic() > deadline:
            print(f"wait_ready: {url} did not become ready within {ns.timeout}s", file=sys.stderr)
            return 1
        time.sleep(0.1)  # polling an external process; there is nothing to wait on instead
    return 0


if __name__ == "__main__":
    sys.exit(main())

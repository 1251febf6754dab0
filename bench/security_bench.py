"""The cost of TLS and of bearer-token authorization on the broker's append path.

Starts one etcd and three brokers (all on loopback, each with its own journals): one in the
clear, one serving TLS (certificates made with ``trustme``), one serving TLS with
``--auth-keys`` (every Append verifies a bearer token). One client (``broker_bench``'s
``GazetteSide``: a ``gazette.rpc`` channel, one Append RPC per append) drives each in turn,
round by round, so the three figures of a workload are taken moments apart on the same
machine. Prints ``workload | plain | tls | tls+auth`` and each secured figure as a fraction of
the plain one (the cost). The client signs its token once (tokens live an hour) and the
broker verifies each distinct token once (then a cache lookup per request).

    python bench/security_bench.py            # about 2 minutes
    python bench/security_bench.py --quick    # about 30 seconds
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trustme

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _peers import Peers  # noqa: E402
from broker_bench import GazetteSide, Plan, make_payload, run_writers, size_name  # noqa: E402

from gazette import malloc  # noqa: E402
from gazette.auth import KeyedAuth  # noqa: E402
from gazette.protocol import protocol_pb2 as pb  # noqa: E402
from gazette.rpc.tls import ClientTLS  # noqa: E402

KEY = base64.b64encode(b"security-bench signing key, 32 bytes+").decode()
WORKLOADS = [(100, 1), (100, 16), (4096, 16), (65536, 1), (65536, 16), (1 << 20, 16)]
MODES = ("plain", "tls", "tls+auth")


def write_pki(d: Path) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_path, cert_path, key_path = d / "ca.pem", d / "server.pem", d / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert_path.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key_path))
    return ca_path, cert_path, key_path


async def drive(sides: dict[str, GazetteSide], plan: Plan, rounds: int,
                workloads: list[tuple[int, int]]) -> dict[tuple[int, int, str], list[float]]:
    out: dict[tuple[int, int, str], list[float]] = {}
    for size, writers in workloads:
        payload = make_payload(size)
        journal = f"sec/{size_name(size).replace(' ', '').lower()}-x{writers}"
        for side in sides.values():
            await side.create(journal, pb.NONE)
            await side.warm(journal, payload)
        for _ in range(rounds):
            for mode, side in sides.items():
                r = await run_writers(side.append_op(journal, payload), writers, size, plan)
                out.setdefault((size, writers, mode), []).append(r.rate)
        cells = [statistics.median(out[(size, writers, m)]) for m in MODES]
        print(f"append {size_name(size):>7} x{writers:<2} | " + " | ".join(
            f"{c:9.0f}/s" for c in cells) + " | " + " | ".join(
            f"{c / cells[0]:.2f}" for c in cells[1:]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", default="",
                    help="SIZExWRITERS,... (default: " + ",".join(f"{s}x{w}" for s, w in WORKLOADS) + ")")
    args = ap.parse_args(argv)
    workloads = [(int(a), int(b)) for a, b in (w.split("x") for w in args.workloads.split(","))] \
        if args.workloads else WORKLOADS
    plan = Plan(1.0 if args.quick else 3.0, 200_000, 256 << 20, 1.0, sizes=())
    rounds = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="security-bench-") as tmp, Peers() as peers:
        ca, cert, key = write_pki(Path(tmp))
        ctx = ssl.create_default_context(cafile=str(ca))
        tls_args = ["--broker.server-cert-file", str(cert), "--broker.server-cert-key-file", str(key)]
        etcd = peers.start_etcd()
        # Three clusters (etcd prefixes) of one broker each: no broker proxies to another.
        port_plain, _ = peers.start_broker(etcd, broker_id="sec-plain", extra_args=["--etcd.prefix", "/sec-plain"])
        port_tls, _ = peers.start_broker(etcd, broker_id="sec-tls", ssl_context=ctx,
                                         extra_args=[*tls_args, "--etcd.prefix", "/sec-tls"])
        port_auth, _ = peers.start_broker(etcd, broker_id="sec-auth", ssl_context=ctx,
                                          extra_args=[*tls_args, "--auth-keys", KEY, "--etcd.prefix", "/sec-auth"])
        print("note: one shared 2-core machine; compare the fractions of one run.")
        print(f"plan: each case {plan.seconds:g} s x {rounds} rounds, interleaved; medians.\n")
        header = "workload          |      plain  |        tls  |   tls+auth  | tls/plain | auth/plain"
        print(header)
        print("-" * len(header), flush=True)
        tls = ClientTLS(ca_file=str(ca))
        started = time.monotonic()
        malloc.tune()

        async def run() -> None:
            sides = {
                "plain": GazetteSide(f"127.0.0.1:{port_plain}"),
                "tls": GazetteSide(f"127.0.0.1:{port_tls}", tls=tls),
                "tls+auth": GazetteSide(f"127.0.0.1:{port_auth}", tls=tls, auth=KeyedAuth(KEY)),
            }
            try:
                await drive(sides, plan, rounds, workloads)
            finally:
                for side in sides.values():
                    await side.close()
        asyncio.run(run())
        print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

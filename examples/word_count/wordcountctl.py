"""``wordcountctl``: publishes documents to the word-count example and queries its n-gram counts
(Gazette's ``wordcountctl``), through any counter process (``--consumer.address`` or
``CONSUMER_ADDRESS``).

    python -m examples.word_count.wordcountctl publish --file shakespeare.txt
    python -m examples.word_count.wordcountctl query --prefix="the city"
    python -m examples.word_count.wordcountctl query --prefix="the" --shard=shard-000

``publish`` sends each file (or stdin) as one document; ``query`` prints ``<n-gram>\\t<count>``
lines: of the shard the prefix maps to, or of ``--shard`` (a prefix scan of that shard alone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import grpc

from examples.word_count import word_count_pb2 as wc
from examples.word_count import word_count_pb2_grpc as wc_grpc
from gazette.rpc.channel import insecure_channel


async def _run(a: argparse.Namespace) -> int:
    target = a.consumer.removeprefix("http://")
    channel = insecure_channel(target)
    try:
        stub = wc_grpc.NGramStub(channel)  # type: ignore[no-untyped-call]
        if a.cmd == "publish":
            for path in a.file or ["-"]:
                text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: ASYNC230, SIM115
                await stub.Publish(wc.PublishRequest(text=text))
                print(f"published {path} ({len(text)} characters)", file=sys.stderr)
            return 0
        resp = await stub.Query(wc.QueryRequest(prefix=a.prefix, shard=a.shard))
        for g in resp.grams:
            print(f"{g.n_gram}\t{g.count}")
        return 0
    finally:
        await channel.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="wordcountctl", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumer.address", dest="consumer",
                    default=os.environ.get("CONSUMER_ADDRESS", "http://localhost:8080"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish", help="publish documents")
    p.add_argument("--file", action="append", help="a document (repeatable; default stdin)")
    q = sub.add_parser("query", help="query n-gram counts")
    q.add_argument("--prefix", default="", help="n-gram or n-gram prefix")
    q.add_argument("--shard", default="", help="scan this shard only")
    a = ap.parse_args(argv)
    if a.cmd == "query" and not (a.prefix or a.shard):
        ap.error("query needs --prefix or --shard")
    try:
        return asyncio.run(_run(a))
    except grpc.RpcError as err:
        print(f"wordcountctl: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

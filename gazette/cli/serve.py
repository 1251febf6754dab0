"""``gazette serve`` runs a broker; ``gazette consume --app module:Class`` a consumer.

Flags mirror Gazette's (``--broker.port``, ``--broker.zone``, ``--etcd.address``,
...); each may also be set by an environment variable named after it
(``BROKER_PORT``, ``BROKER_ZONE``, ``ETCD_ADDRESS``, ...). SIGTERM or SIGINT
drains the broker gracefully (see ``gazette.broker.server``); a second signal
exits at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from gazette import malloc
from gazette.cli import version_text
from gazette.server.flags import Flags, add_flags, etcd_tls_flags, server_security_flags
from gazette.server.limits import SERVER_LIMIT_FLAGS, limits_from_flags
from gazette.server.logs import setup_logging
from gazette.server.loop import EVENT_LOOP_FLAG, loop_factory
from gazette.server.loop import run as run_loop

_FLAGS: list[tuple[str, str, Any, str]] = [
    # (flag, env, default, help)
    ("--broker.host", "BROKER_HOST", "127.0.0.1", "Addressable, advertised hostname or IP of this broker"),
    ("--broker.port", "BROKER_PORT", "8080", "Service port for HTTP and gRPC requests (0 picks a free one)"),
    ("--broker.id", "BROKER_ID", "", "Unique name of this broker within its zone (default: a random name)"),
    ("--broker.zone", "BROKER_ZONE", "local", "Availability zone within which this process is running"),
    ("--broker.file-root", "BROKER_FILE_ROOT", "fragment-store", "Local path which roots file:// fragment stores"),
    ("--broker.limit", "BROKER_LIMIT", "1024", "Maximum number of journals the broker will allocate"),
    ("--broker.max-replication", "BROKER_MAX_REPLICATION", "9", "Maximum effective replication of any one journal"),
    ("--broker.max-append-rate", "BROKER_MAX_APPEND_RATE", "0",
     "Max rate (in bytes-per-sec) that any one journal may be appended to. If zero, there is no max rate"),
    ("--broker.min-append-rate", "BROKER_MIN_APPEND_RATE", "65536",
     "Min rate (in bytes-per-sec) at which a client may stream Append RPC content. "
     "RPCs unable to sustain this rate are aborted"),
    ("--broker.auto-suspend", "BROKER_AUTO_SUSPEND", False,
     "Automatically suspend journals which have persisted all fragments"),
    ("--broker.health-interval", "BROKER_HEALTH_INTERVAL", "1m",
     "Interval between the periodic pulses (zero-byte appends) of each journal this broker is "
     "primary of; auto-suspension waits for 15 of them without a route change"),
    ("--etcd.address", "ETCD_ADDRESS", "http://localhost:2379", "Etcd service address endpoint"),
    ("--etcd.prefix", "ETCD_PREFIX", "/gazette/cluster", "Etcd base prefix for broker state and coordination"),
    ("--etcd.lease", "ETCD_LEASE", "20s", "Time-to-live of the Etcd lease of the broker's announcement"),
    *etcd_tls_flags(),
    ("--log.level", "LOG_LEVEL", "info", "Logging level: debug, info, warn, error"),
    ("--log.format", "LOG_FORMAT", "text", "Logging format: text, json"),
    *server_security_flags("broker"),
    *SERVER_LIMIT_FLAGS,
    EVENT_LOOP_FLAG,
]


def build_parser() -> argparse.ArgumentParser:
    from gazette.consumer.run import CONSUMER_FLAGS

    parser = argparse.ArgumentParser(prog="gazette", description="Gazette broker and consumers")
    parser.add_argument("--version", action="version", version=version_text("gazette"))
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Serve as Gazette broker")
    add_flags(serve, _FLAGS)
    consume = sub.add_parser("consume", help="Run a consumer application's shards")
    consume.add_argument("--app", required=True, help="The Application: package.module:AppClass")
    add_flags(consume, CONSUMER_FLAGS)
    return parser


def config_from_args(ns: argparse.Namespace) -> Any:
    from gazette.broker.config import BrokerConfig
    from gazette.server.process import random_suffix

    flags = Flags(ns)
    get, integer = flags.get, flags.integer

    def rate(name: str) -> int:
        value = integer(name)
        if value < 0:
            raise SystemExit(f"gazette: invalid --{name} {value} (expected >= 0 bytes per second)")
        return value

    lease = flags.seconds("etcd.lease")
    health = flags.seconds("broker.health-interval")
    if health <= 0:
        raise SystemExit(f"gazette: invalid --broker.health-interval {get('broker.health-interval')!r} (expected a positive duration)")
    zone, suffix = flags.process_id("broker", random_suffix())
    flags.auth_keys()  # bad keys exit here, naming the flag
    return BrokerConfig(
        host=get("broker.host"),
        port=integer("broker.port"),
        zone=zone,
        suffix=suffix,
        file_root=get("broker.file-root"),
        limit=integer("broker.limit"),
        max_replication=integer("broker.max-replication"),
        max_append_rate=rate("broker.max-append-rate"),
        min_append_rate=rate("broker.min-append-rate"),
        auto_suspend=flags.switch("broker.auto-suspend"),
        health_interval=health,
        etcd_address=flags.etcd_address(),
        etcd_tls=flags.etcd_tls(),
        etcd_prefix=get("etcd.prefix").rstrip("/"),
        etcd_lease=lease,
        tls=flags.server_tls("broker"),
        peer_tls=flags.peer_tls("broker"),
        auth_keys=get("auth-keys"),
        limits=limits_from_flags(flags),
    )


async def _serve(config: Any) -> None:
    from gazette import gctune
    from gazette.broker.server import Broker
    from gazette.server.process import run_until_drained

    gctune.tune()  # the broker's modules are loaded: freeze them, and collect less often
    await run_until_drained(Broker(config))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "consume":
        from gazette.consumer.run import main_consume

        return main_consume(args[1:])
    ns = build_parser().parse_args(args)
    setup_logging(ns.log_level, ns.log_format)
    config = config_from_args(ns)
    loop_factory(ns.event_loop)  # a bad or missing loop exits here, before anything starts
    os.makedirs(config.file_root, exist_ok=True)
    malloc.tune()  # every append moves buffers of up to megabytes: keep them in the heap
    from gazette.etcd.errors import EtcdError

    try:
        run_loop(_serve(config), ns.event_loop)
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        # The environment refused us (port already in use, unwritable directory): the operator
        # fixes that, so one line naming it beats a traceback through the event loop.
        logging.getLogger("gazette").error(
            f"gazette: cannot serve: {err}",
            extra={"host": config.host, "port": config.port},
        )
        return 1
    except EtcdError as err:
        # etcd refused us for good (a TLS certificate): one line naming what to fix.
        logging.getLogger("gazette").error(f"gazette: cannot serve: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Running a consumer application: ``gazette consume --app package.module:AppClass``, or
``run_consumer(app)`` from an application's own ``__main__`` (Gazette's
``mainboilerplate/runconsumer``).

Flags are Gazette's consumer flags, each also read from its environment variable
(``--consumer.port`` / ``CONSUMER_PORT``, ``--broker.address`` / ``BROKER_ADDRESS``,
``--etcd.prefix`` / ``ETCD_PREFIX``, ...). SIGTERM or SIGINT drains the process (its shards
move to other consumers); a second signal exits at once.

Invariants: a bad flag value, or an ``--app`` that does not name an importable class, exits
with one line naming what is wrong; nothing is announced before the configuration is valid.
A process ended by an expected error (a ``GazetteError``: its etcd lease lost, its member key
taken) exits 1 with one line naming it; only bugs print a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from gazette import gctune
from gazette.consumer.initialize import FlagsAdder
from gazette.consumer.interfaces import Application
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.errors import GazetteError, ValidationError
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.validate import validate_process_id
from gazette.server.flags import (
    Flag,
    Flags,
    add_flags,
    client_security_flags,
    etcd_tls_flags,
    server_security_flags,
)
from gazette.server.limits import SERVER_LIMIT_FLAGS, limits_from_flags
from gazette.server.logs import setup_logging
from gazette.server.loop import EVENT_LOOP_FLAG, loop_factory
from gazette.server.loop import run as run_loop
from gazette.server.process import random_suffix, run_until_drained

__all__ = ["CONSUMER_FLAGS", "consumer_parser", "load_app", "main_consume", "run", "run_consumer"]

CONSUMER_FLAGS: list[Flag] = [
    # (flag, env, default, help)
    ("--consumer.host", "CONSUMER_HOST", "127.0.0.1", "Addressable, advertised hostname or IP of this consumer"),
    ("--consumer.port", "CONSUMER_PORT", "8081", "Service port for HTTP and gRPC requests (0 picks a free one)"),
    ("--consumer.id", "CONSUMER_ID", "", "Unique name of this consumer within its zone (default: a random name)"),
    ("--consumer.zone", "CONSUMER_ZONE", "local", "Availability zone within which this process is running"),
    ("--consumer.limit", "CONSUMER_LIMIT", "32", "Maximum number of shards this consumer process will allocate"),
    ("--consumer.max-hot-standbys", "CONSUMER_MAX_HOT_STANDBYS", "3", "Maximum effective hot standbys of any one shard"),
    ("--consumer.watch-delay", "CONSUMER_WATCH_DELAY", "30ms", "Delay applied to the application of watched Etcd events"),
    ("--broker.address", "BROKER_ADDRESS", "http://localhost:8080", "Broker service address"),
    ("--etcd.address", "ETCD_ADDRESS", "http://localhost:2379", "Etcd service address endpoint"),
    ("--etcd.prefix", "ETCD_PREFIX", "/gazette/consumers/app", "Etcd base prefix for the consumer group's state"),
    ("--etcd.lease", "ETCD_LEASE", "20s", "Time-to-live of the Etcd lease of the consumer's announcement"),
    *etcd_tls_flags(),
    ("--log.level", "LOG_LEVEL", "info", "Logging level: debug, info, warn, error"),
    ("--log.format", "LOG_FORMAT", "text", "Logging format: text, json"),
    *server_security_flags("consumer"),
    *client_security_flags("broker"),
    *SERVER_LIMIT_FLAGS,
    EVENT_LOOP_FLAG,
]


def load_app(spec: str) -> Application[Any, Any, Any]:
    """An instance of the Application class named ``package.module:AppClass``."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise SystemExit(f"gazette: invalid --app {spec!r} (expected package.module:AppClass)")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise SystemExit(f"gazette: invalid --app {spec!r}: {err}") from None
    app: Application[Any, Any, Any] = cls()
    return app


def config_from_args(ns: argparse.Namespace) -> ConsumerConfig:
    flags = Flags(ns)
    get, integer = flags.get, flags.integer
    lease = flags.seconds("etcd.lease")
    flags.seconds("consumer.watch-delay")
    zone, suffix = _process_id(flags)
    config = ConsumerConfig(host=get("consumer.host"), port=integer("consumer.port"),
                          zone=zone, suffix=suffix, limit=integer("consumer.limit"),
                          max_hot_standbys=integer("consumer.max-hot-standbys"),
                          broker_address=get("broker.address"), etcd_address=flags.etcd_address(),
                          etcd_tls=flags.etcd_tls(),
                          etcd_prefix=get("etcd.prefix").rstrip("/"), etcd_lease=lease, args=ns,
                          tls=flags.server_tls("consumer"), peer_tls=flags.peer_tls("consumer"),
                          broker_tls=flags.client_tls("broker"), auth_keys=get("auth-keys"),
                          broker_auth=flags.client_auth("broker"), limits=limits_from_flags(flags))
    flags.auth_keys()  # bad keys exit here, naming the flag
    return config


def _process_id(flags: Flags) -> tuple[str, str]:
    """(zone, suffix) of ``--consumer.zone`` and ``--consumer.id``; a bad one exits with one
    line naming its flag and value (an empty id is a random suffix)."""
    zone, suffix = flags.get("consumer.zone"), flags.get("consumer.id") or random_suffix()
    try:
        validate_process_id(pb.ProcessSpec.ID(zone=zone, suffix=suffix))
    except ValidationError as err:
        flag, value = ("--consumer.zone", zone) if err.field == "zone" else ("--consumer.id", suffix)
        raise SystemExit(f"gazette: invalid {flag} {value!r}: {err.rule}") from None
    return zone, suffix


async def _consume(config: ConsumerConfig, app: Application[Any, Any, Any]) -> None:
    gctune.tune()  # the consumer's and the app's modules are loaded: freeze them, collect less
    await run_until_drained(ConsumerProcess(config, app))


def run(app: Application[Any, Any, Any], ns: argparse.Namespace, *, event_loop: str | None = None) -> int:
    """Runs ``app`` with parsed consumer flags until drained, on ``event_loop`` (a name of
    ``gazette.server.loop.EVENT_LOOPS``; None: the ``--event-loop`` flag's)."""
    config = config_from_args(ns)
    loop = event_loop if event_loop is not None else ns.event_loop
    loop_factory(loop)  # a bad or missing loop exits here, before anything starts
    try:
        run_loop(_consume(config, app), loop)
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        logging.getLogger("gazette").error(f"gazette: cannot consume: {err}",
                                           extra={"host": config.host, "port": config.port})
        return 1
    except Exception as err:
        causes = _gazette_errors(err)
        if causes is None:
            raise  # a bug: its traceback is what to see
        logging.getLogger("gazette").error(
            "gazette: consumer stopped: " + "; ".join(f"{type(c).__name__}: {c}" for c in causes))
        return 1
    return 0


def _gazette_errors(err: BaseException) -> list[GazetteError] | None:
    """The errors ``err`` is made of (unwrapping the process's task-group exception groups)
    if every one is a ``GazetteError``, an ending the process expects (a lost etcd lease, a
    member key taken over): reported as one line rather than a traceback. None otherwise."""
    if isinstance(err, GazetteError):
        return [err]
    if isinstance(err, BaseExceptionGroup):
        out: list[GazetteError] = []
        for sub in err.exceptions:
            got = _gazette_errors(sub)
            if got is None:
                return None
            out.extend(got)
        return out
    return None


def consumer_parser(app: Application[Any, Any, Any] | None, prog: str, *, app_flag: bool = False) -> argparse.ArgumentParser:
    """The parser of the consumer flags, plus ``--app`` and the app's own flags (``add_flags``)."""
    parser = argparse.ArgumentParser(prog=prog, description="Gazette consumer")
    if app_flag:
        parser.add_argument("--app", required=True, help="The Application: package.module:AppClass")
    add_flags(parser, CONSUMER_FLAGS)
    if isinstance(app, FlagsAdder):
        app.add_flags(parser.add_argument_group("Application"))
    return parser


def main_consume(argv: Sequence[str]) -> int:
    """``gazette consume --app package.module:AppClass [flags]``: the app is loaded first, so
    its own flags parse (and show in ``--help``) beside the consumer's."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--app")
    known, _ = pre.parse_known_args(argv)
    app = load_app(known.app) if known.app else None
    ns = consumer_parser(app, "gazette consume", app_flag=True).parse_args(argv)
    assert app is not None  # --app is required: parse_args exited without it
    setup_logging(ns.log_level, ns.log_format)
    return run(app, ns)


def run_consumer(app: Application[Any, Any, Any], argv: Sequence[str] | None = None, *,
                 event_loop: str | None = None) -> int:
    """The main of a consumer application: parses the consumer flags (and the app's own, if it
    has ``add_flags``) and runs ``app``. ``event_loop`` (``auto``, ``uvloop`` or ``asyncio``)
    overrides ``--event-loop``: by default uvloop where installed, else asyncio's loop."""
    ns = consumer_parser(app, os.path.basename(sys.argv[0])).parse_args(argv)
    setup_logging(ns.log_level, ns.log_format)
    return run(app, ns, event_loop=event_loop)

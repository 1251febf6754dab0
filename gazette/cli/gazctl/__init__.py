"""gazctl: command-line tool for journals on a gazette (or Gazette) broker cluster, shards of
its consumer applications, and ``attach-uuids`` (which needs no broker) for preparing records.

Invariants:
- Flags and output follow Gazette's gazctl (see ``gazctl journals <cmd> --help``).
- The broker address is, in order: ``--broker.address``, ``$BROKER_ADDRESS``, ``Address``
  under ``[journals.Broker]`` (``[shards.Broker]`` for shard commands) in
  ``~/.config/gazette/gazctl.ini``, ``http://localhost:8080``. The consumer address of shard
  commands is ``--consumer.address``, ``$CONSUMER_ADDRESS``, ``Address`` under
  ``[shards.Consumer]``, ``http://localhost:8080``.
- ``main`` returns the exit status: 0 on success, 1 with a single ``FATA`` log line on
  stderr for any expected failure (bad input, unreachable broker, refused request);
  never a traceback for those. 2 is argparse's status for unusable flags.
"""

from __future__ import annotations

import argparse
import asyncio
import configparser
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, TextIO

from gazette.cli.gazctl import attach_uuids
from gazette.cli.gazctl.common import CommandError, Context
from gazette.cli.gazctl.journals import COMMANDS as JOURNAL_COMMANDS
from gazette.cli.gazctl.output import LEVELS, Log
from gazette.cli.gazctl.shards import COMMANDS as SHARD_COMMANDS
from gazette.client.errors import ClientError
from gazette.client.journal_client import DEFAULT_ADDRESS, grpc_target
from gazette.protocol.errors import GazetteError

INI_PATH = Path(".config", "gazette", "gazctl.ini")


def _common_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("Broker / logging")
    # SUPPRESS: a flag given before the subcommand must not be reset by the subparser.
    g.add_argument("--broker.address", dest="broker_address", default=argparse.SUPPRESS,
                   help="Service address endpoint (env BROKER_ADDRESS; default "
                        f"{DEFAULT_ADDRESS})")
    g.add_argument("--consumer.address", dest="consumer_address", default=argparse.SUPPRESS,
                   help="Consumer service address of shard commands (env CONSUMER_ADDRESS; "
                        f"default {DEFAULT_ADDRESS})")
    g.add_argument("--broker.cache.size", dest="broker_cache_size", type=int,
                   default=argparse.SUPPRESS,
                   help="Size of client route cache; > 0 also reads fragments directly "
                        "from stores (env BROKER_CACHE_SIZE)")
    g.add_argument("--zone", dest="zone", default=argparse.SUPPRESS,
                   help="Availability zone of this client, to prefer brokers in it (env ZONE)")
    g.add_argument("--log.level", dest="log_level", default=argparse.SUPPRESS,
                   choices=sorted(LEVELS), help="Logging level (env LOG_LEVEL; default info)")
    g.add_argument("--log.format", dest="log_format", default=argparse.SUPPRESS,
                   choices=["text", "json", "color"], help="Logging output format (text)")
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common_flags()
    parser = argparse.ArgumentParser(
        prog="gazctl", parents=[common],
        description="gazctl is a tool for interacting with Gazette brokers and consumer "
                    "applications.")
    groups = parser.add_subparsers(dest="group", metavar="{attach-uuids,journals,shards}")
    groups.required = True
    attach = groups.add_parser(
        "attach-uuids", parents=[common], help="Generate and attach UUIDs to text input records",
        description=attach_uuids.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    attach_uuids.add_flags(attach)
    for group, summary_, table in (("journals", "Interact with broker journals", JOURNAL_COMMANDS),
                                   ("shards", "Interact with consumer shards", SHARD_COMMANDS)):
        sub_group = groups.add_parser(group, parents=[common], help=summary_)
        cmds = sub_group.add_subparsers(dest="command", metavar="<command>")
        cmds.required = True
        for name, (summary, description, add_flags, _) in table.items():
            sub = cmds.add_parser(name, parents=[common], help=summary, description=description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
            add_flags(sub)
    return parser


def read_ini(home: str | None) -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    if home:
        path = Path(home, INI_PATH)
        if path.is_file():
            cfg.read(path)
    return cfg


def resolve_address(ns: argparse.Namespace, env: dict[str, str] | os._Environ[str],
                    ini: configparser.ConfigParser, group: str = "journals",
                    service: str = "Broker") -> str:
    """The address of ``service`` (Broker or Consumer): flag, environment, ini, default."""
    given = getattr(ns, f"{service.lower()}_address", None)
    if given:
        return str(given)
    if env.get(f"{service.upper()}_ADDRESS"):
        return str(env[f"{service.upper()}_ADDRESS"])
    if ini.has_option(f"{group}.{service}", "Address"):
        return ini.get(f"{group}.{service}", "Address")
    return DEFAULT_ADDRESS


def _setting(ns: argparse.Namespace, attr: str, env: Any, env_key: str,
             ini: configparser.ConfigParser, ini_key: str, default: str) -> str:
    value = getattr(ns, attr, None)
    if value is not None:
        return str(value)
    if env.get(env_key):
        return str(env[env_key])
    if ini.has_option("journals.Broker", ini_key):
        return ini.get("journals.Broker", ini_key)
    return default


def main(argv: Sequence[str] | None = None, *, stdin: IO[bytes] | None = None,
         stdout: IO[bytes] | None = None, stderr: TextIO | None = None,
         env: dict[str, str] | None = None) -> int:
    err_stream = stderr if stderr is not None else sys.stderr
    environ: Any = env if env is not None else os.environ
    parser = build_parser()
    try:
        with contextlib.redirect_stderr(err_stream):  # Usage errors go where logs go.
            ns = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)

    log_level = getattr(ns, "log_level", None) or environ.get("LOG_LEVEL") or "info"
    try:
        log = Log(err_stream, log_level)
    except ValueError as exc:
        err_stream.write(f"gazctl: {exc}\n")
        return 1

    out_stream = stdout if stdout is not None else sys.stdout.buffer
    if ns.group == "attach-uuids":
        return run_attach_uuids(ns, log, stdin if stdin is not None else sys.stdin.buffer,
                                out_stream)

    ini = read_ini(environ.get("HOME"))
    address = resolve_address(ns, environ, ini, ns.group)
    consumer_address = resolve_address(ns, environ, ini, ns.group, "Consumer")
    try:
        grpc_target(address)
        grpc_target(consumer_address)
        cache_size = int(_setting(ns, "broker_cache_size", environ, "BROKER_CACHE_SIZE",
                                  ini, "Cache.Size", "0"))
    except ValueError as exc:
        log.fatal("invalid broker or consumer configuration", err=str(exc), address=address,
                  consumer_address=consumer_address)
        return 1

    ctx = Context(
        args=ns, log=log, address=address, cache_size=cache_size,
        zone=getattr(ns, "zone", None) or environ.get("ZONE", ""),
        stdin=stdin if stdin is not None else sys.stdin.buffer,
        stdout=out_stream,
        env=environ,
        consumer_address=consumer_address,
    )
    run = (SHARD_COMMANDS if ns.group == "shards" else JOURNAL_COMMANDS)[ns.command][3]
    try:
        asyncio.run(run(ctx))
    except CommandError as exc:
        log.fatal(exc.message, **exc.fields)
        return 1
    except (ClientError, GazetteError, OSError, ValueError) as exc:
        log.fatal(f"{ns.group} {ns.command} failed", err=str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def run_attach_uuids(ns: argparse.Namespace, log: Log, stdin: IO[bytes],
                     stdout: IO[bytes]) -> int:
    """``gazctl attach-uuids``: needs no broker. Returns the exit status."""
    try:
        template = attach_uuids.Template.parse(ns.template)
    except attach_uuids.UUIDTemplateError as exc:
        log.fatal("failed to parse --template", err=str(exc))
        return 1
    if ns.max_length <= 0:
        log.fatal("--max-length must be positive", max_length=ns.max_length)
        return 1
    inputs: list[IO[bytes]] = []
    try:
        for path in ns.paths:  # All are opened before any output, as Gazette's.
            inputs.append(open(path, "rb"))  # noqa: SIM115 - closed below
        try:
            attach_uuids.attach(template, inputs or [stdin], stdout,
                                max_length=ns.max_length, skip_header=ns.skip_header)
        except attach_uuids.LineTooLong as exc:
            log.fatal("failed to read input", err=str(exc))
            return 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as a Go process would on
        # SIGPIPE, and keep the interpreter's final flush from failing too.
        if stdout is sys.stdout.buffer:
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        log.fatal("attach-uuids failed", err=str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        for f in inputs:
            f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

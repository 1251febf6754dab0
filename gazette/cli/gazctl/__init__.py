"""gazctl: command-line tool for journals on a gazette (or Gazette) broker cluster, shards of
its consumer applications, and ``attach-uuids`` (which needs no broker) for preparing records.

Invariants:
- Flags and output follow Gazette's gazctl (see ``gazctl journals <cmd> --help``).
- The broker address is, in order: ``--broker.address``, ``$BROKER_ADDRESS``, ``Address``
  under ``[journals.Broker]`` (``[shards.Broker]`` for shard commands) in
  ``~/.config/gazette/gazctl.ini``, ``http://localhost:8080``. The consumer address of shard
  commands is ``--consumer.address``, ``$CONSUMER_ADDRESS``, ``Address`` under
  ``[shards.Consumer]``, ``http://localhost:8080``.
- ``https://`` addresses dial TLS, trusting ``--{broker,consumer}.trusted-ca-file`` (else the
  system's CAs) and presenting ``--*.cert-file`` when given; requests carry
  ``--*.auth-token`` (``$BROKER_AUTH_TOKEN``...) as given, or tokens signed with
  ``--*.auth-keys``.
- ``main`` returns the exit status: 0 on success, 1 with a single ``FATA`` log line on
  stderr for any expected failure (bad input, unreachable broker, refused request);
  never a traceback for those. 2 is argparse's status for unusable flags.
- ``--log.level`` (``$LOG_LEVEL``) and ``--log.format`` (``$LOG_FORMAT``: text, json, color)
  apply to gazctl's lines and to the library's ``logging`` records alike, which go through
  the same ``Log`` while ``main`` runs. ``--version`` prints ``gazette.__version__``.
"""

from __future__ import annotations

import argparse
import asyncio
import configparser
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, TextIO

from gazette.auth import Authorizer, BearerAuth, KeyedAuth
from gazette.cli import version_text
from gazette.cli.gazctl import attach_uuids
from gazette.cli.gazctl.common import CommandError, Context
from gazette.cli.gazctl.journals import COMMANDS as JOURNAL_COMMANDS
from gazette.cli.gazctl.output import FORMATS, LEVELS, Log, LogHandler
from gazette.cli.gazctl.shards import COMMANDS as SHARD_COMMANDS
from gazette.client.errors import ClientError
from gazette.client.journal_client import DEFAULT_ADDRESS, grpc_target
from gazette.protocol.errors import GazetteError
from gazette.rpc.tls import ClientTLS, TLSConfigError

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
    for role in ("broker", "consumer"):
        env = role.upper()
        g.add_argument(f"--{role}.cert-file", dest=f"{role}_cert_file", default=argparse.SUPPRESS,
                       help=f"Path to the client TLS certificate (env {env}_CERT_FILE)")
        g.add_argument(f"--{role}.cert-key-file", dest=f"{role}_cert_key_file", default=argparse.SUPPRESS,
                       help=f"Path to the client TLS private key (env {env}_CERT_KEY_FILE)")
        g.add_argument(f"--{role}.trusted-ca-file", dest=f"{role}_trusted_ca_file", default=argparse.SUPPRESS,
                       help=f"Path to the trusted CA of https:// servers (env {env}_TRUSTED_CA_FILE; "
                            "default the system's)")
        g.add_argument(f"--{role}.auth-keys", dest=f"{role}_auth_keys", default=argparse.SUPPRESS,
                       help=f"Base64 keys; the first signs Authorization tokens (env {env}_AUTH_KEYS)")
        g.add_argument(f"--{role}.auth-token", dest=f"{role}_auth_token", default=argparse.SUPPRESS,
                       help=f"Bearer token to authenticate with (env {env}_AUTH_TOKEN)")
    g.add_argument("--log.level", dest="log_level", default=argparse.SUPPRESS,
                   choices=sorted(LEVELS), help="Logging level (env LOG_LEVEL; default info)")
    g.add_argument("--log.format", dest="log_format", default=argparse.SUPPRESS,
                   choices=list(FORMATS), help="Logging output format (env LOG_FORMAT; default text)")
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common_flags()
    parser = argparse.ArgumentParser(
        prog="gazctl", parents=[common],
        description="gazctl is a tool for interacting with Gazette brokers and consumer "
                    "applications.")
    parser.add_argument("--version", action="version", version=version_text("gazctl"))
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


def security(ns: argparse.Namespace, env: Any, role: str) -> tuple[ClientTLS | None, Authorizer | None]:
    """``role``'s (broker, consumer) TLS and authorizer: flag, else environment. A token is
    sent as given; keys sign tokens; a file or key that cannot be used is a ValueError."""
    def get(name: str) -> str:
        value = getattr(ns, f"{role}_{name.replace('-', '_')}", None)
        return str(value) if value else str(env.get(f"{role.upper()}_{name.upper().replace('-', '_')}", ""))

    tls = ClientTLS(ca_file=get("trusted-ca-file"), cert_file=get("cert-file"), key_file=get("cert-key-file"))
    if tls.ca_file or tls.cert_file:
        try:
            tls.context  # noqa: B018 - a bad file fails here, naming it
        except TLSConfigError as err:
            raise ValueError(str(err)) from None
    authorizer: Authorizer | None = None
    if get("auth-token"):
        authorizer = BearerAuth(get("auth-token"))
    elif get("auth-keys"):
        authorizer = KeyedAuth(get("auth-keys"))
    return (tls if tls.ca_file or tls.cert_file else None), authorizer


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
    log_format = getattr(ns, "log_format", None) or environ.get("LOG_FORMAT") or "text"
    try:
        log = Log(err_stream, log_level, log_format)
    except ValueError as exc:
        err_stream.write(f"gazctl: {exc}\n")
        return 1
    # The library's logging (client retries, route changes, ...) goes through gazctl's Log, at
    # its level and in its format, for this call only (main is also called in-process by tests).
    root = logging.getLogger()
    handler, saved_level = LogHandler(log), root.level
    root.addHandler(handler)
    root.setLevel(log.level)
    try:
        return _run(ns, log, environ, stdin, stdout)
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)


def _run(ns: argparse.Namespace, log: Log, environ: Any, stdin: IO[bytes] | None,
         stdout: IO[bytes] | None) -> int:
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
        broker_tls, broker_auth = security(ns, environ, "broker")
        consumer_tls, consumer_auth = security(ns, environ, "consumer")
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
        broker_tls=broker_tls, broker_auth=broker_auth,
        consumer_tls=consumer_tls, consumer_auth=consumer_auth,
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

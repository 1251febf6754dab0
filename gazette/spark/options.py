"""The options of ``format("gazette")``, parsed once on the driver into a picklable value.

Invariants:

* Every option is checked here; an unknown option or a bad value is an :class:`OptionError`
  naming it (Spark lower-cases option names, so names are matched case-insensitively).
* ``mode`` is ``raw`` (one row per message frame: its bytes), ``uncommitted`` (every message
  decoded as read: duplicates, rolled-back messages and ACKs included, as Gazette's
  read-uncommitted readers give them) or ``committed`` (each committed application message
  exactly once, as the Sequencer delivers them; ACKs, which carry no application data, are not
  rows).
* ``end_offset`` bounds every journal (one integer), or each named journal (a JSON object);
  ``begin_mod_time`` skips fragments persisted before it (Unix seconds, or an ISO-8601 time).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

from gazette.errors import ValidationError
from gazette.protocol import protocol_pb2 as pb
from gazette.protocol.labels import LabelSelector, SelectorError
from gazette.protocol.validate import validate_list_request
from gazette.spark.errors import OptionError

__all__ = ["DEFAULT_BROKER", "Mode", "SourceOptions", "parse_options"]

DEFAULT_BROKER: Final = "localhost:8080"


class Mode(StrEnum):
    RAW = "raw"
    UNCOMMITTED = "uncommitted"
    COMMITTED = "committed"


@dataclass(frozen=True)
class SourceOptions:
    selector: str
    broker: str = DEFAULT_BROKER
    mode: Mode = Mode.UNCOMMITTED
    #: The message field holding the UUID (JSON key, or CSV column of the schema).
    uuid_field: str = "UUID"
    begin_mod_time: int = 0
    #: Upper bound of every journal (0: none) and of named journals.
    end_offset: int = 0
    end_offsets: Mapping[str, int] = field(default_factory=dict)
    #: ``file://`` stores are read below this directory (the brokers' --broker.file-root);
    #: without it their fragments are read through the brokers.
    file_root: str | None = None
    #: Fragments are grouped into partitions of about this many bytes (never split); 0:
    #: one partition per core of the machine, each 4 to 64 MiB.
    partition_bytes: int = 0
    #: Content is parsed in blocks of about this many bytes (memory per task is a few blocks).
    block_bytes: int = 1 << 20
    #: Lifetime of the signed fragment URLs planning hands to tasks, in seconds.
    signature_ttl: int = 6 * 3600
    #: Streaming: where a query without a checkpoint starts (earliest or latest).
    starting: str = "earliest"
    #: Streaming: an upper bound of bytes per micro-batch (0: none).
    max_bytes_per_trigger: int = 0
    #: Decoded modes: drop (and log) messages that do not parse under the schema, rather
    #: than fail the read (``malformed=skip``; the default is ``fail``).
    skip_malformed: bool = False

    def end_of(self, journal: str, head: int) -> int:
        """Where a read of ``journal`` whose write head is ``head`` stops."""
        end = self.end_offsets.get(journal, self.end_offset) or head
        return min(end, head)


_KNOWN: Final = {
    "selector", "broker", "mode", "uuid_field", "begin_mod_time", "end_offset", "file_root",
    "partition_bytes", "block_bytes", "signature_ttl", "starting", "max_bytes_per_trigger",
    "malformed",
    # Spark's own, passed through to every source.
    "path", "schema",
}


def _int(options: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    text = options.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(name, f"must be an integer, not {text!r}") from None
    if value < minimum:
        raise OptionError(name, f"must be at least {minimum}, not {value}")
    return value


def _mod_time(text: str | None) -> int:
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(text).timestamp())
    except ValueError:
        raise OptionError(
            "begin_mod_time", f"must be Unix seconds or an ISO-8601 time, not {text!r}"
        ) from None


def _end_offsets(text: str | None) -> tuple[int, dict[str, int]]:
    if not text:
        return 0, {}
    text = text.strip()
    if not text.startswith("{"):
        try:
            value = int(text)
        except ValueError:
            raise OptionError(
                "end_offset", f"must be an offset or a JSON object of offsets, not {text!r}"
            ) from None
        if value < 0:
            raise OptionError("end_offset", f"must not be negative, not {value}")
        return value, {}
    try:
        parsed = json.loads(text)
    except ValueError as err:
        raise OptionError("end_offset", f"is not valid JSON ({err})") from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in parsed.items()
    ):
        raise OptionError("end_offset", 'must map journal names to offsets: {"a/b": 1024}')
    return 0, parsed


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check and parse the options given to ``format("gazette")``."""
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - _KNOWN)
    if unknown:
        raise OptionError(unknown[0], f"is not an option of format('gazette'); known: "
                                      f"{', '.join(sorted(_KNOWN - {'path', 'schema'}))}")
    selector = opts.get("selector") or opts.get("path") or ""
    if not selector:
        raise OptionError("selector", "is required: a label selector of the journals to read, "
                                      "e.g. 'prefix=examples/' or 'name=examples/rides/part-000'")
    try:
        validate_list_request(pb.ListRequest(selector=LabelSelector.parse(selector).to_proto()))
    except (SelectorError, ValidationError) as err:
        raise OptionError("selector", f"{selector!r} is not a valid selector: {err}") from None
    mode_text = (opts.get("mode") or Mode.UNCOMMITTED.value).lower()
    try:
        mode = Mode(mode_text)
    except ValueError:
        raise OptionError("mode", f"must be raw, uncommitted or committed, not {mode_text!r}") from None
    starting = (opts.get("starting") or "earliest").lower()
    if starting not in ("earliest", "latest"):
        raise OptionError("starting", f"must be earliest or latest, not {starting!r}")
    malformed = (opts.get("malformed") or "fail").lower()
    if malformed not in ("fail", "skip"):
        raise OptionError("malformed", f"must be fail or skip, not {malformed!r}")
    end_offset, end_offsets = _end_offsets(opts.get("end_offset"))
    return SourceOptions(
        selector=selector,
        broker=opts.get("broker") or DEFAULT_BROKER,
        mode=mode,
        uuid_field=opts.get("uuid_field") or "UUID",
        begin_mod_time=_mod_time(opts.get("begin_mod_time")),
        end_offset=end_offset,
        end_offsets=end_offsets,
        file_root=opts.get("file_root") or None,
        partition_bytes=_int(opts, "partition_bytes", 0),
        block_bytes=_int(opts, "block_bytes", 1 << 20, 1 << 10),
        signature_ttl=_int(opts, "signature_ttl", 6 * 3600, 1),
        starting=starting,
        max_bytes_per_trigger=_int(opts, "max_bytes_per_trigger", 0),
        skip_malformed=malformed == "skip",
    )

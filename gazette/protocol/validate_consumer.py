"""Validation of the ``consumer`` and ``recoverylog`` protocol packages, after Gazette.

The same contract as :mod:`gazette.protocol.validate` (whose shared rules, scalars and change
validator this builds on): every ``validate_*`` returns ``None`` for a well-formed argument,
else raises ``ValidationError`` naming the field path and the broken rule, checking in Gazette's
order so the first error reported is Gazette's. Bounds are Gazette's: shard ids 4..512 bytes,
recovery-log and hint prefixes absolute clean paths.
"""

from __future__ import annotations

from gazette.errors import ValidationError
from gazette.protocol import consumer_pb2 as cpb
from gazette.protocol import recoverylog_pb2 as rpb
from gazette.protocol.labels import (
    META_ID,
    TOKEN_SYMBOLS,
    validate_single_value_labels,
    validate_token,
)
from gazette.protocol.validate import (
    fmt_ns,
    go_clean,
    validate_change,
    validate_duration,
    validate_header,
    validate_journal,
    validate_label_selector,
    validate_label_set,
    validate_offsets,
    validate_process_spec,
    within,
)

MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN = 4, 512
"""Gazette's bounds of a shard id, in bytes."""

__all__ = [
    "validate_consumer_spec",
    "validate_fsm_hints",
    "validate_shard_apply_request",
    "validate_shard_id",
    "validate_shard_list_request",
    "validate_shard_spec",
    "validate_stat_request",
]


def validate_shard_id(shard_id: str, field: str = "") -> None:
    validate_token(shard_id, TOKEN_SYMBOLS, MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN, field)


def validate_consumer_spec(spec: cpb.ConsumerSpec) -> None:
    with within("process_spec"):
        validate_process_spec(spec.process_spec)
    # shard_limit needs no checks.


def _is_absolute_clean_path(p: str) -> bool:
    return p.startswith("/") and go_clean(p) == p


def validate_shard_spec(spec: cpb.ShardSpec) -> None:
    validate_shard_id(spec.id, "id")
    if spec.recovery_log_prefix:
        validate_journal(f"{spec.recovery_log_prefix}/{spec.id}", "recovery_log_prefix")
        if not _is_absolute_clean_path(spec.hint_prefix):
            raise ValidationError(
                "hint_prefix",
                f"hint_prefix is not an absolute, clean, non-directory path ({spec.hint_prefix})",
            )
    elif spec.hint_prefix:
        raise ValidationError(
            "hint_prefix",
            f"invalid non-empty hint_prefix with empty recovery_log_prefix ({spec.hint_prefix})",
        )
    if spec.hint_backups < 0:
        raise ValidationError(
            "hint_backups", f"invalid hint_backups ({spec.hint_backups}; expected >= 0)"
        )
    validate_duration(spec.min_txn_duration, "min_txn_duration", min_ns=0)
    max_txn = validate_duration(spec.max_txn_duration, "max_txn_duration")
    if max_txn <= 0:
        raise ValidationError(
            "max_txn_duration", f"invalid max_txn_duration ({fmt_ns(max_txn)}; expected > 0)"
        )
    with within("labels"):
        validate_label_set(spec.labels)
        validate_single_value_labels(spec.labels)
        if any(lb.name == META_ID for lb in spec.labels.labels):
            raise ValidationError("", f'labels cannot include label "{META_ID}"')
    sources = spec.sources
    for i, source in enumerate(sources):
        validate_journal(source.journal, f"sources[{i}].journal")
        if source.min_offset < 0:
            raise ValidationError(
                f"sources[{i}].min_offset",
                f"invalid min_offset ({source.min_offset}; expected >= 0)",
            )
        if i and source.journal <= sources[i - 1].journal:
            raise ValidationError(
                f"sources[{i}].journal",
                f"sources not in unique, sorted order of journal "
                f"(index {i}; {source.journal} <= {sources[i - 1].journal})",
            )
    # hot_standbys, disable and disable_wait_for_ack need no checks.


def validate_fsm_hints(hints: rpb.FSMHints) -> None:
    """Recovery-log hints: each live segment is consistent and names its log once."""
    for n, node in enumerate(hints.live_nodes):
        for s, seg in enumerate(node.segments):
            with within(f"live_nodes[{n}].segments[{s}]"):
                if seg.log and seg.log == hints.log:
                    raise ValidationError("log", "segment log duplicates hints log")
                if seg.author == 0:
                    raise ValidationError("author", "author is zero")
                if seg.first_seq_no <= 0:
                    raise ValidationError("first_seq_no", "first_seq_no <= 0")
                if seg.first_offset < 0:
                    raise ValidationError("first_offset", "first_offset < 0")
                if seg.last_seq_no < seg.first_seq_no:
                    raise ValidationError("last_seq_no", "last_seq_no < first_seq_no")
                if seg.last_offset != 0 and seg.last_offset <= seg.first_offset:
                    raise ValidationError("last_offset", "last_offset <= first_offset")
                validate_journal(seg.log or hints.log, "log")


def validate_shard_apply_request(req: cpb.ApplyRequest) -> None:
    for i, change in enumerate(req.changes):
        with within(f"changes[{i}]"):
            _validate_shard_change(change)


def _validate_shard_change(change: cpb.ApplyRequest.Change) -> None:
    validate_change(change, validate_shard_spec, validate_shard_id)
    if change.HasField("primary_hints"):
        if change.delete:
            raise ValidationError(
                "primary_hints", "hints may be set only with an upsert, not a delete"
            )
        with within("primary_hints"):
            validate_fsm_hints(change.primary_hints)


def validate_shard_list_request(req: cpb.ListRequest) -> None:
    with within("selector"):
        validate_label_selector(req.selector)


def validate_stat_request(req: cpb.StatRequest) -> None:
    if req.HasField("header"):
        with within("header"):
            validate_header(req.header)
    validate_shard_id(req.shard, "shard")
    validate_offsets(req.read_through, "read_through")

"""Errors of the recovery log.

::

    RecoveryLogError (GazetteError)   base of everything below
    ├── FSMError                      an operation is not consistent with the log's history
    │   ├── WrongSeqNo, ChecksumMismatch, NotHintedAuthor, ExpectedHintedFnode
    │   └── FnodeNotTracked, LinkExists, NoSuchLink, PropertyExists
    ├── HintsError                    hints that do not describe a valid log history
    ├── PlaybackError                 playback cannot go on (names the log and offset)
    └── LogFencedError                the recorder lost its author fence to another process

``FSMError`` subclasses mirror Gazette's FSM errors one for one; the player decides which of
them mean "a dead branch or a duplicate, skip it" and which mean "this log is corrupt".
"""

from __future__ import annotations

from gazette.errors import GazetteError

__all__ = [
    "ChecksumMismatch",
    "ExpectedHintedFnode",
    "FSMError",
    "LogFencedError",
    "FnodeNotTracked",
    "HintsError",
    "LinkExists",
    "NoSuchLink",
    "NotHintedAuthor",
    "PlaybackError",
    "PropertyExists",
    "RecoveryLogError",
    "WrongSeqNo",
]


class RecoveryLogError(GazetteError):
    """Base of the recovery log's errors."""


class FSMError(RecoveryLogError):
    """An operation the FSM refuses (its state is unchanged, except for FnodeNotTracked)."""


class WrongSeqNo(FSMError):
    pass


class ChecksumMismatch(FSMError):
    pass


class NotHintedAuthor(FSMError):
    """The op's author is not the author of the next hinted segment (a dead branch)."""


class ExpectedHintedFnode(FSMError):
    """The op is not a create, but the hints say a file is created at its sequence number."""


class FnodeNotTracked(FSMError):
    """The op is consistent and was applied, but concerns a file the hints say is dead."""


class LinkExists(FSMError):
    pass


class NoSuchLink(FSMError):
    pass


class PropertyExists(FSMError):
    pass


class HintsError(RecoveryLogError, ValueError):
    """Hints that cannot describe a log's history (bad segments, order, logs)."""


class PlaybackError(RecoveryLogError):
    """Playback stopped: ``log`` and ``offset`` name where."""

    def __init__(self, log: str, offset: int, what: str) -> None:
        super().__init__(f"recovery log {log} at offset {offset}: {what}")
        self.log = log
        self.offset = offset


class LogFencedError(RecoveryLogError):
    """Another process took over the log (REGISTER_MISMATCH): this recorder never appends again.
    (Not the SQL store's ``CheckpointFencedError``: that fence is a checkpoint row's.)"""


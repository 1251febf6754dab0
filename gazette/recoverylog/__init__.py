"""Recovery logs: a store's file operations recorded into a journal, from which a player
rebuilds the store elsewhere (Gazette's ``consumer/recoverylog``).

* ``ops``: ``RecordedOp`` framing, chained CRC32-C checksums, author fences.
* ``fsm`` / ``segment`` / ``hints``: the state machine over ops, and the hints that let a
  player read only the live parts of a log.
* ``recorder``: appends a store's captured changes as fenced, atomic batches.
* ``player``: replays a log into a directory, tails it (hot standby), and hands off.
* ``capture``: turns a directory's changes into recorder calls (directory scan, SQLite WAL).
"""

from gazette.recoverylog.errors import (
    FSMError,
    HintsError,
    LogFencedError,
    PlaybackError,
    RecoveryLogError,
)
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import FnodeSegments, FSMHints, hint_keys
from gazette.recoverylog.ops import CONTENT_TYPE, fence, new_author
from gazette.recoverylog.player import PlaybackProgress, Player, PlayerState, take_over
from gazette.recoverylog.recorder import Recorder
from gazette.recoverylog.segment import Segment, SegmentSet

__all__ = [
    "CONTENT_TYPE",
    "FSM",
    "FSMError",
    "FSMHints",
    "FnodeSegments",
    "HintsError",
    "LogFencedError",
    "PlaybackError",
    "PlaybackProgress",
    "Player",
    "PlayerState",
    "Recorder",
    "RecoveryLogError",
    "Segment",
    "SegmentSet",
    "fence",
    "hint_keys",
    "new_author",
    "take_over",
]

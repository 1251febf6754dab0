"""Errors of the consumer framework.

::

    ConsumerError (GazetteError)     base of everything below
    ├── TransactionError             the application, the store or a commit failed a transaction
    └── ShardStateError              shard.state read before new_shard_state made it

A ``TransactionError`` fails its shard (FAILED, with the error's text); other shards of the
process carry on.
"""

from __future__ import annotations

from gazette.errors import GazetteError

__all__ = ["ConsumerError", "ShardStateError", "TransactionError"]


class ConsumerError(GazetteError):
    """Base of the consumer framework's errors."""



class MissingExtraError(ConsumerError, ImportError):
    """A store's driver is not installed: the message names the extra that brings it."""

class TransactionError(ConsumerError):
    """A transaction failed: ``phase`` says where (consume, finalize, commit, ack, ...)."""

    def __init__(self, phase: str, err: BaseException) -> None:
        super().__init__(f"{phase}: {err}")
        self.phase = phase


class ShardStateError(ConsumerError):
    """``shard.state`` was read before this start of the shard made it (in ``new_store``, or in
    ``new_shard_state`` itself), or after the shard ended: a bug of the application."""

    grpc_code = "FAILED_PRECONDITION"

"""The consumer framework: applications process journals' messages in shards, with
exactly-once transactions committed atomically with their stores.

Write an :class:`Application` (``new_store``, ``new_message``, ``consume_message``,
``finalize_txn``; optionally ``begin_txn``/``finished_txn``, and ``new_shard_state`` for state
the framework keeps per shard: a :class:`StatefulApplication`, ``shard.state``), run it with
``gazette consume --app package.module:AppClass`` or :func:`run_consumer`, and declare its
shards (ShardSpecs) through the Shard service. See docs/consumers.md.

Everything an app needs is here: the roles, ``InitArgs`` (what ``init_application`` gets),
``Recorder`` (what ``new_store`` gets with a recovery log), the stores (``MemoryStore``,
``JSONFileStore``; ``SQLStore``, ``SyncSQLStore``, ``SQLiteStore`` and
``RocksDBStore`` loaded on first use, so importing this package imports neither SQLAlchemy nor
rocksdict) and envelope helpers (``is_ack``, ``uuid_flags``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gazette.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gazette.consumer.client import ShardClient, ShardStatusError
    from gazette.consumer.envelopes import is_ack, uuid_flags
    from gazette.consumer.errors import ConsumerError, ShardStateError, TransactionError
    from gazette.consumer.initialize import InitArgs
    from gazette.consumer.interfaces import (
        Application,
        Assignment,
        BeginFinisher,
        MaybeAwaitable,
        MessageProducer,
        OpFuture,
        Shard,
        ShardPublisher,
        StatefulApplication,
        Store,
    )
    from gazette.consumer.process import ConsumerConfig, ConsumerProcess
    from gazette.consumer.resolver import Resolution, Resolver
    from gazette.consumer.run import run_consumer
    from gazette.consumer.stores.json_file import JSONFileStore
    from gazette.consumer.stores.memory import MemoryStore
    from gazette.consumer.stores.rocksdb import RocksDBStore
    from gazette.consumer.stores.sql import PreviousCommitFailed, SQLStore, SyncSQLStore
    from gazette.consumer.stores.sqlite import SQLiteStore
    from gazette.consumer.transaction import TransactionLoop, TxnConfig, TxnState
    from gazette.recoverylog import Recorder

# Every name is loaded on first use: a process that needs one part (gazctl's shard client)
# does not import the whole framework (aiohttp, the allocator, the recovery log).
_LAZY = {
    "Application": "gazette.consumer.interfaces",
    "Assignment": "gazette.consumer.interfaces",
    "BeginFinisher": "gazette.consumer.interfaces",
    "ConsumerConfig": "gazette.consumer.process",
    "ConsumerError": "gazette.consumer.errors",
    "ConsumerProcess": "gazette.consumer.process",
    "InitArgs": "gazette.consumer.initialize",
    "JSONFileStore": "gazette.consumer.stores.json_file",
    "MaybeAwaitable": "gazette.consumer.interfaces",
    "MemoryStore": "gazette.consumer.stores.memory",
    "MessageProducer": "gazette.consumer.interfaces",
    "OpFuture": "gazette.consumer.interfaces",
    "Recorder": "gazette.recoverylog",
    "Resolution": "gazette.consumer.resolver",
    "Resolver": "gazette.consumer.resolver",
    "Shard": "gazette.consumer.interfaces",
    "ShardClient": "gazette.consumer.client",
    "ShardPublisher": "gazette.consumer.interfaces",
    "ShardStateError": "gazette.consumer.errors",
    "ShardStatusError": "gazette.consumer.client",
    "StatefulApplication": "gazette.consumer.interfaces",
    "Store": "gazette.consumer.interfaces",
    "TransactionError": "gazette.consumer.errors",
    "TransactionLoop": "gazette.consumer.transaction",
    "TxnConfig": "gazette.consumer.transaction",
    "TxnState": "gazette.consumer.transaction",
    "is_ack": "gazette.consumer.envelopes",
    "run_consumer": "gazette.consumer.run",
    "uuid_flags": "gazette.consumer.envelopes",
    "RocksDBStore": "gazette.consumer.stores.rocksdb",
    "SQLStore": "gazette.consumer.stores.sql",
    "SyncSQLStore": "gazette.consumer.stores.sql",
    "PreviousCommitFailed": "gazette.consumer.stores.sql",
    "SQLiteStore": "gazette.consumer.stores.sqlite",
}

__all__ = [
    "Application",
    "Assignment",
    "BeginFinisher",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerProcess",
    "InitArgs",
    "JSONFileStore",
    "MaybeAwaitable",
    "MemoryStore",
    "MessageProducer",
    "OpFuture",
    "PreviousCommitFailed",
    "Recorder",
    "Resolution",
    "Resolver",
    "RocksDBStore",
    "SQLStore",
    "SQLiteStore",
    "Shard",
    "ShardClient",
    "ShardPublisher",
    "ShardStateError",
    "ShardStatusError",
    "StatefulApplication",
    "Store",
    "SyncSQLStore",
    "TransactionError",
    "TransactionLoop",
    "TxnConfig",
    "TxnState",
    "is_ack",
    "run_consumer",
    "uuid_flags",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

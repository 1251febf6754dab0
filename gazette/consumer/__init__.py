"""The consumer framework: applications process journals' messages in shards, with
exactly-once transactions committed atomically with their stores.

Write an :class:`Application` (``new_store``, ``new_message``, ``consume_message``,
``finalize_txn``; optionally ``begin_txn``/``finished_txn``), run it with
``gazette consume --app package.module:AppClass`` or :func:`run_consumer`, and declare its
shards (ShardSpecs) through the Shard service. See docs/consumers.md.
"""

from gazette.consumer.client import ShardClient, ShardStatusError
from gazette.consumer.envelopes import is_ack, uuid_flags
from gazette.consumer.errors import ConsumerError, DeferredFirstMessage, TransactionError
from gazette.consumer.interfaces import Application, BeginFinisher, OpFuture, Shard, Store
from gazette.consumer.process import ConsumerConfig, ConsumerProcess
from gazette.consumer.resolver import Resolution, Resolver
from gazette.consumer.run import run_consumer
from gazette.consumer.stores.json_file import JSONFileStore
from gazette.consumer.stores.memory import MemoryStore
from gazette.consumer.transaction import TransactionLoop, TxnConfig, TxnState

__all__ = [
    "Application",
    "BeginFinisher",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerProcess",
    "DeferredFirstMessage",
    "JSONFileStore",
    "MemoryStore",
    "OpFuture",
    "Resolution",
    "Resolver",
    "Shard",
    "ShardClient",
    "ShardStatusError",
    "Store",
    "TransactionError",
    "TransactionLoop",
    "TxnConfig",
    "TxnState",
    "is_ack",
    "run_consumer",
    "uuid_flags",
]

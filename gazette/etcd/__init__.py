"""etcd, as brokers and consumers use it: connecting, revision-checked transactions, and a
decoded mirror of a key prefix.

* :mod:`.client` — ``connect`` (plaintext, or TLS for an ``https://`` endpoint), ``parse_endpoint``.
* :mod:`.txn` — ``Cmp``/``Put``/``Delete`` and ``BatchedTxn``: every write gazette makes to etcd
  is a transaction checked against the revisions it read.
* :mod:`.keyspace` — ``KeySpace``, the generic mirror (range, watch, decoders, observers).

The key layouts live beside their users (``gazette.allocator.keys``, ``gazette.broker.keys``,
``gazette.consumer.keys``); running an etcd server for tests and demos is
``gazette.testing.etcd_process``.
"""

from gazette.etcd.client import CHANNEL_OPTIONS, connect, is_tls_endpoint, parse_endpoint

__all__ = ["CHANNEL_OPTIONS", "connect", "is_tls_endpoint", "parse_endpoint"]

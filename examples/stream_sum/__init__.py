"""stream-sum: summing many concurrent streams of chunks, exactly once (Gazette's
``examples/stream-sum``), and the crash test that proves it.

* ``summer``: the consumer application. Each shard reads a partition of chunks, keeps each
  open stream's running SHA-1 (``sum_n = sha1(sum_{n-1} || data_n)``) in an embedded store
  (RocksDB or SQLite, by the shard's ``store`` label) recorded to its recovery log, and
  publishes a stream's final ``Sum`` when its empty last chunk arrives.
* ``chunker``: publishes the chunks of many concurrent streams, computes each sum itself, and
  fails loudly when a published sum is wrong, repeated, or later than the SLA.
* ``crashtest``: etcd, four brokers in two zones, summers and chunkers on loopback, with kill
  -9s, SIGTERMs, freezes and etcd restarts at random intervals.
"""

from examples.stream_sum.messages import (
    CHUNK_LABEL,
    SUMS_JOURNAL,
    Chunk,
    StreamSumError,
    Sum,
    update,
)

__all__ = ["CHUNK_LABEL", "SUMS_JOURNAL", "Chunk", "StreamSumError", "Sum", "update"]

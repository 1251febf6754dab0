"""Spark over journals: ``spark.read.format("gazette")`` and ``spark.readStream.format("gazette")``.

Persisted fragments are read straight from their stores, content not yet persisted from the
brokers; rows come back as Arrow record batches with ``_journal`` and ``_offset`` (and
``_uuid``, ``_producer``, ``_publish_time`` for messages with UUIDs). ``mode=committed`` reads
each committed message exactly once, as Gazette's read-committed readers do. See docs/spark.md.

Needs the ``spark`` extra (``pip install 'gazette[spark]'``) and Java 17+.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gazette.spark.errors import (
    BrokerUnreachableError,
    ContentError,
    OptionError,
    SetupError,
    SparkSourceError,
)
from gazette.spark.schema import schema_of
from gazette.spark.session import Progress, check_java, local_session, register

if TYPE_CHECKING:
    from gazette.spark.source import GazetteDataSource

__all__ = [
    "BrokerUnreachableError",
    "ContentError",
    "GazetteDataSource",
    "OptionError",
    "Progress",
    "SetupError",
    "SparkSourceError",
    "check_java",
    "local_session",
    "register",
    "schema_of",
]


def __getattr__(name: str) -> Any:
    # The data source imports pyspark and pyarrow: loaded when asked for.
    if name == "GazetteDataSource":
        from gazette.spark.source import GazetteDataSource

        return GazetteDataSource
    raise AttributeError(name)

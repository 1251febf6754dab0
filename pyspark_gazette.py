"""Spark's auto-registration hook: a top-level ``pyspark_*`` module exposing ``DefaultSource``
makes ``format("gazette")`` available in every session, with no register call.

Spark's data-source lookup imports every installed ``pyspark_*`` module without a guard, so a
module that fails to import breaks the lookup for every job of the environment, gazette's or
not. This one therefore imports only ``pyspark.sql.datasource`` (which the lookup has already
loaded), and defines nothing when pyspark is absent. The source itself
(``gazette.spark.source``: pyarrow, numpy, gazette's client) is imported when Spark first asks
for a schema or a reader; if its dependencies are missing, that error names the extra.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def _gazette_source(options: Any) -> Any:
    try:
        from gazette.spark.source import GazetteDataSource
    except ImportError as err:
        raise ImportError(f"format(\"gazette\") needs the spark extra ({err}): "
                          "pip install 'gazette[spark]'") from err
    return GazetteDataSource(options)


try:
    from pyspark.sql.datasource import DataSource
except ImportError:  # no pyspark: nothing for Spark to register
    pass
else:
    class DefaultSource(DataSource):
        """``format("gazette")``: gazette.spark.source.GazetteDataSource, loaded on first use."""

        @classmethod
        def name(cls) -> str:
            return "gazette"

        def schema(self) -> Any:
            return _gazette_source(self.options).schema()

        def reader(self, schema: Any) -> Any:
            return _gazette_source(self.options).reader(schema)

        def streamReader(self, schema: Any) -> Any:
            return _gazette_source(self.options).streamReader(schema)

    __all__ = ["DefaultSource"]

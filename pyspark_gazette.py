"""Spark's auto-registration hook: a top-level ``pyspark_*`` module exposing ``DefaultSource``
makes ``format("gazette")`` available in every session, with no register call."""

from gazette.spark.source import GazetteDataSource as DefaultSource

__all__ = ["DefaultSource"]

"""Errors of the Spark data source.

::

    SparkSourceError (GazetteError)
    ├── OptionError (ValidationError)     an option of format("gazette") is missing or wrong
    ├── SetupError                        Java or PySpark missing, a session that cannot start
    ├── BrokerUnreachableError            planning could not list journals or fragments
    └── ContentError                      a journal's content does not parse as its framing

Each message names what is wrong (the option and its value, the journal and byte offsets)
so that Spark's wrapped ``PYTHON_DATA_SOURCE_ERROR`` still tells the analyst what to fix.
"""

from __future__ import annotations

from gazette.errors import GazetteError, ValidationError

__all__ = ["BrokerUnreachableError", "ContentError", "OptionError", "SetupError", "SparkSourceError"]


class SparkSourceError(GazetteError):
    """Base of the Spark data source's errors."""


class OptionError(SparkSourceError, ValidationError):
    """An option of ``format("gazette")`` is missing or has a bad value."""

    def __init__(self, option: str, rule: str) -> None:
        ValidationError.__init__(self, option, rule)

    def __str__(self) -> str:
        return f"option {self.field!r}: {self.rule}"


class SetupError(SparkSourceError):
    """Spark cannot run here (no Java, no PySpark) or a session failed to start."""


class BrokerUnreachableError(SparkSourceError):
    """No broker answered at the configured address while planning a read."""

    grpc_code = "UNAVAILABLE"
    http_status = 503


class ContentError(SparkSourceError):
    """Journal content that does not parse under the journal's framing."""

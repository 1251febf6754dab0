"""Fixtures shared by unit test modules."""

from raw_h2 import stalls  # noqa: F401  (the transport tests' CPU-stall probe, a fixture)

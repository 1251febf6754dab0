"""gazette: journals served by brokers, and exactly-once consumers, for Python.

Wire-compatible with Gazette (gazette/core). See docs/architecture.md for the layers.
"""

__version__ = "0.1.0"

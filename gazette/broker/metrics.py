"""Prometheus metrics of a broker (served at ``/debug/metrics``, see ``gazette.server.http``).

The per-append figures (bytes, appends by status, commit time) are kept as plain numbers by
:data:`APPENDS_TALLY` and exposed by a collector at scrape time: prometheus_client's own
Counter and Histogram take a lock and several calls per update, a measurable part of a small
append's cost. Invariant: the exposition is what prometheus_client's Counter and Histogram of
the same names would show (counters monotonic, histogram buckets cumulative).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from gazette.protocol import protocol_pb2 as pb

READ_BYTES = Counter("gazette_read_bytes_total", "Bytes sent by Read RPCs served locally.")

COMMIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class AppendsTally:
    """Append RPCs served locally: their bytes, statuses and commit times, as plain numbers."""

    __slots__ = ("append_bytes", "by_status", "commit_counts", "commit_sum", "groups", "grouped")

    def __init__(self) -> None:
        self.append_bytes = 0
        self.by_status: dict[int, int] = {}
        self.commit_counts = [0] * (len(COMMIT_BUCKETS) + 1)  # the last: above every bound
        self.commit_sum = 0.0
        self.groups = 0  # commits of a group of appends (group_commit.py)
        self.grouped = 0  # appends committed in them

    def committed(self, nbytes: int, seconds: float) -> None:
        self.append_bytes += nbytes
        self.commit_counts[bisect.bisect_left(COMMIT_BUCKETS, seconds)] += 1
        self.commit_sum += seconds

    def group_committed(self, sizes: list[int], seconds: float) -> None:
        """A group's appends (``group_commit.py``), each of ``sizes`` bytes, committed and
        answered OK after ``seconds``: as ``committed`` and ``answered`` of each, in one call."""
        n = len(sizes)
        self.append_bytes += sum(sizes)
        self.commit_counts[bisect.bisect_left(COMMIT_BUCKETS, seconds)] += n
        self.commit_sum += seconds * n
        by = self.by_status
        by[pb.OK] = by.get(pb.OK, 0) + n
        self.groups += 1
        self.grouped += n

    def answered(self, status: int) -> None:
        by = self.by_status
        by[status] = by.get(status, 0) + 1


APPENDS_TALLY = AppendsTally()


class _AppendsCollector:
    def __init__(self, tally: AppendsTally) -> None:
        self._tally = tally

    def collect(self) -> Iterator[Metric]:
        t = self._tally
        yield CounterMetricFamily("gazette_append_bytes", "Bytes committed by Append RPCs served locally.",
                                  value=t.append_bytes)
        appends = CounterMetricFamily("gazette_appends", "Append RPCs served locally, by status.",
                                      labels=["status"])
        for status, n in sorted(t.by_status.items()):
            appends.add_metric([pb.Status.Name(status)], n)  # type: ignore[arg-type]
        yield appends
        yield CounterMetricFamily("gazette_append_groups",
                                  "Commits of a group of whole Append RPCs that arrived together.",
                                  value=t.groups)
        yield CounterMetricFamily("gazette_grouped_appends", "Append RPCs committed in a group.",
                                  value=t.grouped)
        cumulative, buckets = 0, []
        for bound, n in zip((*map(str, COMMIT_BUCKETS), "+Inf"), t.commit_counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        hist = HistogramMetricFamily("gazette_append_commit_seconds",
                                     "Time from an Append's first content chunk to its commit.")
        hist.add_metric([], buckets, sum_value=t.commit_sum)
        yield hist


REGISTRY.register(_AppendsCollector(APPENDS_TALLY))

"""Prometheus metrics of recording and playback (``gazette_recoverylog_*``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECORDED_BYTES = Counter("gazette_recoverylog_recorded_bytes_total",
                         "Bytes appended to recovery logs by recorders", ["log"])
RECORDED_APPENDS = Counter("gazette_recoverylog_recorded_appends_total",
                           "Atomic batches appended to recovery logs by recorders", ["log"])
PLAYBACK_BYTES = Counter("gazette_recoverylog_playback_bytes_total",
                         "Bytes of recovery log read by players", ["log"])
PLAYBACK_REMAINING = Gauge("gazette_recoverylog_playback_remaining_bytes",
                           "Bytes of recovery log left to read before a player reaches the head", ["log"])
PLAYBACK_FILES = Gauge("gazette_recoverylog_playback_files",
                       "Live files a player has restored so far", ["log"])

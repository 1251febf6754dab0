"""Allocator tuning for processes that move large messages.

A broker (and a client of large appends) allocates and frees buffers of a megabyte or so for
every message: received frames, joined messages, serialized requests. glibc serves blocks
above its mmap threshold with fresh ``mmap`` mappings and gives freed heap tops back to the
kernel above its trim threshold, so each such buffer page-faults in its every page and is
zeroed by the kernel: measured here, that tripled the CPU a server spends per 1 MiB message
(1.7-1.9 ms against 0.7 ms once buffers are reused). :func:`tune` raises both thresholds so
that freed buffers stay in the heap and are reused.

Invariants: it only raises limits (memory a process already freed may be kept, bounded by
the trim threshold, never more); an operator's own ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` wins, as does ``GAZETTE_MALLOC=default``; elsewhere than glibc it
does nothing. Call it once, early, from a process's entry point (never at import).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20
"""Blocks below this come from the heap (glibc's largest allowed value on 64-bit)."""
TRIM_THRESHOLD = 256 << 20
"""Free memory at the heap's top kept for reuse rather than returned to the kernel."""

_tuned: bool | None = None


def tune() -> bool:
    """Raises glibc's mmap and trim thresholds once; returns whether they are now raised."""
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    if os.environ.get("GAZETTE_MALLOC") == "default":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _tuned

"""Keep freed token memory in the process heap so the next episode reuses it.

Episodes stream megabytes of token columns that grow by doubling, ZMQ allocates a buffer per
large message, and the proxy reads each turn's request and upstream answer (hundreds of KB
late in a long session) into fresh bytes. With glibc's defaults each of those blocks is a
fresh ``mmap`` (or a heap top that is trimmed and grown again), so every episode pays a page
fault per 4 KiB touched, which on the development VM cost more CPU than the copies themselves.
Raising the mmap and trim thresholds makes freed blocks stay in the heap and be reused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

#: Blocks below this come from the heap (and are reused after ``free``) rather than mmap.
MMAP_THRESHOLD = 64 << 20
#: Free memory at the heap top kept before it is returned to the system.
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where not glibc.

    Meant for processes that exist to move episodes and turns (env server broker, workers
    and clients; the proxy); the memory kept is bounded by the process's own peak.
    Idempotent.
    """
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl): keep the defaults
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _done = ok
    return ok

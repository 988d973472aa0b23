"""Process memory settings for long runs.

glibc raises its mmap threshold every time a large block is freed (up to 32 MiB), after which
the per-frame arrays of a run (depth maps, display packets, upload buffers: 0.2-2 MB each, made on
one thread and freed on another) come from the malloc arenas instead of fresh mappings. Arenas
fragment and are not returned to the system, so a long GUI run's RSS climbs to a high-water mark
far above what it holds (docs/benchmarks_gui.md, "Long runs": 1.5 GB vs 1.04 GB after 10,000
synthetic frames). A fixed 128 KiB threshold (glibc's initial value) keeps large blocks as
mappings that go back to the system when freed, and two arenas bound the per-thread spread.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024
ARENA_MAX = 2

_done = False


def bound_heap() -> bool:
    """Apply the settings above once per process (glibc only; the user's MALLOC_* environment
    variables win). Returns True if they were applied. Call before the run's threads start."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):         # musl and friends: nothing to tune
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_ARENA_MAX, ARENA_MAX))
    _done = ok
    return ok

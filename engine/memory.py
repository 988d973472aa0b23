"""Process memory settings for long runs (the one place that tunes the C heap; gui and run use it).

glibc raises its mmap threshold every time a large block is freed (up to 32 MiB), after which
the per-frame arrays of a run (depth maps, display packets, upload buffers, thinning scratch:
0.2-15 MB each, made on one thread and freed on another) come from the malloc arenas instead of
fresh mappings. Arenas fragment and are not returned to the system, so a long GUI run's RSS climbs
to a high-water mark far above what it holds (docs/benchmarks_gui.md, "Long runs"). `bound_heap` fixes the threshold at 32 KiB (large
blocks stay mappings that go back to the system when freed) and caps the arenas at two (bounds
the per-thread spread). 32 KiB rather than glibc's initial 128 KiB: a software-rendered draw of a
4 M-point cloud (Mesa llvmpipe) allocates hundreds of MB in blocks of 32-128 KiB per frame, which
at 128 KiB stay in the main arena and at 32 KiB are mapped and unmapped (docs/benchmarks_gui.md
has both). What still fragments in the arenas (small blocks of Qt, Mesa, vispy) is handed back by `trim_heap`, which the GUI calls every few seconds of a run.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024
ARENA_MAX = 2

_done = False
_libc = None


def _glibc():
    """libc with mallopt/malloc_trim, or None (not Linux, or not glibc: musl and friends)."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                lib.malloc_trim.argtypes = (ctypes.c_size_t,)
                _libc = lib
            except (OSError, AttributeError):
                pass
    return _libc or None


def bound_heap() -> bool:
    """Apply the settings above once per process (glibc only; the user's MALLOC_* environment
    variables win). Returns True if they were applied. Call before the run's threads start."""
    global _done
    if _done:
        return True
    libc = _glibc()
    if libc is None or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_ARENA_MAX, ARENA_MAX))
    _done = ok
    return ok


def trim_heap() -> bool:
    """Return the free pages of every malloc arena to the system (glibc `malloc_trim(0)`; a few
    ms on a GUI-sized heap). True if glibc reported memory released."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False

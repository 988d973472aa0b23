"""Process heap tuning for the GUI (glibc only; a no-op elsewhere).

A live run allocates and frees many 0.5-15 MB numpy arrays per second (decoded frames, depth
maps, point batches, thinning scratch, GL upload copies). glibc raises its mmap threshold
dynamically (up to 32 MB) each time such a block is freed, after which these blocks come from
the brk heap instead of mmap, and the heap fragments: the GUI soak's RSS settled ~150 MB higher
and kept stepping up (docs/gui.md). A fixed 1 MiB threshold returns every large block to the
OS on free. Measured: 120 s GUI soak, RSS plateau ~750 -> ~600 MB.
"""
from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3        # glibc <malloc.h>
MMAP_THRESHOLD = 1 << 20


def tune_malloc(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (disables its dynamic growth); True if applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):        # not glibc (musl, ...): leave the allocator alone
        return False

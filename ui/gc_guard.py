"""Python's cyclic garbage collector runs only on the GUI thread while a window is open.

Why: the collector runs in whichever thread happens to allocate when a threshold is crossed. If
that is the engine worker (e.g. while it imports torch) and the garbage holds Qt wrappers, their
C++ destructors run on the worker, take Qt's locks and then wait for the GIL, while the GUI
thread holds the GIL and waits for the same lock: a deadlock (seen in the GUI tests). pyqtgraph's
GarbageCollector disables automatic collection and collects on a GUI-thread timer instead; this
module counts the windows that need it and gives automatic collection back after the last one.
"""
from __future__ import annotations

import gc

from pyqtgraph.util.garbage_collector import GarbageCollector

_users = 0
_collector = None


def acquire(interval_s: float = 0.5) -> None:
    """Called by each window at construction: collection moves to the GUI thread's timer."""
    global _users, _collector
    _users += 1
    if _collector is None:
        _collector = GarbageCollector(interval=interval_s)


def release() -> None:
    """Called when a window closes: after the last one, automatic collection comes back."""
    global _users, _collector
    _users = max(0, _users - 1)
    if _users == 0 and _collector is not None:
        _collector.timer.stop()
        _collector = None
        gc.enable()
        gc.collect()

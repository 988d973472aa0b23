"""While a window is open, Python's cyclic GC runs only on the GUI thread (ui/gc_guard.py):
collected on the engine worker, Qt wrappers deadlocked the worker against the GUI thread."""
import gc
import threading


class _Cycle:
    def __init__(self):
        self.me = self


def test_cyclic_gc_runs_on_the_gui_thread_only(qtbot, make_window):
    w = make_window()
    assert not gc.isenabled()
    seen = []

    class Probe(_Cycle):
        def __del__(self):
            seen.append(threading.current_thread() is threading.main_thread())

    def allocate():   # a worker making plenty of cyclic garbage never triggers a collection
        for _ in range(20_000):
            _Cycle()
        Probe()
        for _ in range(20_000):
            _Cycle()

    t = threading.Thread(target=allocate)
    t.start()
    t.join()
    assert seen == []                       # nothing was collected on the worker
    qtbot.waitUntil(lambda: bool(seen), timeout=5_000)
    assert seen == [True]                   # the GUI thread's timer collected it
    w.close()
    assert gc.isenabled()                   # automatic collection back after the last window

"""Monitors repaint cost (figures, not a test): the pyqtgraph monitors panel with a full history
(ui.monitors.HISTORY samples per curve), refreshed as the stats tick does it and repainted, at
the window's width. Prints the median and max of one refresh + repaint of every plot at once and of one plot
(what the stats tick does, ui.monitors.REFRESH_STAGGER_MS apart), to set against the viewer's
frame-time target (display/frame_time_target_ms).

    xvfb-run -a -s "-screen 0 1600x1000x24" python -m benchmarks.monitors_bench [--width 1600] [--repeats 30]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    from PySide6 import QtWidgets
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    from ui.monitors import HISTORY, MonitorsPanel
    m = MonitorsPanel()
    m.resize(a.width, a.height)
    m.show()
    app.processEvents()
    rng = np.random.default_rng(0)
    stats = lambda: {"fps": 20 + rng.random(), "latency_ms": 40 + rng.random(), "latency_p95_ms": 60.0,  # noqa: E731
                     "read_ms": 5.0, "sinks_ms": 8.0}
    for _ in range(HISTORY):                      # a full history (times spaced as the ticks are)
        m.update_stats(stats())
        m.update_viewer_fps(5.0)
    def timed(f) -> float:
        t0 = time.perf_counter()
        f()
        m.repaint()                               # the panel and its plots, synchronously
        app.processEvents()                       # what the refresh scheduled (axes)
        return 1e3 * (time.perf_counter() - t0)
    whole, parts = [], []
    n = len(m._plot_series())
    for _ in range(a.repeats):
        m.update_stats(stats())
        m.update_viewer_fps(5.0 + rng.random())
        whole.append(timed(m.refresh))            # every plot in one paint
        m.update_stats(stats())
        m.update_viewer_fps(5.0 + rng.random())
        for i in range(n):                        # as the stats tick does it: a plot per paint
            parts.append(timed(lambda: m.refresh_plot(i)))
    w, p = np.asarray(whole), np.asarray(parts)
    print(f"monitors {a.width}x{a.height}, {HISTORY} samples per curve, load average {os.getloadavg()[0]:.1f}, "
          f"{a.repeats} repeats: all plots in one paint median {np.median(w):.1f} ms, max {w.max():.1f} ms; "
          f"one plot per paint (the stats tick) median {np.median(p):.1f} ms, max {p.max():.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

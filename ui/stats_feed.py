"""Run statistics of the window for `--stats-csv`, readable from a recorder thread.

`engine.stats_csv.StatsRecorder` writes its rows from a thread of its own, so a busy GUI thread
(a long paint, a thinning pass, a modal dialog) cannot thin out the record of a long run exactly
where it stalls. What it reads must therefore never need the GUI thread:
- the engine's stats arrive straight from each run's worker thread (a direct connection to the
  worker's `stats` signal, hooked through `MainWindow.runStarted`) and are kept as a snapshot;
- the viewer's figures are plain numbers of its scene model, read as they are;
- the event loop's lateness comes from `LoopGapProbe`, whose 10 ms timer runs on the GUI thread:
  while that thread is blocked no tick arrives, and the first one after it records the whole gap.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from PySide6 import QtCore


class LoopGapProbe(QtCore.QObject):
    """Measures how late the GUI event loop runs: a 10 ms timer records the time between its
    ticks; a gap well over 10 ms means the loop was busy (a long paint, a thinning pass...)."""

    INTERVAL_MS = 10

    def __init__(self, parent=None):
        super().__init__(parent)
        self._gaps: list[float] = []
        self._clock = QtCore.QElapsedTimer()
        self._clock.start()
        self._last = 0
        self._timer = QtCore.QTimer(self, interval=self.INTERVAL_MS, timeout=self._tick)
        self._timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self._timer.start()

    def _tick(self) -> None:
        now = self._clock.elapsed()
        self._gaps.append(now - self._last)
        self._last = now
        if len(self._gaps) > 100_000:        # nobody collects: keep the newest half
            del self._gaps[:50_000]

    def take_p99_ms(self) -> Optional[float]:
        """p99 of the gaps since the last call (None if there were none), then forget them."""
        gaps, self._gaps = self._gaps, []
        return float(np.percentile(gaps, 99)) if gaps else None


class StatsFeed(QtCore.QObject):
    """Snapshots of `win`'s run statistics; create it on the GUI thread, call `snapshot()` from
    any thread."""

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.engine: dict = {}                 # replaced whole (never mutated): safe to read anywhere
        self._probe = LoopGapProbe(self)       # its timer lives on the GUI thread
        win.runStarted.connect(self._hook)
        if win.runs.handle is not None:                 # a run started before the feed existed
            self._hook(win.runs.handle.worker)

    def _hook(self, worker) -> None:
        worker.stats.connect(self._on_stats, QtCore.Qt.ConnectionType.DirectConnection)

    def _on_stats(self, stats: dict) -> None:  # the worker's thread
        self.engine = dict(stats)

    def snapshot(self) -> tuple:
        """(engine stats, GUI stats) as `StatsCsv.row` takes them."""
        v = self.win.viewer
        gui = {"viewer_fps": float(self.win.viewer_fps), "viewer_points": int(v.point_count),
               "viewer_buffer_bytes": int(v.buffer_bytes), "loop_gap_p99_ms": self._probe.take_p99_ms()}
        return self.engine, gui

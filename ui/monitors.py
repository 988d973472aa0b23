"""Live monitors (pyqtgraph): engine FPS and latency, viewer FPS, memory, and the KV page map.

The time plot shows the engine's push (last, p95) and, from the run driver, the rest of a frame's
time on the engine's thread: waiting for the next input frame (decode / camera) and handing the
results on (session store, viewer) -- so a user sees whether the engine, the input or the output
holds the run back.

The page map is the "visual memory" view: one cell per page of the layer-0 KV pool, coloured by
what it holds (free / scale / window / special / pending — codes of PagedKVCache.page_map()), so
the user sees the scale anchor, the sliding window cycling through the pool and the special-token
stream growing, with memory staying flat.
"""
from __future__ import annotations

import collections
import os
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtGui, QtWidgets

HISTORY = 300                                   # samples kept per curve

PAGE_CODES = ("free", "scale", "window", "special", "pending")
PAGE_COLOURS = np.array([[60, 62, 70, 255], [230, 160, 40, 255], [60, 150, 240, 255],
                         [120, 210, 110, 255], [220, 80, 200, 255]], np.ubyte)
PAGE_MAP_COLUMNS = 32
REFRESH_HZ = 1.0
REFRESH_STAGGER_MS = 150 # the plots of a tick repaint one at a time, this far apart
LEGEND_COLUMNS = 2       # entries side by side: at 1280x720 a plot has room for two legend rows


def _legend(plot: pg.PlotItem) -> pg.LegendItem:
    """A compact legend drawn over the curves (a translucent box, above them in z), its entries
    in LEGEND_COLUMNS columns so that every label stays inside a short plot."""
    lg = plot.addLegend(offset=(5, 2), labelTextSize="7.5pt", verSpacing=-6, horSpacing=8,
                        colCount=LEGEND_COLUMNS, brush=pg.mkBrush(32, 34, 39, 200))
    lg.setZValue(1000)
    return lg


def _relayout(legend: pg.LegendItem) -> None:
    """Lay the entries out again after one was added or removed (pyqtgraph leaves holes)."""
    legend.columnCount = 0
    legend.setColumnCount(LEGEND_COLUMNS)


class _Series:
    """One curve. `optional` series (GPU memory) stay out of the legend until the engine
    reports a value, so a CPU engine shows no empty GPU entries."""

    def __init__(self, plot: pg.PlotItem, name: str, colour: str, optional: bool = False):
        self.t = collections.deque(maxlen=HISTORY)
        self.v = collections.deque(maxlen=HISTORY)
        self.plot, self.name, self.optional = plot, name, optional
        self.curve = plot.plot(name=None if optional else name, pen=pg.mkPen(colour, width=2))
        # a repaint draws at most ~one vertex per pixel column of the samples in view
        self.curve.setDownsampling(auto=True, method="peak")
        self.curve.setClipToView(True)
        self.in_legend = not optional

    def add(self, t: float, v) -> None:
        if v is None:
            return
        if not self.in_legend and self.plot.legend is not None:
            self.plot.legend.addItem(self.curve, self.name)
            _relayout(self.plot.legend)
            self.in_legend = True
        self.t.append(t)
        self.v.append(float(v))
        self.dirty = True

    def refresh(self) -> None:
        if getattr(self, "dirty", False):
            self.curve.setData(np.fromiter(self.t, float), np.fromiter(self.v, float))
            self.dirty = False

    def clear(self) -> None:
        self.t.clear()
        self.v.clear()
        self.curve.setData([], [])
        if self.optional and self.in_legend and self.plot.legend is not None:
            self.plot.legend.removeItem(self.curve)
            _relayout(self.plot.legend)
            self.in_legend = False


def _fit_range(plot: pg.PlotItem, series) -> None:
    """Show all recorded samples of a plot, from 0 (or below) up to 5 % over the largest value."""
    ts = [s.t for s in series if s.t]
    if not ts:
        return
    vs = [s.v for s in series if s.v]
    x0, x1 = min(t[0] for t in ts), max(t[-1] for t in ts)
    y0, y1 = min(min(v) for v in vs), max(max(v) for v in vs)
    plot.setRange(xRange=(x0, max(x1, x0 + 1.0)), yRange=(min(0.0, y0), max(y1, y0 + 1.0) * 1.05),
                  padding=0.0, update=True)


class MonitorsPanel(QtWidgets.QWidget):
    def __init__(self, parent: Optional[QtWidgets.QWidget] = None):
        super().__init__(parent)
        pg.setConfigOptions(antialias=False, background="#202227", foreground="#c8c8c8")
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        self.plots = pg.GraphicsLayoutWidget()
        lay.addWidget(self.plots, 3)

        self.fps_plot = self.plots.addPlot(title="Throughput (frames/s)")
        _legend(self.fps_plot)
        self.engine_fps = _Series(self.fps_plot, "engine", "#4fa3ff")
        self.viewer_fps = _Series(self.fps_plot, "viewer", "#ffb000")
        self.lat_plot = self.plots.addPlot(title="Time per frame (ms)")
        _legend(self.lat_plot)
        self.latency = _Series(self.lat_plot, "engine (last)", "#e06c75")
        self.latency_p95 = _Series(self.lat_plot, "engine p95", "#98c379")
        self.wait_input = _Series(self.lat_plot, "waiting for input", "#61afef", optional=True)
        self.output = _Series(self.lat_plot, "output (store, view)", "#e5c07b", optional=True)
        self.mem_plot = self.plots.addPlot(title="Memory (MiB)")
        _legend(self.mem_plot)
        self.ram = _Series(self.mem_plot, "process RAM", "#c678dd")
        self.gpu_alloc = _Series(self.mem_plot, "GPU allocated", "#56b6c2", optional=True)
        self.gpu_reserved = _Series(self.mem_plot, "GPU reserved", "#d19a66", optional=True)
        small = QtGui.QFont()
        small.setPointSizeF(max(6.5, small.pointSizeF() * 0.85))
        for p in (self.fps_plot, self.lat_plot, self.mem_plot):
            # compact: a 1280x720 screen leaves these plots ~100 px; the time axis (seconds since
            # the run started) needs no label of its own row, and the title uses a smaller font
            p.setTitle(p.titleLabel.text, size="9pt")
            p.showGrid(x=True, y=True, alpha=0.2)
            for side in ("left", "bottom"):
                p.getAxis(side).setStyle(tickFont=small)
            p.getAxis("bottom").setToolTip("seconds since the run started")
            p.disableAutoRange()                 # ranges are set in refresh()

        # KV page map
        kv = QtWidgets.QWidget()
        kv_lay = QtWidgets.QVBoxLayout(kv)
        kv_lay.setContentsMargins(0, 0, 0, 0)
        self.kv_title = QtWidgets.QLabel("KV cache pages")
        self.kv_title.setWordWrap(True)
        kv_lay.addWidget(self.kv_title)
        self.kv_view = pg.GraphicsLayoutWidget()
        self.kv_box = self.kv_view.addViewBox(lockAspect=True, invertY=True, enableMouse=False)
        self.kv_image = pg.ImageItem()
        self.kv_box.addItem(self.kv_image)
        kv_lay.addWidget(self.kv_view, 1)
        legend = " ".join(f"<span style='color: rgb({c[0]},{c[1]},{c[2]})'>■</span> {n}"
                          for n, c in zip(PAGE_CODES, PAGE_COLOURS))
        self.kv_legend = QtWidgets.QLabel(legend)
        self.kv_legend.setWordWrap(True)
        kv_lay.addWidget(self.kv_legend)
        lay.addWidget(kv, 1)
        self.kv_pane = kv            # shown only once the engine reports a page map
        kv.hide()

        self._proc = None
        try:
            import psutil
            self._proc = psutil.Process(os.getpid())
        except Exception:  # psutil missing: RAM curve stays empty
            self._proc = None
        self.page_map_shown: Optional[np.ndarray] = None
        # Samples are recorded as they come; the plots repaint with the stats tick, at most at
        # REFRESH_HZ (a single-shot timer started by a sample, never a free-running one) —
        # redrawing pyqtgraph axes is the GUI's largest CPU cost after the 3D view itself.
        # A tick repaints one plot at a time (REFRESH_STAGGER_MS apart): a paint of all three
        # plots' axes at once costs more than the viewer's frame-time target on a software
        # renderer (benchmarks/monitors_bench.py), a third of it fits.
        self._pending_map = None
        self._next_plot = 0
        self._timer = QtCore.QTimer(self, interval=int(1000 / REFRESH_HZ), singleShot=True,
                                    timeout=self._tick)
        self._stagger = QtCore.QTimer(self, interval=REFRESH_STAGGER_MS, singleShot=True,
                                      timeout=self._tick)
        self.reset()

    def _series(self):
        return (self.engine_fps, self.viewer_fps, self.latency, self.latency_p95, self.wait_input,
                self.output, self.ram, self.gpu_alloc, self.gpu_reserved)

    def refresh(self) -> None:
        """Push the recorded samples and the newest page map to every plot at once (explicit
        requests, tests; the stats tick staggers them: `_tick`)."""
        for i in range(len(self._plot_series())):
            self.refresh_plot(i)
        self._show_pending_map()

    def refresh_plot(self, i: int) -> None:
        """Push plot i's samples and set its range by hand: pyqtgraph's auto-range is resolved
        during the paint and schedules further repaints (range, then axes), several times the
        repaints of setting it here."""
        plot, series = self._plot_series()[i]
        for s in series:
            s.refresh()
        _fit_range(plot, series)

    def _show_pending_map(self) -> None:
        if self._pending_map is not None:
            self._show_page_map(self._pending_map)
            self._pending_map = None

    def _tick(self) -> None:
        """The stats tick's repaint: the page map and the first plot, then the next plots one
        per REFRESH_STAGGER_MS (the event loop runs between their paints)."""
        i = self._next_plot
        if i == 0:
            self._show_pending_map()
        self.refresh_plot(i)
        self._next_plot = (i + 1) % len(self._plot_series())
        if self._next_plot:
            self._stagger.start()

    def _plot_series(self):
        return ((self.fps_plot, (self.engine_fps, self.viewer_fps)),
                (self.lat_plot, (self.latency, self.latency_p95, self.wait_input, self.output)),
                (self.mem_plot, (self.ram, self.gpu_alloc, self.gpu_reserved)))

    def reset(self) -> None:
        self._t0 = QtCore.QElapsedTimer()
        self._t0.start()
        for s in self._series():
            s.clear()
        self._pending_map = None
        self._next_plot = 0
        if hasattr(self, "_stagger"):
            self._stagger.stop()
        self.kv_image.clear()
        self.page_map_shown = None
        self.kv_title.setText("KV cache pages")
        self.kv_pane.hide()

    def _now(self) -> float:
        return self._t0.elapsed() / 1000.0

    def update_stats(self, stats: dict) -> None:
        if not self._timer.isActive():
            self._timer.start()
        t = self._now()
        self.engine_fps.add(t, stats.get("fps"))
        self.latency.add(t, stats.get("latency_ms"))
        self.latency_p95.add(t, stats.get("latency_p95_ms"))
        self.wait_input.add(t, stats.get("read_ms"))          # the run driver's thread per frame
        self.output.add(t, stats.get("sinks_ms"))
        mib = 1.0 / (1 << 20)
        ga, gr = stats.get("gpu_allocated_bytes"), stats.get("gpu_reserved_bytes")
        self.gpu_alloc.add(t, None if ga is None else ga * mib)
        self.gpu_reserved.add(t, None if gr is None else gr * mib)
        if self._proc is not None:
            self.ram.add(t, self._proc.memory_info().rss * mib)
        self.set_page_map(stats.get("kv_page_map"), stats.get("kv"))

    def update_viewer_fps(self, fps: float) -> None:
        self.viewer_fps.add(self._now(), fps)
        if not self._timer.isActive():
            self._timer.start()

    def set_page_map(self, page_map, kv: Optional[dict] = None) -> None:
        if page_map is None:
            if self.page_map_shown is None and self._pending_map is None:
                self.kv_title.setText("KV cache pages — this engine has no KV cache")
            return
        self._pending_map = np.array(page_map, copy=True)
        self.kv_pane.show()

    def _show_page_map(self, page_map) -> None:
        codes = np.clip(np.asarray(page_map, np.int64).ravel(), 0, len(PAGE_CODES) - 1)
        rows = -(-len(codes) // PAGE_MAP_COLUMNS)
        grid = np.zeros(rows * PAGE_MAP_COLUMNS, np.int64)
        grid[: len(codes)] = codes
        rgba = PAGE_COLOURS[grid.reshape(rows, PAGE_MAP_COLUMNS)]
        # ImageItem is column-major (x, y): transpose so rows run down the view
        self.kv_image.setImage(rgba.transpose(1, 0, 2), autoLevels=False, levels=(0, 255))
        self.page_map_shown = codes
        counts = np.bincount(codes, minlength=len(PAGE_CODES))
        self.kv_title.setText("KV pages (layer 0): " + ", ".join(
            f"{n} {int(c)}" for n, c in zip(PAGE_CODES, counts) if c))

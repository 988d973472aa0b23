"""The minimum-confidence control: a slider in the engine's ABSOLUTE confidence units (fixed
log scale, engine.confidence), the exact value in a spin box, and the distribution of every
confidence seen so far drawn under it with the threshold marked, so the user sees how much a
threshold keeps before moving it. All the maths is in engine.confidence."""
from __future__ import annotations

import math

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from engine.confidence import (SLIDER_MAX, SLIDER_MIN, SLIDER_STEPS, ConfidenceHistogram,
                               slider_from_threshold, threshold_from_slider)


class ConfidenceHistogramView(QtWidgets.QWidget):
    """Bars of a ConfidenceHistogram on a log x axis; bins below the threshold are dimmed."""

    def __init__(self, hist: ConfidenceHistogram, parent=None):
        super().__init__(parent)
        self.hist = hist
        self.threshold = -math.inf
        self.setMinimumHeight(36)
        self.setMaximumHeight(48)
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Fixed)
        self.setToolTip("Distribution of the confidences of every point so far (log scale); "
                        "points left of the line are hidden and not exported")

    def paintEvent(self, e) -> None:
        p = QtGui.QPainter(self)
        r = self.rect().adjusted(1, 1, -1, -12)
        p.fillRect(self.rect(), QtGui.QColor("#141518"))
        counts = self.hist.counts[1:-1].astype(np.float64)
        counts[0] += self.hist.counts[0]         # under/overflow drawn in the end bins
        counts[-1] += self.hist.counts[-1]
        if counts.max() > 0:
            h = np.sqrt(counts / counts.max())   # sqrt: the long tail stays visible
            n = len(counts)
            bw = r.width() / n
            edges = self.hist.edges
            for i, v in enumerate(h):
                if v <= 0:
                    continue
                hidden = edges[i + 1] <= self.threshold
                p.fillRect(QtCore.QRectF(r.left() + i * bw, r.bottom() - v * r.height(), max(bw - 0.5, 1.0),
                                         v * r.height()),
                           QtGui.QColor("#3b4048" if hidden else "#5aa9ff"))
        if math.isfinite(self.threshold):
            x = r.left() + r.width() * slider_from_threshold(self.threshold) / SLIDER_STEPS
            p.setPen(QtGui.QPen(QtGui.QColor("#ffcc33"), 1.5))
            p.drawLine(QtCore.QPointF(x, r.top()), QtCore.QPointF(x, r.bottom()))
        p.setPen(QtGui.QColor("#8a8f98"))
        f = p.font()
        f.setPointSizeF(7.5)
        p.setFont(f)
        for v in (1.0, 10.0, 100.0):            # the ends (0.1, 1000) are implied
            x = r.left() + r.width() * slider_from_threshold(v) / SLIDER_STEPS
            p.drawText(QtCore.QRectF(x - 20, r.bottom() + 1, 40, 11), QtCore.Qt.AlignmentFlag.AlignCenter, f"{v:g}")
        p.end()


class ConfidenceControl(QtWidgets.QWidget):
    """Slider + spin box + histogram; `changed(float)` carries the absolute threshold (-inf = all)."""

    changed = QtCore.Signal(float)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.hist = ConfidenceHistogram()
        self.slider = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.slider.setRange(0, SLIDER_STEPS)
        self.slider.setToolTip("Hide points below this confidence, in the engine's own units (the same "
                               "number in every run); also filters exports. Far left = show all.")
        self.spin = QtWidgets.QDoubleSpinBox()
        self.spin.setRange(0.0, SLIDER_MAX)
        self.spin.setDecimals(2)
        self.spin.setSpecialValueText("all")
        self.spin.setToolTip("Minimum confidence (absolute); 0 = all points")
        self.spin.setKeyboardTracking(False)
        self.view = ConfidenceHistogramView(self.hist)
        self.kept_label = QtWidgets.QLabel("")
        self.kept_label.setStyleSheet("color: #8a8f98;")
        lay = QtWidgets.QGridLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.slider, 0, 0)
        lay.addWidget(self.spin, 0, 1)
        lay.addWidget(self.view, 1, 0)
        lay.addWidget(self.kept_label, 1, 1, QtCore.Qt.AlignmentFlag.AlignTop)
        lay.setColumnStretch(0, 1)
        self.spin.setMaximumWidth(80)
        self._threshold = -math.inf
        self.slider.valueChanged.connect(self._from_slider)
        self.spin.valueChanged.connect(self._from_spin)

    def threshold(self) -> float:
        return self._threshold

    def set_threshold(self, t: float) -> None:
        t = -math.inf if (t is None or not math.isfinite(t) or t <= 0) else min(float(t), SLIDER_MAX)
        self._set(t)

    def _set(self, t: float) -> None:
        changed = t != self._threshold
        self._threshold = t
        for w, v in ((self.slider, slider_from_threshold(t)), (self.spin, t if math.isfinite(t) else 0.0)):
            w.blockSignals(True)
            w.setValue(v)
            w.blockSignals(False)
        self.view.threshold = t
        self.view.update()
        self._update_kept()
        if changed:
            self.changed.emit(t)

    def _from_slider(self, pos: int) -> None:
        self._set(threshold_from_slider(pos))

    def _from_spin(self, v: float) -> None:
        self._set(-math.inf if v <= 0 else float(v))

    # -- distribution ---------------------------------------------------------------------------
    def add(self, conf) -> None:
        self.hist.add(conf, max_samples=4096)    # a sample per frame: O(1) on the GUI thread

    def reset(self) -> None:
        self.hist.reset()
        self._painted_total = None
        self.refresh()

    def refresh(self) -> None:
        if self.hist.total != getattr(self, "_painted_total", None):   # repaint only on change
            self._painted_total = self.hist.total
            self.view.update()
            self._update_kept()

    def _update_kept(self) -> None:
        n = self.hist.total
        if n == 0:
            self.kept_label.setText("")
            return
        kept = self.hist.count_at_least(self._threshold)
        self.kept_label.setText(f"{100.0 * kept / n:.0f} % kept")

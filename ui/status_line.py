"""The status bar's permanent fields: frames (and keyframes), points drawn, engine FPS, the
engine's name, the monocular-scale note and the viewer's level of detail. The texts refresh on a
timer (STATUS_HZ), not per batch: with a GL view in the window every widget repaint recomposes
the whole window, so repaints are batched; `mark()` asks for the next refresh."""
from __future__ import annotations

from typing import Callable, Optional

from PySide6 import QtCore, QtWidgets

STATUS_HZ = 4.0


class StatusLine(QtCore.QObject):
    def __init__(self, bar: QtWidgets.QStatusBar, viewer, refresh: Callable[[], None]):
        super().__init__(bar)
        self.frames = QtWidgets.QLabel()
        self.points = QtWidgets.QLabel()
        self.fps = QtWidgets.QLabel()
        self.engine = QtWidgets.QLabel()
        self.scale = QtWidgets.QLabel("monocular: arbitrary scale")
        self.scale.setStyleSheet("color: #d19a66;")
        self.detail = QtWidgets.QLabel()      # "detail N % while moving" (viewer level of detail)
        for w, width in ((self.frames, 170), (self.points, 170), (self.fps, 70), (self.engine, 0),
                         (self.scale, 0), (self.detail, 0)):
            w.setMinimumWidth(width)
            bar.addPermanentWidget(w)
        viewer.detail_changed.connect(lambda _f: self.detail.setText(viewer.detail_text))
        self._dirty = False
        self._refresh = refresh
        self._timer = QtCore.QTimer(self, interval=int(1000 / STATUS_HZ), timeout=self._tick)
        self._timer.start()

    def mark(self) -> None:
        self._dirty = True

    def _tick(self) -> None:
        if self._dirty:
            self._dirty = False
            self._refresh()

    def show_counts(self, frames: int, keyframes: Optional[int], drawn: int, loaded: int,
                    fps: Optional[float]) -> None:
        self.frames.setText(f"{frames} frames" + (f" · {keyframes} keyframes" if keyframes is not None else ""))
        self.points.setText(f"{drawn:,} points drawn")
        self.points.setToolTip(f"{loaded:,} points loaded; those below the minimum confidence are not drawn")
        self.fps.setText(f"{fps:.1f} fps" if fps else "")

    def show_engine(self, label: str, monocular: bool) -> None:
        self.engine.setText(label)
        self.scale.setVisible(monocular)

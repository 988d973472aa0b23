"""Review in the main window: the review bar (ui/review.py: timeline, camera presets, clicks,
measure, thumbnails) and what the rest of the window asks of it.

The API review tools build on (crop, scale, ground truth: ui/review_tools*.py):
- `add_tool(widget)` puts a widget in the bar's tool row;
- `add_click_handler(fn)`: `fn(pos)` sees every click on the 3D view first (canvas pixels) and
  returns True when it used it (then no camera pick / measure happens);
- `sessionChanged(str)` carries the session folder the window shows ("" = none); `folder`;
- `reviewChanged(bool)` is True while the view shows a timeline position; `shown_upto()`.
"""
from __future__ import annotations

from typing import Callable, Optional

from PySide6 import QtCore, QtWidgets

from .review import CAMERA_PRESETS, ReviewBar


class ReviewController(QtCore.QObject):
    sessionChanged = QtCore.Signal(str)
    reviewChanged = QtCore.Signal(bool)

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.bar = ReviewBar(win)
        self.folder = ""
        self.bar.reviewChanged.connect(self.reviewChanged)
        # the Follow checkbox and the Follow camera preset are one state
        win.follow.toggled.connect(self._follow_toggled)
        self._follow_toggled(win.follow.isChecked())

    @property
    def reviewing(self) -> bool:
        return self.bar.reviewing

    def shown_upto(self) -> Optional[int]:
        """The timeline frame on screen while reviewing (exports stop there), else None."""
        return self.bar.shown_upto if self.bar.reviewing else None

    def keyframes_shown(self) -> Optional[int]:
        """Keyframes up to the timeline position while reviewing (None when not reviewing)."""
        return self.bar.shown_keyframes if self.bar.reviewing and self.bar.shown_upto is not None else None

    def set_session(self, folder: Optional[str]) -> None:
        self.bar.set_session(folder)
        self.folder = folder or ""
        self.sessionChanged.emit(self.folder)

    def reset(self) -> None:
        self.bar.reset()
        if self.folder:
            self.folder = ""
            self.sessionChanged.emit("")

    def run_finished(self) -> None:
        self.bar._update_range(follow_end=not self.bar.reviewing)

    def add_tool(self, widget: QtWidgets.QWidget) -> None:
        row = self.bar._tools.layout()
        row.insertWidget(row.count() - 2, widget)       # before the info label and the stretch

    def add_click_handler(self, fn: Callable) -> None:
        self.bar.click_handlers.append(fn)

    def _follow_toggled(self, on: bool) -> None:
        cam = self.bar.camera
        if (cam.currentIndex() == CAMERA_PRESETS.index("Follow")) != on:
            cam.setCurrentIndex(CAMERA_PRESETS.index("Follow" if on else "Free"))

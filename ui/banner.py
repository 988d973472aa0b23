"""The message banner above the 3D view: errors, warnings and notes in a dismissable strip, never
a blocking dialog, so scripted runs and tests are never stuck and the app stays usable."""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets


class Banner(QtWidgets.QFrame):
    """A dismissable message strip above the view (errors in red, notes in blue)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(10, 6, 6, 6)
        self.label = QtWidgets.QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QtWidgets.QToolButton(text="✕")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        lay.addWidget(self.label, 1)
        lay.addWidget(close)
        self.level = None
        self.hide()

    def show_message(self, text: str, level: str = "error") -> None:
        colours = {"error": ("#5c1f24", "#ffd7d7"), "warning": ("#5a4a12", "#fff1c4"),
                   "info": ("#1d3b5c", "#d8ecff")}
        bg, fg = colours.get(level, colours["info"])
        self.setStyleSheet(f"Banner {{ background: {bg}; border-radius: 4px; }} QLabel {{ color: {fg}; }}")
        self.label.setText(text)
        self.level = level
        self.show()

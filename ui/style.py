"""Application look: Qt's Fusion style with a dark palette that matches the 3D view."""
from __future__ import annotations

from PySide6 import QtGui, QtWidgets


def apply_style(app: QtWidgets.QApplication) -> None:
    app.setStyle("Fusion")
    p = QtGui.QPalette()
    C = QtGui.QColor
    R = QtGui.QPalette.ColorRole
    p.setColor(R.Window, C(43, 45, 51))
    p.setColor(R.WindowText, C(220, 220, 220))
    p.setColor(R.Base, C(30, 32, 36))
    p.setColor(R.AlternateBase, C(50, 52, 58))
    p.setColor(R.ToolTipBase, C(30, 32, 36))
    p.setColor(R.ToolTipText, C(220, 220, 220))
    p.setColor(R.Text, C(220, 220, 220))
    p.setColor(R.Button, C(55, 58, 64))
    p.setColor(R.ButtonText, C(220, 220, 220))
    p.setColor(R.Highlight, C(61, 132, 214))
    p.setColor(R.HighlightedText, C(255, 255, 255))
    p.setColor(R.PlaceholderText, C(130, 130, 130))
    for role in (R.Text, R.ButtonText, R.WindowText):
        p.setColor(QtGui.QPalette.ColorGroup.Disabled, role, C(120, 120, 120))
    app.setPalette(p)

"""The main window's size and place on the screen it opens on.

The first window (no saved geometry) takes the size the layout was designed for, but at most
SCREEN_FRACTION of the screen's available geometry (the area without panels / docks), centred:
on a 1280x720 screen the monitors, the review bar and the status bar stay on screen. A saved
geometry from a larger screen (or a monitor no longer attached) is shrunk and moved back inside
the available geometry.
"""
from __future__ import annotations

from PySide6 import QtCore, QtGui

FIRST_SIZE = (1600, 1000)      # the first window on a large screen
SCREEN_FRACTION = 0.9


def available_geometry(win) -> QtCore.QRect:
    screen = win.screen() or QtGui.QGuiApplication.primaryScreen()
    return screen.availableGeometry()


def fitted_size(available: QtCore.QRect, wanted=FIRST_SIZE, fraction: float = SCREEN_FRACTION) -> QtCore.QSize:
    """`wanted`, shrunk to `fraction` of `available` where it is larger."""
    return QtCore.QSize(min(int(wanted[0]), int(available.width() * fraction)),
                        min(int(wanted[1]), int(available.height() * fraction)))


def place_first_window(win, wanted=FIRST_SIZE) -> None:
    """Size (at most SCREEN_FRACTION of the screen) and centre a window that has no saved geometry."""
    avail = available_geometry(win)
    size = fitted_size(avail, wanted).expandedTo(win.minimumSizeHint()).boundedTo(avail.size())
    win.resize(size)
    win.move(avail.center() - QtCore.QPoint(size.width() // 2, size.height() // 2))


def keep_on_screen(win) -> None:
    """Shrink and move a restored geometry so that the window lies inside the available geometry."""
    avail = available_geometry(win)
    g = win.geometry()
    size = g.size().boundedTo(avail.size())
    if size != g.size():
        win.resize(size)
    x = min(max(g.x(), avail.left()), avail.right() + 1 - size.width())
    y = min(max(g.y(), avail.top()), avail.bottom() + 1 - size.height())
    if (x, y) != (g.x(), g.y()):
        win.move(x, y)

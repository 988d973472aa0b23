"""The main window's persisted state: restored from and saved to the app settings
(app.settings.AppSettings), every value checked against ui.settings_schema when read.

A bad value never stops the window: it takes its declared default and the problems of one launch
are shown together in one banner warning (and logged), naming each key.
"""
from __future__ import annotations

import numpy as np
from PySide6 import QtCore

from .settings_schema import COLOR_MODES, default


def restore(win, s) -> list:
    """Apply the settings `s` (None: the declared defaults, which the display widgets already
    hold: ui/display_panel.py) to the window's widgets; returns the problems found (also shown in
    the banner)."""
    value = s.value if s is not None else default
    if s is not None:
        win.settings_panel.set_config(s.load_config())
    win.source_panel.restore(value("source/state"))
    win.set_speed(value("run/speed"))
    win.loop.setChecked(value("run/loop"))
    win.point_size.setValue(value("display/point_size"))
    win.color_mode.setCurrentIndex(COLOR_MODES.index(value("display/color_mode")))
    win.stride.setValue(value("display/stride"))
    win.set_conf_threshold(value("display/conf_threshold"))
    win.show_frustums.setChecked(value("display/frustums"))
    win.all_frustums.setChecked(value("display/all_frustums"))
    win.show_traj.setChecked(value("display/trajectory"))
    win.follow.setChecked(value("display/follow"))
    win.point_budget.setValue(value("display/point_budget") / 1e6)
    win.viewer.frame_time_target_ms = value("display/frame_time_target_ms")
    if s is None:
        return []
    geo = s.get_bytes("window/geometry")
    if geo:
        win.restoreGeometry(QtCore.QByteArray(geo))
    st = s.get_bytes("window/state")
    if st:
        win.restoreState(QtCore.QByteArray(st))
    for key in ("sessions/max_gb", "sessions/max_age_days"):   # used at Start: checked (and said) now
        s.value(key)
    problems = s.take_problems()
    if problems:
        win.settings_warning = (f"Settings file {s.path}: " + "; ".join(problems)
                                + ". The defaults are used; the file is rewritten when the app closes.")
        win.show_message(win.settings_warning, "warning")
    return problems


def save(win, s, config=None) -> None:
    """Write the window's state to `s` (`config`: the engine settings, None = keep the saved ones)."""
    if s is None:
        return
    if config is not None:
        s.save_config(config)
    s.set("source/state", win.source_panel.state())
    s.set("run/speed", win.speed.currentData())
    s.set("run/loop", win.loop.isChecked())
    s.set("display/point_size", win.point_size.value())
    s.set("display/color_mode", COLOR_MODES[win.color_mode.currentIndex()])
    s.set("display/stride", win.stride.value())
    t = win.conf_threshold()
    s.set("display/conf_threshold", t if np.isfinite(t) else 0.0)
    s.set("display/frustums", win.show_frustums.isChecked())
    s.set("display/all_frustums", win.all_frustums.isChecked())
    s.set("display/trajectory", win.show_traj.isChecked())
    s.set("display/follow", win.follow.isChecked())
    s.set("display/point_budget", int(round(win.point_budget.value() * 1e6)))
    s.set_bytes("window/geometry", bytes(win.saveGeometry()))
    s.set_bytes("window/state", bytes(win.saveState()))
    s.sync()

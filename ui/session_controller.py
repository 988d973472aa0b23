"""Saved sessions in the main window: which session folder the window shows (a run's, or one
reopened with File > Open saved session / `--open-session` / a drop), reopening one into the view,
and File > Sessions folder (where runs go, their size, the retention limits).

Reading is engine.io.store.load_session; this module only moves what it returns to the widgets.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
from PySide6 import QtCore, QtWidgets

from engine.api import EngineError


def is_session_folder(path: str) -> bool:
    """A folder the store wrote (config.json and frames/): opened as a session, not as an input."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").exists() and (p / "frames").is_dir()


class SessionController(QtCore.QObject):
    opened = QtCore.Signal(str)       # a saved session is shown (its folder)

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.folder: Optional[str] = None      # the session the window shows (exports read it)
        self.keyframes: Optional[int] = None   # keyframes of a reopened session (None: a run's)

    def forget(self) -> None:
        """A new run: no session shown until its worker opens one."""
        self.folder = None
        self.keyframes = None

    def retention_limits(self) -> tuple:
        """(max_gb, max_age_days) of the sessions folder from the app settings."""
        from engine.io.retention import retention_limits
        return retention_limits(self.win.settings)

    def sessions_dialog(self):
        """File > Sessions folder: the folder, its size and the retention limits (ui/sessions_dialog.py)."""
        from .sessions_dialog import SessionsDialog
        dlg = SessionsDialog(self.win, settings=self.win.settings, root=self.win.session_root, keep=(self.folder,))
        dlg.open()
        return dlg

    def open_dialog(self) -> None:
        from engine.io.store import default_session_root
        p = QtWidgets.QFileDialog.getExistingDirectory(self.win, "Open a saved session",
                                                       str(self.win.session_root or default_session_root()))
        if p:
            self.open_folder(p)

    def open_folder(self, folder: str) -> bool:
        """Show a saved session (engine.io.store.load_session) in the viewer; exports then use it."""
        from engine.io.store import load_session

        from .display import FRUSTUM_FRACTION, make_display_frame
        w = self.win
        if w.running:
            w.show_message("Stop the running reconstruction before opening a saved session", "warning")
            return False
        try:
            loaded = load_session(folder)
        except EngineError as exc:
            w.show_message(str(exc))
            return False
        if not loaded.results:
            w.show_message(f"{folder} holds no frames", "warning")
            return False
        w.clear_view()
        stride = self.stored_stride(loaded.results)
        frames, fd = [], None
        # images for the newest frame, and for the newest frame with depth (the depth pane: engines
        # that compute depth on keyframes only leave the last frame without one)
        n = len(loaded.results)
        kd = next((i for i in range(n - 1, -1, -1) if loaded.results[i].depth is not None), n - 1)
        for i, r in enumerate(loaded.results):
            keep = i in (kd, n - 1)
            d = make_display_frame(r, stride, frustum_depth=fd, keep_images=keep)
            if fd is None and len(d.depth):
                fd = FRUSTUM_FRACTION * d.median_depth
            frames.append(d)
        w.viewer.apply_events(loaded.events)   # whole-segment and frame-range realigns, in order
        w.viewer.add_frames(frames)
        for d in frames:
            w.conf_control.add(d.conf)
        w.viewer.reset_view()
        if kd != n - 1:
            w.preview.show_frame(frames[kd])         # the depth pane; the frame pane is the newest's
        w.preview.show_frame(frames[-1])
        w.display.apply_threshold()
        self.folder = str(loaded.folder)
        self.keyframes = sum(1 for r in loaded.results if r.is_keyframe)
        w.reviews.set_session(self.folder)
        for p in loaded.problems:
            w.messages.append(("warning", p))
        note = f" — cut short: {loaded.cut_short}" if loaded.cut_short else ""
        w.show_message(f"Opened session {loaded.folder.name}: {len(frames)} frames{note}",
                       "warning" if loaded.cut_short else "info")
        w.settings_panel.set_config(loaded.config)
        w.update_engine_label()
        self.opened.emit(self.folder)
        w.update_status()
        return True

    def stored_stride(self, stored: list, stride: Optional[int] = None) -> int:
        """The subsampling step at the session store's (smaller) resolution that keeps about
        the density the user chose for live frames."""
        stride = int(self.win.stride.value()) if stride is None else int(stride)
        live_w = self.win.viewer.result_width
        if not stored or not live_w:
            return stride
        stored_w = np.asarray(stored[0].image).shape[1]
        return max(1, round(stride * stored_w / live_w))

"""Exports of the main window (File > Export, screenshots): the shown session written through
engine.io.export.export_results with what the view shows -- its confidence threshold, its
Subsample and, while the timeline shows an earlier frame, the session up to that frame.

A background export runs on a thread and reports on the GUI thread (`finished`), so the window
stays live; a failure is a message, never an exception out of a menu action.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

import numpy as np
from PySide6 import QtCore, QtWidgets

from engine.api import EngineError

log = logging.getLogger(__name__)

SUFFIXES = {"ply": ".ply", "npz": ".npz", "tum": ".txt", "glb": ".glb"}
MENU = (("ply", "Point cloud (&PLY)…"), ("npz", "Arrays (&NPZ)…"), ("tum", "Trajectory (&TUM)…"),
        ("colmap", "&COLMAP model (nerfstudio, gsplat)…"), ("glb", "&GLB scene (Blender, web viewers)…"))


class _Relay(QtCore.QObject):
    done = QtCore.Signal(object, object)


class ExportController(QtCore.QObject):
    finished = QtCore.Signal(object)   # export summary dict, or None when it failed

    def __init__(self, win):
        super().__init__(win)
        self.win = win

    def dialog(self, kind: str) -> None:
        from engine.io.export import EXPORT_FORMATS
        if kind == "colmap":
            p = QtWidgets.QFileDialog.getExistingDirectory(
                self.win, "Export a COLMAP model into a folder (images/ and sparse/0/ are created)")
        else:
            p, _ = QtWidgets.QFileDialog.getSaveFileName(self.win, f"Export {kind.upper()}",
                                                         "reconstruction" + SUFFIXES[kind], EXPORT_FORMATS[kind])
        if p:
            self.export(kind, p, background=True)

    def options(self) -> dict:
        """The options every export takes from the view: the absolute confidence threshold,
        the Subsample stride (in result pixels, as the viewer draws) and, while the timeline
        shows an earlier frame, that frame as the last one exported."""
        w = self.win
        t = w.conf_threshold()
        opts = {"conf_threshold": t if np.isfinite(t) else -np.inf, "stride": int(w.stride.value()),
                "result_width": w.viewer.result_width or None}
        until = w.reviews.shown_upto()
        if until is not None:
            opts["until"] = until                    # the session up to the timeline position
        return opts

    def _confirm_sparse(self, kind: str) -> bool:
        """Ask before writing an export that would keep almost nothing of what was loaded
        (engine.io.export.almost_nothing on the viewer's own counts: no file is read)."""
        from engine.io.export import almost_nothing
        if kind == "tum":
            return True
        total = self.win.viewer.point_count
        if not total:
            return True
        warning = almost_nothing(self.win.drawn_point_count(), total)
        if warning is None:
            return True
        B = QtWidgets.QMessageBox.StandardButton
        answer = QtWidgets.QMessageBox.question(
            self.win, "Export almost nothing?",
            f"At this threshold {warning}.\nLower the confidence threshold to export more.\n\n"
            "Write the export anyway?", B.Yes | B.No, B.No)
        if answer != B.Yes:
            self.win.show_message(f"Export not written: {warning}", "warning")
            return False
        return True

    def export(self, kind: str, path: str, background: bool = False) -> Optional[dict]:
        """Export the shown session in one of engine.io.export.EXPORT_FORMATS (ply, npz, tum,
        colmap = a folder, glb) through export_results, with the view's threshold and Subsample.
        Returns its summary; with background=True the export runs on a thread (the window stays
        live), returns None and `finished` carries the summary (None on failure)."""
        from engine.io.export import EXPORT_FORMATS
        if kind not in EXPORT_FORMATS:
            raise ValueError(kind)
        w = self.win
        if not w.session_folder:
            w.show_message("Nothing to export yet: run a reconstruction or open a saved session", "warning")
            return None
        if not self._confirm_sparse(kind):
            return None
        folder, opts = w.session_folder, self.options()

        def job() -> dict:
            from engine.io.export import export_results
            return export_results(folder, {kind: path}, **opts)     # streamed from the folder

        def report(out: Optional[dict], error: Optional[str]) -> None:
            if error:
                w.show_message(error)
            elif out.get("warning") and kind != "tum":
                w.show_message(f"Exported {out['frames']} frames, {out['points']:,} points to {path}, "
                               f"but {out['warning']}", "warning")
            else:
                w.show_message(f"Exported {out['frames']} frames"
                               + (f", {out['points']:,} points" if kind != "tum" else "") + f" to {path}", "info")
            self.finished.emit(out)

        if not background:
            QtWidgets.QApplication.setOverrideCursor(QtCore.Qt.CursorShape.WaitCursor)
            try:
                out = job()
            except EngineError as exc:
                report(None, str(exc))
                return None
            finally:
                QtWidgets.QApplication.restoreOverrideCursor()
            report(out, None)
            return out

        relay = _Relay(self)                    # delivers the result on the GUI thread
        relay.done.connect(lambda out, err: (report(out, err), relay.deleteLater()))
        w.statusBar().showMessage(f"Exporting {kind.upper()} to {path}…")

        def run() -> None:
            try:
                relay.done.emit(job(), None)
            except EngineError as exc:
                relay.done.emit(None, str(exc))
            except Exception as exc:  # never lose an export failure silently
                log.exception("export failed")
                relay.done.emit(None, f"Export failed: {exc}")
        threading.Thread(target=run, name="reconstudio-export", daemon=True).start()
        return None

    def save_screenshot(self, path: Optional[str] = None) -> Optional[str]:
        w = self.win
        if path is None:
            path, _ = QtWidgets.QFileDialog.getSaveFileName(w, "Save screenshot", "reconstudio.png", "PNG (*.png)")
            if not path:
                return None
        try:
            w.viewer.screenshot(path)
        except OSError as exc:
            w.show_message(str(exc))
            return None
        w.statusBar().showMessage(f"Screenshot saved to {path}", 5000)
        return path

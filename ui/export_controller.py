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

SUFFIXES = {"ply": ".ply", "npz": ".npz", "tum": ".txt", "glb": ".glb", "obj": ".obj", "rrd": ".rrd",
            "video": ".mp4", "orbit": ".mp4"}
FOLDERS = {"colmap": "Export a COLMAP model into a folder (images/ and sparse/0/ are created)",
           "nerfstudio": "Export nerfstudio data into a folder (transforms.json, images/, sparse_pc.ply)"}
MENU = (("ply", "Point cloud (&PLY)…"), ("npz", "Arrays (&NPZ)…"), ("tum", "Trajectory (&TUM)…"),
        ("colmap", "&COLMAP model (gsplat, COLMAP)…"), ("nerfstudio", "&nerfstudio data (transforms.json)…"),
        ("glb", "&GLB scene (Blender, web viewers)…"), ("obj", "&OBJ point cloud (Blender)…"),
        ("rrd", "&rerun recording (.rrd)…"), ("video", "&Video of the camera path (MP4)…"),
        ("orbit", "Video orbiting the &scene (MP4)…"))
VIDEO_SIZES = ("1280x720", "1920x1080", "3840x2160", "720x720")


class _Relay(QtCore.QObject):
    done = QtCore.Signal(object, object)


class ExportController(QtCore.QObject):
    finished = QtCore.Signal(object)   # export summary dict, or None when it failed

    def __init__(self, win):
        super().__init__(win)
        self.win = win

    def dialog(self, kind: str) -> None:
        from engine.io.export import EXPORT_FORMATS
        if kind in FOLDERS:
            p = QtWidgets.QFileDialog.getExistingDirectory(self.win, FOLDERS[kind])
        else:
            fmt = "video" if kind == "orbit" else kind
            p, _ = QtWidgets.QFileDialog.getSaveFileName(self.win, f"Export {fmt.upper()}",
                                                         "reconstruction" + SUFFIXES[kind], EXPORT_FORMATS[fmt])
        if not p:
            return
        if kind in ("video", "orbit"):
            video = self._ask_video()
            if video is not None:
                self.export_video(p, orbit=kind == "orbit", **video)
        else:
            self.export(kind, p, background=True)

    def _ask_video(self) -> Optional[dict]:
        """Frame size and rate of a video export (None: cancelled)."""
        size, ok = QtWidgets.QInputDialog.getItem(self.win, "Video size", "Width x height (even numbers):",
                                                  VIDEO_SIZES, 0, True)
        if not ok:
            return None
        fps, ok = QtWidgets.QInputDialog.getInt(self.win, "Video frame rate", "Frames per second:", 30, 1, 120)
        if not ok:
            return None
        try:
            w, h = (int(v) for v in size.lower().replace("×", "x").split("x"))
        except ValueError:
            self.win.show_message(f"Video not written: '{size}' is not a size like 1280x720", "warning")
            return None
        return {"size": (w, h), "fps": fps}

    def export_video(self, path: str, size: tuple = (1280, 720), fps: int = 30, orbit: bool = False) -> Optional[dict]:
        """Render the shown session (camera path, or an orbit) to an MP4 at `path`. It draws with
        the GUI's own GL context, so it runs on the GUI thread: a progress dialog counts the frames,
        keeps the window painted between them, and Cancel stops it (nothing is left behind)."""
        from engine.io.export import export_results
        from ui.video_render import OffscreenRenderer
        w = self.win
        if not w.session_folder:
            w.show_message("Nothing to export yet: run a reconstruction or open a saved session", "warning")
            return None
        bar = QtWidgets.QProgressDialog("Rendering the video…", "Cancel", 0, 0, w)
        bar.setWindowTitle("Video export")
        bar.setMinimumDuration(0)

        class Counted:
            """The offscreen renderer, counting frames for the dialog and stopping on Cancel."""
            def __init__(self, *a):
                self.inner, self.n = OffscreenRenderer(*a), 0

            def render(self, clip):
                if bar.wasCanceled():
                    raise EngineError("Video export cancelled")
                self.n += 1
                bar.setLabelText(f"Rendering the video… frame {self.n}")
                QtWidgets.QApplication.processEvents(QtCore.QEventLoop.ProcessEventsFlag.ExcludeUserInputEvents)
                return self.inner.render(clip)

            def close(self):
                self.inner.close()

        bar.show()
        try:
            out = export_results(w.session_folder, {"video": path}, **self.options(), video_renderer=Counted,
                                 video_size=size, video_fps=fps, video_orbit=orbit)
        except EngineError as exc:
            w.show_message(str(exc), "warning")
            self.finished.emit(None)
            return None
        finally:
            bar.close()
        w.show_message(f"Video written: {path} ({size[0]}x{size[1]}, {fps} frames/s)", "info")
        self.finished.emit(out)
        return out

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

"""The ReconStudio main window: layout and wiring only.

Layout: a transport toolbar on top; the 3D viewer in the centre with the current input frame and
its depth map beside it, the review bar under them; a controls dock on the left (source, display,
engine settings); the monitors dock at the bottom; a status bar. Errors appear in a non-modal
banner above the view (never a blocking dialog), so scripted runs and tests are never stuck.

The work lives in controllers, each a QObject with its own state and signals: runs
(ui/run_controller.py), sessions (ui/session_controller.py), exports (ui/export_controller.py),
review (ui/review_controller.py). Display widgets and their defaults: ui/display_panel.py (defaults
declared in ui/settings_schema.py). The window's methods below are the public API the app, the
tests and the benchmarks use; each hands over to its controller.
"""
from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Optional

from PySide6 import QtCore, QtGui, QtWidgets

from engine.api import EngineError, engine_capabilities
from engine.memory import bound_heap

from . import gc_guard, window_settings
from .banner import Banner
from .display_panel import DisplayPanel
from .export_controller import MENU as EXPORT_MENU
from .export_controller import ExportController
from .image_preview import ImagePreview
from .monitors import MonitorsPanel
from .review_controller import ReviewController
from .run_controller import RunController
from .session_controller import SessionController, is_session_folder
from .settings_panel import SettingsPanel
from .source_panel import SourcePanel
from .status_line import StatusLine
from .transport_bar import TransportBar
from .viewer import PointCloudViewer

log = logging.getLogger(__name__)

MESSAGES_KEPT = 1000          # newest messages kept in MainWindow.messages (issue #7: bounded)


class MainWindow(QtWidgets.QMainWindow):
    def __init__(self, settings=None, session_root: Optional[str] = None):
        super().__init__()
        bound_heap()           # large per-frame arrays: keep the heap from fragmenting (engine/memory.py)
        gc_guard.acquire()     # cyclic GC only on this thread: Qt wrappers collected on the worker deadlock
        self._gc_held = True
        self.setWindowTitle("ReconStudio")
        icon = Path(__file__).resolve().parents[1] / "resources" / "icons" / "reconstudio.png"
        if icon.exists():
            self.setWindowIcon(QtGui.QIcon(str(icon)))
        self.setAcceptDrops(True)
        self.settings = settings
        self.session_root = session_root
        # (level, text), newest last; bounded: a looped run's engine notes come every few seconds
        self.messages: collections.deque = collections.deque(maxlen=MESSAGES_KEPT)
        self.settings_warning: Optional[str] = None
        self.runs = RunController(self)
        self.sessions = SessionController(self)
        self.exports = ExportController(self)
        self.runStarted, self.runFinished = self.runs.runStarted, self.runs.runFinished
        self.framesShown, self.exportFinished = self.runs.framesShown, self.exports.finished
        self._build()
        self.runs.stateChanged.connect(self._update_actions)
        self.sessions.opened.connect(self._update_actions)
        window_settings.restore(self, self.settings)   # each value checked (ui/window_settings.py)
        self._update_actions()

    # -- construction -------------------------------------------------------------------------
    def _build(self) -> None:
        self.viewer = PointCloudViewer()
        self.preview = ImagePreview()
        self.preview.setMinimumWidth(220)
        self.banner = Banner()
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        split.addWidget(self.viewer)
        split.addWidget(self.preview)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        split.setSizes([900, 260])
        self.transport = tb = TransportBar(self.runs, lambda: self.start_run(), lambda: self.stop_run(), self)
        self.addToolBar(QtCore.Qt.ToolBarArea.TopToolBarArea, tb)
        self.act_start, self.act_pause, self.act_step, self.act_stop, self.act_seek = (
            tb.act_start, tb.act_pause, tb.act_step, tb.act_stop, tb.act_seek)
        self.speed, self.loop, self.seek_spin, self.max_frames, self.progress_label = (
            tb.speed, tb.loop, tb.seek_spin, tb.max_frames, tb.progress_label)
        self._build_controls()                 # before the review bar: it reads the Follow checkbox
        self.reviews = ReviewController(self)
        self.review = self.reviews.bar         # timeline, camera presets, click tools (ui/review.py)
        central = QtWidgets.QWidget()
        v = QtWidgets.QVBoxLayout(central)
        v.setContentsMargins(4, 4, 4, 4)
        v.addWidget(self.banner)
        v.addWidget(split, 1)
        v.addWidget(self.review)
        self.setCentralWidget(central)
        self.monitors = MonitorsPanel()
        mon = QtWidgets.QDockWidget("Monitors", self)
        mon.setObjectName("monitors")
        mon.setWidget(self.monitors)
        mon.setFeatures(QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
                        | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.monitors.setMinimumHeight(124)      # two legend rows stay inside the plots (ui/monitors.py)
        self.monitors.setMaximumHeight(260)
        self.addDockWidget(QtCore.Qt.DockWidgetArea.BottomDockWidgetArea, mon)
        self.resizeDocks([mon], [150], QtCore.Qt.Orientation.Vertical)   # the 3D view gets the room at 1280x720
        self._build_menus()
        self._build_status()

    def _build_controls(self) -> None:
        panel = QtWidgets.QWidget()
        lay = QtWidgets.QVBoxLayout(panel)
        lay.setContentsMargins(4, 4, 4, 4)
        self.source_panel = SourcePanel()
        self.source_panel.message.connect(lambda t: self.show_message(t, "warning"))
        lay.addWidget(self._group("Source", self.source_panel))
        self.display = d = DisplayPanel(self.viewer)
        # the display widgets by their old names (settings persistence, tests, benchmarks)
        self.conf_control, self.conf_slider = d.conf_control, d.conf_control.slider
        self.point_size, self.color_mode, self.stride, self.point_budget = (
            d.point_size, d.color_mode, d.stride, d.point_budget)
        self.show_frustums, self.show_traj, self.follow, self.all_frustums = (
            d.show_frustums, d.show_traj, d.follow, d.all_frustums)
        lay.addWidget(self._group("Display", d))
        self.settings_panel = SettingsPanel()
        self.settings_panel.message.connect(lambda t: self.show_message(t, "info"))
        self.settings_panel.changed.connect(self.update_engine_label)
        lay.addWidget(self._group("Engine", self.settings_panel))
        lay.addStretch(1)
        scroll = QtWidgets.QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(panel)
        scroll.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        dock = QtWidgets.QDockWidget("Controls", self)
        dock.setObjectName("controls")
        dock.setWidget(scroll)
        dock.setFeatures(QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        panel.setMinimumWidth(350)
        self.addDockWidget(QtCore.Qt.DockWidgetArea.LeftDockWidgetArea, dock)
        d.thresholdChanged.connect(self.status_dirty)
        d.screenshotRequested.connect(lambda: self.save_screenshot())
        d.strideChanged.connect(lambda *_: self.runs.note_next_run("Subsample", "exports use it now"))
        self.settings_panel.changed.connect(lambda *_: self.runs.note_next_run("Engine settings"))

    @staticmethod
    def _group(title: str, w: QtWidgets.QWidget) -> QtWidgets.QGroupBox:
        box = QtWidgets.QGroupBox(title)
        lay = QtWidgets.QVBoxLayout(box)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(w)
        return box

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        m.addAction("Open &video…", self._open_video_dialog, QtGui.QKeySequence.StandardKey.Open)
        m.addAction("Open image &folder…", self._open_folder_dialog)
        m.addAction("Open saved &session…", self.sessions.open_dialog)
        # a second stream in its own view and session folder (ui/second_view.py)
        self.act_second = m.addAction("Open s&econd source…", self.runs.open_second_dialog)
        self.act_second.setToolTip("Run another video, folder or webcam beside this one, in a second view")
        self.act_second.setIconText("Second source…")
        acts = self.transport.actions()                # also on the transport bar, after Stop
        after_stop = acts[acts.index(self.act_stop) + 1] if self.act_stop in acts[:-1] else None
        self.transport.insertAction(after_stop, self.act_second)
        m.addAction("Sessions &folder…", self.sessions_dialog)   # where runs go, their size, retention
        m.addSeparator()
        # one entry per engine.io.export.EXPORT_FORMATS (the CLI's --ply/--npz/--trajectory/--colmap/--glb)
        ex = m.addMenu("&Export")
        self.export_actions = {kind: ex.addAction(text, lambda k=kind: self.exports.dialog(k))
                               for kind, text in EXPORT_MENU}
        self.act_export_ply, self.act_export_npz, self.act_export_tum = (
            self.export_actions["ply"], self.export_actions["npz"], self.export_actions["tum"])
        ex.setToolTipsVisible(True)
        ex.setToolTip("Exports use the current confidence threshold and Subsample, like the view")
        m.addSeparator()
        m.addAction("Save &screenshot…", lambda: self.save_screenshot())
        m.addSeparator()
        m.addAction("&Quit", self.close, QtGui.QKeySequence.StandardKey.Quit)
        r = self.menuBar().addMenu("&Run")
        for a in (self.act_start, self.act_pause, self.act_step, self.act_stop):
            r.addAction(a)
        v = self.menuBar().addMenu("&View")
        v.addAction("&Reset view", self.viewer.reset_view, QtGui.QKeySequence("R"))
        v.addAction(self.follow.text(), lambda: self.follow.toggle(), QtGui.QKeySequence("F"))

    def _build_status(self) -> None:
        self.status_line = st = StatusLine(self.statusBar(), self.viewer, self.update_status)
        self.st_frames, self.st_points, self.st_fps, self.st_engine, self.st_scale, self.st_detail = (
            st.frames, st.points, st.fps, st.engine, st.scale, st.detail)
        self.update_status()
        self.update_engine_label()

    def _update_actions(self) -> None:
        running = self.running
        self.act_pause.setEnabled(running)
        self.act_pause.setText("Resume" if self.runs.paused else "Pause")
        self.act_stop.setEnabled(running)
        self.act_seek.setEnabled(not running or bool(self.runs.source_info.get("seekable")))
        for a in self.export_actions.values():
            a.setEnabled(self.session_folder is not None)

    # -- state shared by the controllers --------------------------------------------------------
    session_folder = property(lambda self: self.sessions.folder,
                              lambda self, v: setattr(self.sessions, "folder", v))
    model = property(lambda self: self.runs.model, lambda self, v: setattr(self.runs, "model", v))
    running = property(lambda self: self.runs.running)
    last_handle = property(lambda self: self.runs.last_handle)
    last_summary = property(lambda self: self.runs.last_summary)
    last_stats = property(lambda self: self.runs.last_stats)
    source_info = property(lambda self: self.runs.source_info)
    second_views = property(lambda self: self.runs.second_views)
    viewer_fps = property(lambda self: self.runs.viewer_fps)

    def clear_view(self) -> None:
        """An empty scene for a new run or a reopened session."""
        self.viewer.clear()
        self.preview.clear()
        self.conf_control.reset()
        self.reviews.reset()

    # -- the window's API (the app, tests, benchmarks): each call hands over to a controller ----
    def start_run(self, start_paused: bool = False) -> bool:
        return self.runs.start(start_paused)

    def stop_run(self, wait: bool = False, reason: str = "") -> None:
        self.runs.stop(wait, reason)

    def toggle_pause(self) -> None:
        self.runs.toggle_pause()

    def step(self) -> None:
        self.runs.step()

    def seek_to(self, index: int) -> None:
        self.runs.seek_to(index)

    def run_options(self, start_paused: bool = False):
        return self.runs.run_options(start_paused)

    def session_factory(self, cfg):
        return self.runs.session_factory(cfg)

    def open_second_source(self, spec, webcam_resolution=None):
        return self.runs.open_second_source(spec, webcam_resolution)

    def gui_stats(self) -> dict:
        return self.runs.gui_stats()

    def open_session_folder(self, folder: str) -> bool:
        return self.sessions.open_folder(folder)

    def sessions_dialog(self):
        return self.sessions.sessions_dialog()

    def retention_limits(self) -> tuple:
        return self.sessions.retention_limits()

    def export(self, kind: str, path: str, background: bool = False) -> Optional[dict]:
        return self.exports.export(kind, path, background)

    def export_options(self) -> dict:
        return self.exports.options()

    def save_screenshot(self, path: Optional[str] = None) -> Optional[str]:
        return self.exports.save_screenshot(path)

    def set_input(self, spec) -> None:
        self.source_panel.set_input(spec)

    def set_speed(self, speed: float) -> None:
        """Select a replay speed (0 = as fast as possible), adding it to the list if it is not there."""
        i = self.speed.findData(float(speed))
        if i < 0:
            self.speed.addItem(f"×{speed:g}", float(speed))
            i = self.speed.count() - 1
        self.speed.setCurrentIndex(i)

    def conf_threshold(self) -> float:
        """The minimum confidence in the engine's absolute units (−inf = show everything)."""
        return self.display.threshold()

    def set_conf_threshold(self, t: float) -> None:
        """Set the minimum confidence (absolute units; None, 0 or −inf = all points)."""
        self.display.set_threshold(t)

    def drawn_point_count(self) -> int:
        """Points the view draws now: those loaded with confidence >= the threshold."""
        from engine.confidence import count_at_least
        return count_at_least(self.viewer.conf_values(), self.conf_threshold())

    def save_settings(self) -> None:
        try:
            cfg = self.settings_panel.config()
        except EngineError:
            cfg = None        # malformed intrinsics: keep the last good engine settings
        window_settings.save(self, self.settings, cfg)

    # -- messages and status --------------------------------------------------------------------
    def show_message(self, text: str, level: str = "error") -> None:
        self.messages.append((level, text))
        self.banner.show_message(text, level)
        self.statusBar().showMessage(text, 10_000)
        log.info("%s: %s", level, text)

    def hide_banner_for_run(self) -> None:
        if self.banner.label.text() != self.settings_warning:   # a settings warning stays up
            self.banner.hide()

    def update_engine_label(self) -> None:
        name = self.settings_panel.engine_name()
        try:
            label = engine_capabilities(name).get("label", name)
        except EngineError:
            label = name
        self.status_line.show_engine(label, monocular=name == "geometric")

    def update_status(self) -> None:
        kf = self.reviews.keyframes_shown()       # scrubbing: the keyframes up to the shown frame
        if kf is None:
            kf = self.runs.last_stats.get("keyframes")
        if kf is None:
            kf = self.sessions.keyframes           # a reopened session: those it holds
        self.status_line.show_counts(self.viewer.frame_count, kf, self.drawn_point_count(), self.viewer.point_count,
                                     self.runs.last_stats.get("fps"))
        self.conf_control.refresh()
        progress = self.runs.progress_text()
        if progress is not None:
            self.progress_label.setText(progress)
        hint = self.runs.waiting_hint()
        if hint:                                   # nothing to draw yet: say what the engine waits for
            self.viewer.hint.setText(hint)
            self.viewer.hint.show()

    def status_dirty(self) -> None:
        self.status_line.mark()

    # -- files, drag and drop -------------------------------------------------------------------
    def _open_video_dialog(self) -> None:
        from .source_panel import VIDEO_FILTER
        p, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Open a video", "", VIDEO_FILTER)
        if p:
            self.set_input(p)

    def _open_folder_dialog(self) -> None:
        p = QtWidgets.QFileDialog.getExistingDirectory(self, "Open an image folder")
        if p:
            self.set_input(p)

    def dragEnterEvent(self, e: QtGui.QDragEnterEvent) -> None:
        if e.mimeData().hasUrls():
            e.acceptProposedAction()

    def dropEvent(self, e: QtGui.QDropEvent) -> None:
        urls = [u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()]
        if not urls:
            return
        p = urls[0]
        if is_session_folder(p):
            self.open_session_folder(p)
        else:
            self.set_input(p)
            self.show_message(f"Input: {p} — press Start", "info")
        e.acceptProposedAction()

    # -- shutdown ------------------------------------------------------------------------------
    def closeEvent(self, e: QtGui.QCloseEvent) -> None:
        self.save_settings()
        self.runs.shutdown()                       # second streams too
        self.reviews.reset()                       # a closed window holds no session folder open
        if self._gc_held:
            self._gc_held = False
            gc_guard.release()
        super().closeEvent(e)

"""The ReconStudio main window: source, transport, 3D view, previews, settings, monitors.

Layout: a transport toolbar on top; the 3D viewer in the centre with the current input frame and
its depth map beside it; a controls dock on the left (source, display, engine settings); the
monitors dock at the bottom; a status bar. Errors appear in a non-modal banner above the view
(never a blocking dialog), so scripted runs and tests are never stuck and the app stays usable.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
from pathlib import Path
from typing import Optional

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from engine.api import EngineError, engine_capabilities
from engine.intrinsics import attach_found_intrinsics
from engine.memory import bound_heap, trim_heap

from . import gc_guard, window_settings
from .image_preview import ImagePreview
from .monitors import MonitorsPanel
from .review import ReviewBar
from .review_confidence import ConfidenceControl
from .settings_panel import SettingsPanel
from .settings_schema import SPEEDS
from .source_panel import SourcePanel
from .stats_feed import LoopGapProbe
from .viewer import COLOR_MODES, PointCloudViewer
from .worker import RunOptions, WorkerHandle

log = logging.getLogger(__name__)


PREVIEW_HZ = 5.0
STATUS_HZ = 4.0


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




MESSAGES_KEPT = 1000          # newest messages kept in MainWindow.messages (issue #7: bounded)
TRIM_EVERY_S = 5             # seconds of a run between malloc_trim calls (engine/memory.py)


class _Relay(QtCore.QObject):
    done = QtCore.Signal(object, object)


class MainWindow(QtWidgets.QMainWindow):
    runFinished = QtCore.Signal(object)      # the worker's summary dict
    runStarted = QtCore.Signal(object)       # the new run's EngineWorker (before its thread starts)
    exportFinished = QtCore.Signal(object)   # export summary dict, or None when it failed
    framesShown = QtCore.Signal(int)         # frames in the viewer so far

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
        self.session_folder: Optional[str] = None
        # (level, text), newest last; bounded: a looped run's engine notes come every few seconds
        self.messages: collections.deque = collections.deque(maxlen=MESSAGES_KEPT)
        self._handle: Optional[WorkerHandle] = None
        self._noted_next_run: set = set()              # settings already said to apply next run
        self.last_handle: Optional[WorkerHandle] = None
        self.last_summary: Optional[dict] = None
        self.last_stats: dict = {}
        self.source_info: dict = {}
        self.model = None                              # a preloaded network (optional)
        self.second_views: list = []                   # open ui.second_view.StreamView docks' views
        self._stream_hubs = None                       # engine.shared_streams.StreamHubs (LingBot-Map runs)
        self._build()
        self._restore_settings()
        self._set_running(False)
        self._fps_timer = QtCore.QTimer(self, interval=1000, timeout=self._sample_viewer_fps)
        self._fps_timer.start()
        self._last_draws = 0
        self.viewer_fps = 0
        self._gap_probe: Optional[LoopGapProbe] = None    # started by the first gui_stats()
        self._clock = QtCore.QElapsedTimer()
        self._clock.start()
        self._last_preview = -1e9
        self._preview_backlog: list = []
        # Status texts refresh on a timer, not per batch: with a GL view in the window every
        # widget repaint recomposes the whole window, so repaints are batched (STATUS_HZ).
        self._status_dirty = False
        self._status_timer = QtCore.QTimer(self, interval=int(1000 / STATUS_HZ), timeout=self._refresh_status)
        self._status_timer.start()

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
        central = QtWidgets.QWidget()
        v = QtWidgets.QVBoxLayout(central)
        v.setContentsMargins(4, 4, 4, 4)
        v.addWidget(self.banner)
        v.addWidget(split, 1)
        self.review = ReviewBar(self)          # timeline, camera presets, click tools (ui/review.py)
        v.addWidget(self.review)
        self.setCentralWidget(central)

        self._build_transport()
        self._build_controls()
        self.monitors = MonitorsPanel()
        mon = QtWidgets.QDockWidget("Monitors", self)
        mon.setObjectName("monitors")
        mon.setWidget(self.monitors)
        mon.setFeatures(QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
                        | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.monitors.setMinimumHeight(110)
        self.monitors.setMaximumHeight(260)
        self.addDockWidget(QtCore.Qt.DockWidgetArea.BottomDockWidgetArea, mon)
        self.resizeDocks([mon], [150], QtCore.Qt.Orientation.Vertical)   # the 3D view gets the room at 1280x720
        self._build_menus()
        self._build_status()

    def _build_transport(self) -> None:
        tb = QtWidgets.QToolBar("Transport")
        tb.setObjectName("transport")
        tb.setMovable(False)
        tb.setToolButtonStyle(QtCore.Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        st = self.style()
        SP = QtWidgets.QStyle.StandardPixmap
        self.act_start = tb.addAction(st.standardIcon(SP.SP_MediaPlay), "Start", self.start_run)
        self.act_start.setToolTip("Start a new reconstruction (resets the scene)")
        self.act_pause = tb.addAction(st.standardIcon(SP.SP_MediaPause), "Pause", self.toggle_pause)
        self.act_step = tb.addAction(st.standardIcon(SP.SP_MediaSkipForward), "Step", self.step)
        self.act_step.setToolTip("Process one frame (starts paused if nothing runs)")
        self.act_stop = tb.addAction(st.standardIcon(SP.SP_MediaStop), "Stop", self.stop_run)
        self.act_start.setShortcut(QtGui.QKeySequence("Ctrl+Return"))
        self.act_pause.setShortcut(QtGui.QKeySequence("Space"))
        self.act_step.setShortcut(QtGui.QKeySequence("Ctrl+Right"))
        self.act_stop.setShortcut(QtGui.QKeySequence("Ctrl+."))
        tb.addSeparator()
        tb.addWidget(QtWidgets.QLabel(" Speed "))
        self.speed = QtWidgets.QComboBox()
        for label, val in SPEEDS:
            self.speed.addItem(label, val)
        self.speed.setToolTip("Replay speed for files: as fast as the engine goes, or paced by the video's clock")
        tb.addWidget(self.speed)
        self.loop = QtWidgets.QCheckBox("Loop")
        self.loop.setToolTip("Restart files at the end")
        tb.addWidget(self.loop)
        tb.addSeparator()
        tb.addWidget(QtWidgets.QLabel(" Frame "))
        self.seek_spin = QtWidgets.QSpinBox()
        self.seek_spin.setRange(0, 10_000_000)
        self.seek_spin.setToolTip("Frame to start from (or to jump to while running)")
        tb.addWidget(self.seek_spin)
        self.act_seek = tb.addAction("Go", lambda: self.seek_to(self.seek_spin.value()))
        tb.addSeparator()
        tb.addWidget(QtWidgets.QLabel(" Max frames "))
        self.max_frames = QtWidgets.QSpinBox()
        self.max_frames.setRange(0, 10_000_000)
        self.max_frames.setSpecialValueText("all")
        self.max_frames.setToolTip("Stop after this many input frames (all = to the end)")
        tb.addWidget(self.max_frames)
        spacer = QtWidgets.QWidget()
        spacer.setSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Preferred)
        tb.addWidget(spacer)
        self.progress_label = QtWidgets.QLabel("idle ")
        tb.addWidget(self.progress_label)
        self.addToolBar(QtCore.Qt.ToolBarArea.TopToolBarArea, tb)
        self.transport = tb

    def _build_controls(self) -> None:
        panel = QtWidgets.QWidget()
        lay = QtWidgets.QVBoxLayout(panel)
        lay.setContentsMargins(4, 4, 4, 4)
        self.source_panel = SourcePanel()
        self.source_panel.message.connect(lambda t: self.show_message(t, "warning"))
        lay.addWidget(self._group("Source", self.source_panel))

        disp = QtWidgets.QWidget()
        form = QtWidgets.QFormLayout(disp)
        # absolute confidence units (engine.confidence), with the distribution under the slider
        self.conf_control = ConfidenceControl()
        self.conf_slider = self.conf_control.slider
        form.addRow("Min confidence", self.conf_control)
        self.point_size = QtWidgets.QDoubleSpinBox()
        self.point_size.setSingleStep(0.5)
        self.point_size.setSuffix(" px")
        form.addRow("Point size", self.point_size)
        self.color_mode = QtWidgets.QComboBox()
        self.color_mode.addItems([m.capitalize() if m != "rgb" else "RGB" for m in COLOR_MODES])
        form.addRow("Colour", self.color_mode)
        self.stride = QtWidgets.QSpinBox()
        self.stride.setToolTip("Keep every N-th pixel of each frame (next run / reopen; also used by exports)")
        form.addRow("Subsample", self.stride)
        checks = QtWidgets.QWidget()
        g = QtWidgets.QGridLayout(checks)
        g.setContentsMargins(0, 0, 0, 0)
        self.show_frustums = QtWidgets.QCheckBox("Frustums")
        self.show_frustums.setChecked(True)
        self.show_traj = QtWidgets.QCheckBox("Trajectory")
        self.show_traj.setChecked(True)
        self.follow = QtWidgets.QCheckBox("Follow camera")
        g.addWidget(self.show_frustums, 0, 0)
        g.addWidget(self.show_traj, 0, 1)
        g.addWidget(self.follow, 1, 0)
        self.all_frustums = QtWidgets.QCheckBox("Every frame")
        self.all_frustums.setToolTip("Draw a frustum for every frame, not only the keyframes")
        g.addWidget(self.all_frustums, 1, 1)
        form.addRow(checks)
        btns = QtWidgets.QWidget()
        h = QtWidgets.QHBoxLayout(btns)
        h.setContentsMargins(0, 0, 0, 0)
        reset = QtWidgets.QPushButton("Reset view")
        reset.clicked.connect(self.viewer.reset_view)
        shot = QtWidgets.QPushButton("Screenshot…")
        shot.clicked.connect(lambda: self.save_screenshot())
        h.addWidget(reset)
        h.addWidget(shot)
        form.addRow(btns)
        self.point_budget = QtWidgets.QDoubleSpinBox()
        self.point_budget.setDecimals(1)
        self.point_budget.setSingleStep(1.0)
        self.point_budget.setSuffix(" M points")
        self.point_budget.setKeyboardTracking(False)   # typing "10" must not thin to 1 M on the way
        self.point_budget.setToolTip(
            "Most points the 3D view keeps (each takes ~28 bytes of GPU memory and ~30 of RAM). "
            "Past it, older frames are thinned to a voxel grid (keyframes finer, recent frames "
            "dense), so long runs stay flat in memory. Exports always use every stored frame.")
        form.addRow("Point budget", self.point_budget)
        lay.addWidget(self._group("Display", disp))

        self.settings_panel = SettingsPanel()
        self.settings_panel.message.connect(lambda t: self.show_message(t, "info"))
        self.settings_panel.changed.connect(self._update_engine_label)
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

        window_settings.apply_ranges(self)      # ranges and defaults: ui/settings_schema.py
        self.conf_control.changed.connect(self._apply_threshold)
        self.point_size.valueChanged.connect(self.viewer.set_point_size)
        self.color_mode.currentIndexChanged.connect(lambda i: self.viewer.set_color_mode(COLOR_MODES[i]))
        self.show_frustums.toggled.connect(self.viewer.set_show_frustums)
        self.show_traj.toggled.connect(self.viewer.set_show_trajectory)
        self.all_frustums.toggled.connect(self.viewer.set_all_frustums)
        self.follow.toggled.connect(lambda on: self.review.camera.setCurrentIndex(1 if on else 0)
                                    if (self.review.camera.currentIndex() == 1) != on else None)
        self.stride.valueChanged.connect(lambda *_: self._note_next_run("Subsample", "exports use it now"))
        self.settings_panel.changed.connect(lambda *_: self._note_next_run("Engine settings"))
        self.follow.toggled.connect(self.viewer.set_follow)
        self.point_budget.valueChanged.connect(lambda v: self.viewer.set_point_budget(int(v * 1e6)))

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
        m.addAction("Open saved &session…", self._open_session_dialog)
        # a second stream in its own view and session folder (ui/second_view.py)
        self.act_second = m.addAction("Open s&econd source…", self._open_second_dialog)
        self.act_second.setToolTip("Run another video, folder or webcam beside this one, in a second view")
        self.act_second.setIconText("Second source…")
        acts = self.transport.actions()                # also on the transport bar, after Stop
        after_stop = acts[acts.index(self.act_stop) + 1] if self.act_stop in acts[:-1] else None
        self.transport.insertAction(after_stop, self.act_second)
        m.addAction("Sessions &folder…", self.sessions_dialog)   # where runs go, their size, retention
        m.addSeparator()
        # one entry per engine.io.export.EXPORT_FORMATS (the CLI's --ply/--npz/--trajectory/--colmap/--glb)
        ex = m.addMenu("&Export")
        self.export_actions = {}
        for kind, text in (("ply", "Point cloud (&PLY)…"), ("npz", "Arrays (&NPZ)…"),
                           ("tum", "Trajectory (&TUM)…"), ("colmap", "&COLMAP model (nerfstudio, gsplat)…"),
                           ("glb", "&GLB scene (Blender, web viewers)…")):
            self.export_actions[kind] = ex.addAction(text, lambda k=kind: self.export_dialog(k))
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
        sb = self.statusBar()
        self.st_frames = QtWidgets.QLabel()
        self.st_points = QtWidgets.QLabel()
        self.st_fps = QtWidgets.QLabel()
        self.st_engine = QtWidgets.QLabel()
        self.st_scale = QtWidgets.QLabel("monocular: arbitrary scale")
        self.st_scale.setStyleSheet("color: #d19a66;")
        for w, width in ((self.st_frames, 170), (self.st_points, 170), (self.st_fps, 70),
                         (self.st_engine, 0), (self.st_scale, 0)):
            w.setMinimumWidth(width)
            sb.addPermanentWidget(w)
        self.st_detail = QtWidgets.QLabel()      # "detail N % while moving" (viewer level of detail)
        sb.addPermanentWidget(self.st_detail)
        self.viewer.detail_changed.connect(lambda _f: self.st_detail.setText(self.viewer.detail_text))
        self._update_status()
        self._update_engine_label()

    # -- settings ------------------------------------------------------------------------------
    def _restore_settings(self) -> None:
        """Widgets from the saved settings, each value checked when read (ui/window_settings.py):
        a bad value takes its default and the banner names it."""
        self.settings_warning: Optional[str] = None
        window_settings.restore(self, self.settings)

    def save_settings(self) -> None:
        try:
            cfg = self.settings_panel.config()
        except EngineError:
            cfg = None        # malformed intrinsics: keep the last good engine settings
        window_settings.save(self, self.settings, cfg)

    def set_speed(self, speed: float) -> None:
        """Select a replay speed (0 = as fast as possible), adding it to the list if it is not there."""
        i = self.speed.findData(float(speed))
        if i < 0:
            self.speed.addItem(f"×{speed:g}", float(speed))
            i = self.speed.count() - 1
        self.speed.setCurrentIndex(i)

    # -- messages ------------------------------------------------------------------------------
    def show_message(self, text: str, level: str = "error") -> None:
        self.messages.append((level, text))
        self.banner.show_message(text, level)
        self.statusBar().showMessage(text, 10_000)
        log.info("%s: %s", level, text)

    # -- run control ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._handle is not None and self._handle.is_running()

    def set_input(self, spec) -> None:
        self.source_panel.set_input(spec)

    def run_options(self, start_paused: bool = False) -> RunOptions:
        cfg = self.settings_panel.config()
        spec = self.source_panel.spec()
        if "intrinsics" in engine_capabilities(cfg.engine).get("fields", []):
            attach_found_intrinsics(cfg, spec)      # intrinsics.txt beside the input, as the CLI does
        return RunOptions(
            source=spec, config=cfg, session_root=self.session_root,
            speed=float(self.speed.currentData()), loop=self.loop.isChecked(),
            start_frame=int(self.seek_spin.value()), max_frames=int(self.max_frames.value()) or None,
            start_paused=start_paused, display_stride=int(self.stride.value()),
            webcam_resolution=self.source_panel.webcam_resolution(), model=self.model,
            retention=self.retention_limits(), keep_sessions=(self.session_folder,),
            session_factory=self.session_factory(cfg))

    def session_factory(self, cfg):
        """LingBot-Map streaming runs (the main one and every second view) open their sessions in
        one engine.shared_streams.StreamHubs: one network in memory, their frames batched by the
        StreamScheduler. None (each run opens its own session) for the other engines."""
        if cfg.engine != "lingbot-map":   # engine.shared_streams imports torch (~0.2 GB RSS): not for these
            return None
        from engine.shared_streams import StreamHubs, shares_model
        if not shares_model(cfg):
            return None
        hubs = self._stream_hubs
        if hubs is None or (hubs.preloaded is not self.model and not hubs.open_streams()):
            hubs = self._stream_hubs = StreamHubs(preloaded=self.model)
        return hubs.open_session

    def start_run(self, start_paused: bool = False) -> bool:
        """Start a fresh run with the current settings (stopping any running one and clearing
        the scene). Returns False (with a message) if the settings are not usable."""
        try:
            opts = self.run_options(start_paused)
        except EngineError as exc:
            self.show_message(str(exc))
            return False
        if not opts.source and opts.source != 0:
            self.show_message("Choose an input first: a video file, an image folder or a webcam")
            return False
        self.stop_run(wait=True)
        if self.banner.label.text() != self.settings_warning:   # a settings warning stays up
            self.banner.hide()
        self.viewer.clear()
        self.preview.clear()
        self.conf_control.reset()
        self.monitors.reset()
        self.review.reset()
        self.viewer.hint.setText("Opening the input…")
        self._noted_next_run = set()
        self._input_warnings = 0
        self.last_stats = {}
        self.last_summary = None
        self.session_folder = None
        self.save_settings()
        h = WorkerHandle(opts, self)
        w = h.worker
        w.opened.connect(self._on_opened)
        w.frameResult.connect(self._on_frames)
        w.stats.connect(self._on_stats)
        w.realigned.connect(self._on_realigned)
        w.message.connect(self._on_worker_message)
        w.warning.connect(self._on_input_warning)
        w.error.connect(self._on_error)
        w.finished.connect(self._on_finished)
        self._handle = self.last_handle = h
        self._update_engine_label()
        self.progress_label.setText("opening… ")
        self.runStarted.emit(w)
        h.start()
        self._set_running(True)
        return True

    def toggle_pause(self) -> None:
        if not self.running:
            return
        w = self._handle.worker
        if w.paused:
            w.resume()
        else:
            w.pause()
        self._set_running(True)

    def step(self) -> None:
        if not self.running:
            if not self.start_run(start_paused=True):
                return
        self._handle.worker.step()
        self._set_running(True)

    def seek_to(self, index: int) -> None:
        if self.running:
            self._handle.worker.seek(int(index))

    def stop_run(self, wait: bool = False, reason: str = "") -> None:
        """Stop the run after the current frame; `reason` (a signal's name) marks its session as
        interrupted rather than stopped by the user."""
        h = self._handle
        if h is None:
            return
        h.worker.stop(reason)
        if wait:
            if not h.stop_and_wait():
                log.warning("engine thread did not stop in time")

    def _is_current(self) -> bool:
        return self._handle is not None and self.sender() is self._handle.worker

    def _set_running(self, running: bool) -> None:
        paused = running and self._handle is not None and self._handle.worker.paused
        self.act_pause.setEnabled(running)
        self.act_pause.setText("Resume" if paused else "Pause")
        self.act_stop.setEnabled(running)
        self.act_seek.setEnabled(not running or bool(self.source_info.get("seekable")))
        can_export = self.session_folder is not None
        for a in self.export_actions.values():
            a.setEnabled(can_export)

    # -- worker signals ------------------------------------------------------------------------
    def _on_opened(self, info: dict) -> None:
        if not self._is_current():
            return
        self.source_info = dict(info)
        self.session_folder = info.get("session")
        self.review.set_session(self.session_folder)
        self.setWindowTitle(f"ReconStudio — {info.get('name', '')}")
        self._set_running(True)

    def _on_frames(self, batch: list) -> None:
        worker = self.sender()
        if not self._is_current():
            return
        for f in batch:
            self.conf_control.add(f.conf)
        if self.review.reviewing:           # the user is scrubbing the timeline: the run goes on
            worker.ack()                    # into the store; "Live" draws it again
            self._status_dirty = True
            return
        self.viewer.add_frames(batch)
        # previews repaint at most PREVIEW_HZ (colour-mapping a depth map costs ~10 ms)
        now = self._clock.elapsed()
        if now - self._last_preview >= 1000 / PREVIEW_HZ or self.preview.shown_index is None:
            self._last_preview = now
            self._preview_backlog = []          # shown now: an older backlog must not replace it at the end
            for f in batch:
                if f.image is not None or f.depth_map is not None:
                    self.preview.show_frame(f)
        else:
            self._preview_backlog = [f for f in batch if f.image is not None or f.depth_map is not None]
        self._apply_threshold()
        worker.ack()
        self._status_dirty = True
        self.framesShown.emit(self.viewer.frame_count)

    def _on_stats(self, stats: dict) -> None:
        if not self._is_current():
            return
        self.last_stats = dict(stats)
        self.monitors.update_stats(stats)
        self._status_dirty = True

    def _on_realigned(self, segment: int, transform, frames=None) -> None:
        if not self._is_current():
            return
        self.viewer.apply_realign(segment, transform, frames)

    def _on_worker_message(self, text: str) -> None:
        if self._is_current():
            self.statusBar().showMessage(text, 8000)
            self.messages.append(("info", text))

    def _on_input_warning(self, text: str) -> None:
        """Input warnings go to the banner (the docs promise it); many in one run (a folder of
        damaged images) show the newest with their count, each kept in `messages`."""
        if not self._is_current():
            return
        self._input_warnings = getattr(self, "_input_warnings", 0) + 1
        n = self._input_warnings
        self.show_message(text if n == 1 else f"{text} ({n} input warnings in this run; all in the log)", "warning")

    def _on_error(self, text: str) -> None:
        if self._is_current():
            self.show_message(text, "error")

    def _on_finished(self, summary: dict) -> None:
        if not self._is_current():
            return
        self.last_summary = dict(summary)
        if not self.review.reviewing:
            for f in self._preview_backlog:          # the last frames' previews
                self.preview.show_frame(f)
        self._preview_backlog = []
        self.review._update_range(follow_end=not self.review.reviewing)
        h = self._handle
        h.thread.wait(5000)          # the run slot has returned; let the thread wind down
        self._handle = None
        self._set_running(False)
        self._update_status()
        state = "error" if summary.get("error") else ("stopped" if summary.get("stopped") else "done")
        self.progress_label.setText(f"{state}: {summary.get('results', 0)} results ")
        self.runFinished.emit(summary)

    # -- status --------------------------------------------------------------------------------
    def _update_engine_label(self) -> None:
        name = self.settings_panel.engine_name()
        try:
            label = engine_capabilities(name).get("label", name)
        except EngineError:
            label = name
        self.st_engine.setText(label)
        self.st_scale.setVisible(name == "geometric")

    def _update_status(self) -> None:
        s = self.last_stats
        kf = s.get("keyframes")
        self.st_frames.setText(f"{self.viewer.frame_count} frames" + (f" · {kf} keyframes" if kf is not None else ""))
        self.st_points.setText(f"{self.drawn_point_count():,} points drawn")
        self.st_points.setToolTip(f"{self.viewer.point_count:,} points loaded; those below the minimum "
                                  "confidence are not drawn")
        self.conf_control.refresh()
        fps = s.get("fps")
        self.st_fps.setText(f"{fps:.1f} fps" if fps else "")
        if self.running:
            n = self.source_info.get("frames") or 0
            done = s.get("frames_in", 0)
            state = "paused" if self._handle.worker.paused else "running"
            dropped = s.get("dropped") or 0     # live frames the engine could not take (never a file's)
            self.progress_label.setText(f"{state}: frame {done}" + (f" / {n}" if n else "")
                                        + (f" · {dropped} dropped" if dropped else "") + " ")
            if self.viewer.frame_count == 0 and done:
                # nothing to draw yet: say what the engine is waiting for
                self.viewer.hint.setText(
                    f"Initialising: {done} frame{'s' if done != 1 else ''} read, no camera pose yet.\n"
                    "The geometric engine needs some sideways camera motion before its first pose;\n"
                    "neural engines return their first results after the scale frames.")
                self.viewer.hint.show()

    def _note_next_run(self, what: str, also: str = "") -> None:
        """Say (once per run) that a changed setting takes effect at the next Start."""
        if not self.running or what in self._noted_next_run:
            return
        self._noted_next_run.add(what)
        self.show_message(f"{what} changed: this applies to the next run (press Start to restart with it)"
                          + (f"; {also}" if also else "") + ".", "info")

    def _refresh_status(self) -> None:
        if self._status_dirty:
            self._status_dirty = False
            self._update_status()

    def _sample_viewer_fps(self) -> None:
        draws = self.viewer.viewer_draws()
        self.viewer_fps = draws - self._last_draws
        self._last_draws = draws
        if self.running:
            self.monitors.update_viewer_fps(self.viewer_fps)
            self._trim_ticks = getattr(self, "_trim_ticks", 0) + 1
            if self._trim_ticks % TRIM_EVERY_S == 0:
                trim_heap()    # hand freed arena pages back: RSS follows what is held (issue #7)

    def gui_stats(self) -> dict:
        """The GUI's own figures for `--stats-csv` (one call per row): viewer redraws in the
        last second, points drawn, GPU bytes of the viewer's vertex buffers, and the p99 gap of
        a 10 ms timer on the GUI thread since the previous call (ms; None on the first call,
        which starts the probe)."""
        if self._gap_probe is None:
            self._gap_probe = LoopGapProbe(self)
            gap = None
        else:
            gap = self._gap_probe.take_p99_ms()
        return {"viewer_fps": float(self.viewer_fps), "viewer_points": int(self.viewer.point_count),
                "viewer_buffer_bytes": int(self.viewer.buffer_bytes), "loop_gap_p99_ms": gap}

    def conf_threshold(self) -> float:
        """The minimum confidence in the engine's absolute units (−inf = show everything)."""
        return self.conf_control.threshold()

    def set_conf_threshold(self, t: float) -> None:
        """Set the minimum confidence (absolute units; None, 0 or −inf = all points)."""
        self.conf_control.set_threshold(t)

    def drawn_point_count(self) -> int:
        """Points the view draws now: those loaded with confidence >= the threshold."""
        from engine.confidence import count_at_least
        return count_at_least(self.viewer.conf_values(), self.conf_threshold())

    def _apply_threshold(self, *_) -> None:
        t = self.conf_threshold()
        self.viewer.set_conf_threshold(t if np.isfinite(t) else -3.0e38)
        self._status_dirty = True

    # -- files ---------------------------------------------------------------------------------
    def _open_video_dialog(self) -> None:
        from .source_panel import VIDEO_FILTER
        p, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Open a video", "", VIDEO_FILTER)
        if p:
            self.set_input(p)

    def _open_folder_dialog(self) -> None:
        p = QtWidgets.QFileDialog.getExistingDirectory(self, "Open an image folder")
        if p:
            self.set_input(p)

    def _open_session_dialog(self) -> None:
        from engine.io.store import default_session_root
        p = QtWidgets.QFileDialog.getExistingDirectory(self, "Open a saved session",
                                                       str(self.session_root or default_session_root()))
        if p:
            self.open_session_folder(p)

    def retention_limits(self) -> tuple:
        """(max_gb, max_age_days) of the sessions folder from the app settings."""
        from engine.io.retention import retention_limits
        return retention_limits(self.settings)

    def sessions_dialog(self):
        """File > Sessions folder: the folder, its size and the retention limits (ui/sessions_dialog.py)."""
        from .sessions_dialog import SessionsDialog
        dlg = SessionsDialog(self, settings=self.settings, root=self.session_root, keep=(self.session_folder,))
        dlg.open()
        return dlg

    def open_session_folder(self, folder: str) -> bool:
        """Show a saved session (engine.io.store.load_session) in the viewer; exports then use it."""
        from engine.io.store import load_session

        from .display import FRUSTUM_FRACTION, make_display_frame
        if self.running:
            self.show_message("Stop the running reconstruction before opening a saved session", "warning")
            return False
        try:
            loaded = load_session(folder)
        except EngineError as exc:
            self.show_message(str(exc))
            return False
        if not loaded.results:
            self.show_message(f"{folder} holds no frames", "warning")
            return False
        self.viewer.clear()
        self.preview.clear()
        self.conf_control.reset()
        stride = self._stored_stride(loaded.results)
        frames, fd = [], None
        for r in loaded.results:
            d = make_display_frame(r, stride, frustum_depth=fd, keep_images=r is loaded.results[-1])
            if fd is None and len(d.depth):
                fd = FRUSTUM_FRACTION * d.median_depth
            frames.append(d)
        self.viewer.apply_events(loaded.events)   # whole-segment and frame-range realigns, in order
        self.viewer.add_frames(frames)
        for d in frames:
            self.conf_control.add(d.conf)
        self.viewer.reset_view()
        self.preview.show_frame(frames[-1])
        self._apply_threshold()
        self.session_folder = str(loaded.folder)
        self.review.set_session(self.session_folder)
        for p in loaded.problems:
            self.messages.append(("warning", p))
        note = f" — cut short: {loaded.cut_short}" if loaded.cut_short else ""
        self.show_message(f"Opened session {loaded.folder.name}: {len(frames)} frames{note}",
                          "warning" if loaded.cut_short else "info")
        self.settings_panel.set_config(loaded.config)
        self._update_engine_label()
        self._set_running(False)
        self._update_status()
        return True

    def _stored_stride(self, stored: list, stride: Optional[int] = None) -> int:
        """The subsampling step at the session store's (smaller) resolution that keeps about
        the density the user chose for live frames."""
        stride = int(self.stride.value()) if stride is None else int(stride)
        live_w = self.viewer.result_width
        if not stored or not live_w:
            return stride
        stored_w = np.asarray(stored[0].image).shape[1]
        return max(1, round(stride * stored_w / live_w))

    def export_dialog(self, kind: str) -> None:
        from engine.io.export import EXPORT_FORMATS
        if kind == "colmap":
            p = QtWidgets.QFileDialog.getExistingDirectory(
                self, "Export a COLMAP model into a folder (images/ and sparse/0/ are created)")
        else:
            suffix = {"ply": ".ply", "npz": ".npz", "tum": ".txt", "glb": ".glb"}[kind]
            p, _ = QtWidgets.QFileDialog.getSaveFileName(self, f"Export {kind.upper()}", "reconstruction" + suffix,
                                                         EXPORT_FORMATS[kind])
        if p:
            self.export(kind, p, background=True)

    def export_options(self) -> dict:
        """The options every export takes from the view: the absolute confidence threshold,
        the Subsample stride (in result pixels, as the viewer draws) and, while the timeline
        shows an earlier frame, that frame as the last one exported."""
        t = self.conf_threshold()
        opts = {"conf_threshold": t if np.isfinite(t) else -np.inf, "stride": int(self.stride.value()),
                "result_width": self.viewer.result_width or None}
        if self.review.reviewing and self.review.shown_upto is not None:
            opts["until"] = self.review.shown_upto     # the session up to the timeline position
        return opts

    def _confirm_sparse_export(self, kind: str) -> bool:
        """Ask before writing an export that would keep almost nothing of what was loaded
        (engine.io.export.almost_nothing on the viewer's own counts: no file is read)."""
        from engine.io.export import almost_nothing
        if kind == "tum":
            return True
        total = self.viewer.point_count
        if not total:
            return True
        warning = almost_nothing(self.drawn_point_count(), total)
        if warning is None:
            return True
        answer = QtWidgets.QMessageBox.question(
            self, "Export almost nothing?",
            f"At this threshold {warning}.\nLower the confidence threshold to export more.\n\n"
            "Write the export anyway?",
            QtWidgets.QMessageBox.StandardButton.Yes | QtWidgets.QMessageBox.StandardButton.No,
            QtWidgets.QMessageBox.StandardButton.No)
        if answer != QtWidgets.QMessageBox.StandardButton.Yes:
            self.show_message(f"Export not written: {warning}", "warning")
            return False
        return True

    def export(self, kind: str, path: str, background: bool = False) -> Optional[dict]:
        """Export the current session in one of engine.io.export.EXPORT_FORMATS (ply, npz, tum,
        colmap = a folder, glb) through export_results, with the view's threshold and Subsample.
        Returns its summary; with background=True the export runs on a thread (the window stays
        live), returns None and `exportFinished` carries the summary (None on failure)."""
        from engine.io.export import EXPORT_FORMATS
        if kind not in EXPORT_FORMATS:
            raise ValueError(kind)
        if not self.session_folder:
            self.show_message("Nothing to export yet: run a reconstruction or open a saved session", "warning")
            return None
        if not self._confirm_sparse_export(kind):
            return None
        folder, opts = self.session_folder, self.export_options()

        def job() -> dict:
            from engine.io.export import export_results
            return export_results(folder, {kind: path}, **opts)     # streamed from the folder

        def report(out: Optional[dict], error: Optional[str]) -> None:
            if error:
                self.show_message(error)
            elif out.get("warning") and kind != "tum":
                self.show_message(f"Exported {out['frames']} frames, {out['points']:,} points to {path}, "
                                  f"but {out['warning']}", "warning")
            else:
                self.show_message(f"Exported {out['frames']} frames"
                                  + (f", {out['points']:,} points" if kind != "tum" else "") + f" to {path}", "info")
            self.exportFinished.emit(out)

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
        self.statusBar().showMessage(f"Exporting {kind.upper()} to {path}…")

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
        if path is None:
            path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Save screenshot", "reconstudio.png", "PNG (*.png)")
            if not path:
                return None
        try:
            self.viewer.screenshot(path)
        except OSError as exc:
            self.show_message(str(exc))
            return None
        self.statusBar().showMessage(f"Screenshot saved to {path}", 5000)
        return path

    # -- second source (ui/second_view.py) ------------------------------------------------------
    def _open_second_dialog(self) -> None:
        from .second_view import SourceDialog
        dlg = SourceDialog(self)
        if dlg.exec() == QtWidgets.QDialog.DialogCode.Accepted:
            self.open_second_source(dlg.panel.spec(), webcam_resolution=dlg.panel.webcam_resolution())

    def open_second_source(self, spec, webcam_resolution=None):
        """Run `spec` (a path or "webcam:N") in a second view with the current engine settings:
        its own worker, session folder and monitors line; the running stream is not touched.
        Returns the StreamView, or None (with a message) when the settings are not usable."""
        from .second_view import StreamDock, StreamView, source_title
        if spec is None or (isinstance(spec, str) and not spec.strip()):
            self.show_message("Choose the second source first: a video file, an image folder or a webcam", "warning")
            return None
        try:
            cfg = self.settings_panel.config()
        except EngineError as exc:
            self.show_message(str(exc))
            return None
        if "intrinsics" in engine_capabilities(cfg.engine).get("fields", []):
            attach_found_intrinsics(cfg, spec)
        keep = tuple(f for f in (self.session_folder, *(v.session_folder for v in self.second_views)) if f)
        opts = RunOptions(source=spec, config=cfg, session_root=self.session_root,
                          speed=float(self.speed.currentData()), loop=self.loop.isChecked(),
                          max_frames=int(self.max_frames.value()) or None,
                          display_stride=int(self.stride.value()), webcam_resolution=webcam_resolution,
                          model=None, retention=None, keep_sessions=keep,
                          session_factory=self.session_factory(cfg))   # LingBot-Map: the shared network
        view = StreamView(opts, f"Second view — {source_title(spec)}")
        dock = StreamDock(view, self)
        view.failed.connect(lambda text, v=view: self.show_message(f"{v.title}: {text}", "error"))
        view.warned.connect(lambda text, v=view: self.show_message(f"{v.title}: {text}", "warning"))
        dock.closed.connect(self._second_closed)
        self.addDockWidget(QtCore.Qt.DockWidgetArea.RightDockWidgetArea, dock)
        if not self.second_views:              # the first one: ~40 % of the width, the controls keep theirs
            self.resizeDocks([dock], [int(self.width() * 0.4)], QtCore.Qt.Orientation.Horizontal)
        self.second_views.append(view)
        view.start()
        return view

    def _second_closed(self, dock) -> None:
        if dock.view in self.second_views:
            self.second_views.remove(dock.view)
        dock.deleteLater()

    # -- drag and drop -------------------------------------------------------------------------
    def dragEnterEvent(self, e: QtGui.QDragEnterEvent) -> None:
        if e.mimeData().hasUrls():
            e.acceptProposedAction()

    def dropEvent(self, e: QtGui.QDropEvent) -> None:
        urls = [u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()]
        if not urls:
            return
        p = urls[0]
        if os.path.isdir(p) and (Path(p) / "config.json").exists() and (Path(p) / "frames").is_dir():
            self.open_session_folder(p)
        else:
            self.set_input(p)
            self.show_message(f"Input: {p} — press Start", "info")
        e.acceptProposedAction()

    # -- shutdown ------------------------------------------------------------------------------
    def closeEvent(self, e: QtGui.QCloseEvent) -> None:
        self.save_settings()
        for view in list(self.second_views):       # second streams end with the window
            view.shutdown(wait=True)
        self.stop_run(wait=True)
        self.review.reset()                        # a closed window holds no session folder open
        self._fps_timer.stop()
        if self._gc_held:
            self._gc_held = False
            gc_guard.release()
        super().closeEvent(e)

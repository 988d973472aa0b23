"""Runs of the main window: start / pause / step / seek / stop, the engine worker's signals on
the GUI thread, second sources, and the run's lines in the status bar.

The controller owns the run state (the worker handle, the last summary and stats, the source's
info, the shared LingBot-Map network); the window only lays out the widgets it drives. Workers are
started as ui/worker.py defines them (RunOptions + WorkerHandle).
"""
from __future__ import annotations

import logging
from typing import Optional

from PySide6 import QtCore, QtWidgets

from engine.api import EngineError, engine_capabilities
from engine.intrinsics import attach_found_intrinsics
from engine.memory import trim_heap

from .stats_feed import LoopGapProbe
from .worker import RunOptions, WorkerHandle

log = logging.getLogger(__name__)

PREVIEW_HZ = 5.0
TRIM_EVERY_S = 5             # seconds of a run between malloc_trim calls (engine/memory.py)
OPENING_HINT = "Opening the input…"


class RunController(QtCore.QObject):
    runStarted = QtCore.Signal(object)       # the new run's EngineWorker (before its thread starts)
    runFinished = QtCore.Signal(object)      # the worker's summary dict
    framesShown = QtCore.Signal(int)         # frames in the viewer so far
    stateChanged = QtCore.Signal()           # running / paused / session changed: actions follow

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.handle: Optional[WorkerHandle] = None
        self.last_handle: Optional[WorkerHandle] = None
        self.last_summary: Optional[dict] = None
        self.last_stats: dict = {}
        self.source_info: dict = {}
        self.model = None                              # a preloaded network (optional)
        self.second_views: list = []                   # open ui.second_view.StreamView docks' views
        self.stream_hubs = None                        # engine.shared_streams.StreamHubs (LingBot-Map runs)
        self._noted_next_run: set = set()              # settings already said to apply next run
        self._input_warnings = 0
        self._clock = QtCore.QElapsedTimer()
        self._clock.start()
        self._last_preview = -1e9
        self._preview_backlog: list = []
        self.viewer_fps = 0
        self._last_draws = 0
        self._trim_ticks = 0
        self._gap_probe: Optional[LoopGapProbe] = None    # started by the first gui_stats()
        self._fps_timer = QtCore.QTimer(self, interval=1000, timeout=self._sample_viewer_fps)
        self._fps_timer.start()

    # -- state --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.handle is not None and self.handle.is_running()

    @property
    def paused(self) -> bool:
        return self.running and self.handle.worker.paused

    def _is_current(self) -> bool:
        return self.handle is not None and self.sender() is self.handle.worker

    # -- options ------------------------------------------------------------------------------
    def _config(self, spec):
        cfg = self.win.settings_panel.config()
        if "intrinsics" in engine_capabilities(cfg.engine).get("fields", []):
            attach_found_intrinsics(cfg, spec)      # intrinsics.txt beside the input, as the CLI does
        return cfg

    def run_options(self, start_paused: bool = False) -> RunOptions:
        w = self.win
        spec = w.source_panel.spec()
        cfg = self._config(spec)
        return RunOptions(
            source=spec, config=cfg, session_root=w.session_root,
            speed=float(w.speed.currentData()), loop=w.loop.isChecked(),
            start_frame=int(w.seek_spin.value()), max_frames=int(w.max_frames.value()) or None,
            start_paused=start_paused, display_stride=int(w.stride.value()),
            webcam_resolution=w.source_panel.webcam_resolution(), model=self.model,
            retention=w.sessions.retention_limits(), keep_sessions=(w.session_folder,),
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
        hubs = self.stream_hubs
        if hubs is None or (hubs.preloaded is not self.model and not hubs.open_streams()):
            hubs = self.stream_hubs = StreamHubs(preloaded=self.model)
        return hubs.open_session

    # -- control ------------------------------------------------------------------------------
    def start(self, start_paused: bool = False) -> bool:
        """Start a fresh run with the current settings (stopping any running one and clearing
        the scene). Returns False (with a message) if the settings are not usable."""
        w = self.win
        try:
            opts = self.run_options(start_paused)
        except EngineError as exc:
            w.show_message(str(exc))
            return False
        if not opts.source and opts.source != 0:
            w.show_message("Choose an input first: a video file, an image folder or a webcam")
            return False
        self.stop(wait=True)
        w.hide_banner_for_run()
        w.clear_view()
        w.monitors.reset()
        w.viewer.hint.setText(OPENING_HINT)
        self._noted_next_run = set()
        self._input_warnings = 0
        self.last_stats = {}
        self.last_summary = None
        w.sessions.forget()
        w.save_settings()
        h = WorkerHandle(opts, self)
        wk = h.worker
        wk.opened.connect(self._on_opened)
        wk.frameResult.connect(self._on_frames)
        wk.stats.connect(self._on_stats)
        wk.realigned.connect(self._on_realigned)
        wk.message.connect(self._on_worker_message)
        wk.warning.connect(self._on_input_warning)
        wk.error.connect(self._on_error)
        wk.finished.connect(self._on_finished)
        self.handle = self.last_handle = h
        w.update_engine_label()
        w.progress_label.setText("opening… ")
        self.runStarted.emit(wk)
        h.start()
        self.stateChanged.emit()
        return True

    def toggle_pause(self) -> None:
        if not self.running:
            return
        wk = self.handle.worker
        wk.resume() if wk.paused else wk.pause()
        self.stateChanged.emit()

    def step(self) -> None:
        if not self.running and not self.start(start_paused=True):
            return
        self.handle.worker.step()
        self.stateChanged.emit()

    def seek_to(self, index: int) -> None:
        if self.running:
            self.handle.worker.seek(int(index))

    def stop(self, wait: bool = False, reason: str = "") -> None:
        """Stop the run after the current frame; `reason` (a signal's name) marks its session as
        interrupted rather than stopped by the user."""
        h = self.handle
        if h is None:
            return
        h.worker.stop(reason)
        if wait and not h.stop_and_wait():
            log.warning("engine thread did not stop in time")

    def note_next_run(self, what: str, also: str = "") -> None:
        """Say (once per run) that a changed setting takes effect at the next Start."""
        if not self.running or what in self._noted_next_run:
            return
        self._noted_next_run.add(what)
        self.win.show_message(f"{what} changed: this applies to the next run (press Start to restart with it)"
                              + (f"; {also}" if also else "") + ".", "info")

    # -- worker signals -----------------------------------------------------------------------
    def _on_opened(self, info: dict) -> None:
        if not self._is_current():
            return
        self.source_info = dict(info)
        self.win.sessions.folder = info.get("session")
        self.win.reviews.set_session(self.win.session_folder)
        self.win.setWindowTitle(f"ReconStudio — {info.get('name', '')}")
        self.stateChanged.emit()

    def _on_frames(self, batch: list) -> None:
        worker = self.sender()
        if not self._is_current():
            return
        w = self.win
        for f in batch:
            w.conf_control.add(f.conf)
        if w.reviews.reviewing:             # the user is scrubbing the timeline: the run goes on
            worker.ack()                    # into the store; "Live" draws it again
            w.status_dirty()
            return
        w.viewer.add_frames(batch)
        # previews repaint at most PREVIEW_HZ: colour-mapping a depth map runs on the GUI thread,
        # too much work to repeat for every result
        now = self._clock.elapsed()
        if now - self._last_preview >= 1000 / PREVIEW_HZ or w.preview.shown_index is None:
            self._last_preview = now
            self._preview_backlog = []          # shown now: an older backlog must not replace it at the end
            for f in batch:
                if f.image is not None or f.depth_map is not None:
                    w.preview.show_frame(f)
        else:
            self._preview_backlog = [f for f in batch if f.image is not None or f.depth_map is not None]
        w.display.apply_threshold()
        worker.ack()
        w.status_dirty()
        self.framesShown.emit(w.viewer.frame_count)

    def _on_stats(self, stats: dict) -> None:
        if not self._is_current():
            return
        self.last_stats = dict(stats)
        self.win.monitors.update_stats(stats)
        self.win.status_dirty()

    def _on_realigned(self, segment: int, transform, frames=None) -> None:
        if self._is_current():
            self.win.viewer.apply_realign(segment, transform, frames)

    def _on_worker_message(self, text: str) -> None:
        if self._is_current():
            self.win.statusBar().showMessage(text, 8000)
            self.win.messages.append(("info", text))

    def _on_input_warning(self, text: str) -> None:
        """Input warnings go to the banner (the docs promise it); many in one run (a folder of
        damaged images) show the newest with their count, each kept in `messages`."""
        if not self._is_current():
            return
        self._input_warnings += 1
        n = self._input_warnings
        self.win.show_message(text if n == 1 else f"{text} ({n} input warnings in this run; all in the log)",
                              "warning")

    def _on_error(self, text: str) -> None:
        if not self._is_current():
            return
        self.win.show_message(text, "error")
        if self.win.viewer.frame_count == 0:        # the view must not go on saying "Opening the input…"
            self.win.viewer.hint.setText(f"The run stopped with an error:\n{text}\n\n"
                                         "Fix the input or the settings, then press Start.")
            self.win.viewer.hint.show()

    def _on_finished(self, summary: dict) -> None:
        if not self._is_current():
            return
        w = self.win
        self.last_summary = dict(summary)
        if not w.reviews.reviewing:
            for f in self._preview_backlog:          # the last frames' previews
                w.preview.show_frame(f)
        self._preview_backlog = []
        w.reviews.run_finished()
        h = self.handle
        h.thread.wait(5000)          # the run slot has returned; let the thread wind down
        self.handle = None
        self.stateChanged.emit()
        w.update_status()
        if w.viewer.frame_count == 0 and w.viewer.hint.text() == OPENING_HINT:
            w.viewer.hint.setText("The run ended before the engine returned a result.")   # stopped early
        state = "error" if summary.get("error") else ("stopped" if summary.get("stopped") else "done")
        w.progress_label.setText(f"{state}: {summary.get('results', 0)} results ")
        self.runFinished.emit(summary)

    # -- status -------------------------------------------------------------------------------
    def progress_text(self) -> Optional[str]:
        """The transport bar's progress while a run goes on (None when idle)."""
        if not self.running:
            return None
        s = self.last_stats
        n = self.source_info.get("frames") or 0
        done = s.get("frames_in", 0)
        dropped = s.get("dropped") or 0     # live frames the engine could not take (never a file's)
        return (f"{'paused' if self.paused else 'running'}: frame {done}" + (f" / {n}" if n else "")
                + (f" · {dropped} dropped" if dropped else "") + " ")

    def waiting_hint(self) -> Optional[str]:
        """What the empty view says while frames are read but no pose came back yet."""
        done = self.last_stats.get("frames_in", 0)
        if not self.running or self.win.viewer.frame_count or not done:
            return None
        head = f"Initialising: {done} frame{'s' if done != 1 else ''} read, no camera pose yet.\n"
        held = self.last_stats.get("self_calibrating_frames") or 0
        if held:
            return (head + f"No intrinsics were given: the focal length is being measured from the first "
                    f"frames ({held} held).\nGive an intrinsics file in the settings to start at once.")
        return (head + "The geometric engine needs some sideways camera motion before its first pose;\n"
                "neural engines return their first results after the scale frames.")

    def _sample_viewer_fps(self) -> None:
        draws = self.win.viewer.viewer_draws()
        self.viewer_fps = draws - self._last_draws
        self._last_draws = draws
        if self.running:
            self.win.monitors.update_viewer_fps(self.viewer_fps)
            self._trim_ticks += 1
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
        v = self.win.viewer
        return {"viewer_fps": float(self.viewer_fps), "viewer_points": int(v.point_count),
                "viewer_buffer_bytes": int(v.buffer_bytes), "loop_gap_p99_ms": gap}

    def shutdown(self) -> None:
        for view in list(self.second_views):       # second streams end with the window
            view.shutdown(wait=True)
        self.stop(wait=True)
        self._fps_timer.stop()

    # -- second source (ui/second_view.py) ----------------------------------------------------
    def open_second_dialog(self) -> None:
        from .second_view import SourceDialog
        dlg = SourceDialog(self.win)
        if dlg.exec() == QtWidgets.QDialog.DialogCode.Accepted:
            self.open_second_source(dlg.panel.spec(), webcam_resolution=dlg.panel.webcam_resolution())

    def open_second_source(self, spec, webcam_resolution=None):
        """Run `spec` (a path or "webcam:N") in a second view with the current engine settings:
        its own worker, session folder and monitors line; the running stream is not touched.
        Returns the StreamView, or None (with a message) when the settings are not usable."""
        from .second_view import StreamDock, StreamView, source_title
        w = self.win
        if spec is None or (isinstance(spec, str) and not spec.strip()):
            w.show_message("Choose the second source first: a video file, an image folder or a webcam", "warning")
            return None
        try:
            cfg = self._config(spec)
        except EngineError as exc:
            w.show_message(str(exc))
            return None
        keep = tuple(f for f in (w.session_folder, *(v.session_folder for v in self.second_views)) if f)
        opts = RunOptions(source=spec, config=cfg, session_root=w.session_root,
                          speed=float(w.speed.currentData()), loop=w.loop.isChecked(),
                          max_frames=int(w.max_frames.value()) or None,
                          display_stride=int(w.stride.value()), webcam_resolution=webcam_resolution,
                          model=None, retention=None, keep_sessions=keep,
                          session_factory=self.session_factory(cfg))   # LingBot-Map: the shared network
        view = StreamView(opts, f"Second view — {source_title(spec)}")
        dock = StreamDock(view, w)
        view.failed.connect(lambda text, v=view: w.show_message(f"{v.title}: {text}", "error"))
        view.warned.connect(lambda text, v=view: w.show_message(f"{v.title}: {text}", "warning"))
        dock.closed.connect(self._second_closed)
        w.addDockWidget(QtCore.Qt.DockWidgetArea.RightDockWidgetArea, dock)
        if not self.second_views:              # the first one: ~40 % of the width, the controls keep theirs
            w.resizeDocks([dock], [int(w.width() * 0.4)], QtCore.Qt.Orientation.Horizontal)
        self.second_views.append(view)
        view.start()
        return view

    def _second_closed(self, dock) -> None:
        if dock.view in self.second_views:
            self.second_views.remove(dock.view)
        dock.deleteLater()

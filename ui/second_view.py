"""A second source in a second view: its own engine worker, session folder, 3D view and monitors line.

The main window's File > "Open second source…" (and `MainWindow.open_second_source`) opens a
`StreamView` in a dock beside the main view. The stream runs in its own `EngineWorker` (ui/worker.py)
with the main window's engine settings: its own engine session, its own session store folder, its
own display packets. The first stream is never touched: an input that cannot be opened (a missing
webcam, an unreadable video) ends only this stream, with its message in the view's own line and in
the main window's banner. Closing the dock stops only this stream; its session stays on disk.

A LingBot-Map second stream shares the main run's network: both open their sessions through the
window's `engine.shared_streams.StreamHubs`, so one model is loaded and the StreamScheduler
batches their streamed frames into one forward (docs/multi.md). Other neural engines (VGGT) load
their own network per stream; the geometric engine simply runs a second session.
"""
from __future__ import annotations

import logging
from typing import Optional

from PySide6 import QtCore, QtWidgets

from .viewer import PointCloudViewer
from .worker import RunOptions, WorkerHandle

log = logging.getLogger(__name__)


class StreamView(QtWidgets.QWidget):
    """One extra stream: worker + 3D view + input preview + one monitors line (engine FPS,
    viewer FPS, frames, latency, session folder)."""

    runFinished = QtCore.Signal(object)      # the worker's summary dict
    framesShown = QtCore.Signal(int)         # frames in this view so far
    failed = QtCore.Signal(str)              # a user-facing error of this stream
    warned = QtCore.Signal(str)              # an input warning of this stream (truncated, skipped)

    def __init__(self, options: RunOptions, title: str, parent: Optional[QtWidgets.QWidget] = None):
        super().__init__(parent)
        from .image_preview import ImagePreview   # the same preview panes as the main view
        self.options = options
        self.title = title
        self.viewer = PointCloudViewer(capacity=1 << 18)
        self.viewer.hint.setText("Opening the input…")
        self.preview = ImagePreview()
        self.preview.setMinimumWidth(120)
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        split.addWidget(self.viewer)
        split.addWidget(self.preview)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        self.monitor_line = QtWidgets.QLabel("opening…")
        self.monitor_line.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        self.monitor_line.setWordWrap(True)
        self.stop_button = QtWidgets.QPushButton("Stop")
        self.stop_button.setToolTip("Stop this stream only (its session stays saved)")
        self.stop_button.clicked.connect(lambda: self.stop())
        bottom = QtWidgets.QHBoxLayout()
        bottom.addWidget(self.monitor_line, 1)
        bottom.addWidget(self.stop_button)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(split, 1)
        lay.addLayout(bottom)

        self.session_folder: Optional[str] = None
        self.source_info: dict = {}
        self.last_stats: dict = {}
        self.last_summary: Optional[dict] = None
        self.error: Optional[str] = None
        self.viewer_fps = 0
        self._last_draws = 0
        self._handle: Optional[WorkerHandle] = None
        self._fps_timer = QtCore.QTimer(self, interval=1000, timeout=self._sample_viewer_fps)
        self._fps_timer.start()

    # -- run ------------------------------------------------------------------------------------
    def start(self) -> None:
        h = WorkerHandle(self.options, self)
        w = h.worker
        w.opened.connect(self._on_opened)
        w.frameResult.connect(self._on_frames)
        w.stats.connect(self._on_stats)
        w.realigned.connect(lambda seg, T, frames: self.viewer.apply_realign(seg, T, frames))
        w.error.connect(self._on_error)
        w.warning.connect(self.warned)
        w.finished.connect(self._on_finished)
        self._handle = h
        h.start()

    @property
    def running(self) -> bool:
        return self._handle is not None and self._handle.is_running()

    @property
    def worker(self):
        return None if self._handle is None else self._handle.worker

    def stop(self, wait: bool = False) -> bool:
        """Stop this stream (the current push finishes first). wait=True blocks until its thread
        has ended; returns False if it did not end in time."""
        h = self._handle
        if h is None:
            return True
        h.worker.stop()
        return h.stop_and_wait() if wait else True

    # -- worker signals -------------------------------------------------------------------------
    def _on_opened(self, info: dict) -> None:
        self.source_info = dict(info)
        self.session_folder = info.get("session")
        self._update_line()

    def _on_frames(self, batch: list) -> None:
        worker = self.sender()
        self.viewer.add_frames(batch)
        for f in reversed(batch):            # the newest frame that carries a preview
            if f.image is not None or f.depth_map is not None:
                self.preview.show_frame(f)
                break
        if worker is not None:
            worker.ack()
        self.framesShown.emit(self.viewer.frame_count)

    def _on_stats(self, stats: dict) -> None:
        self.last_stats = dict(stats)
        self._update_line()

    def _on_error(self, text: str) -> None:
        self.error = text
        self.viewer.hint.setText(f"This stream stopped:\n{text}")
        self.viewer.hint.show()
        self.failed.emit(text)

    def _on_finished(self, summary: dict) -> None:
        self.last_summary = dict(summary)
        h = self._handle
        if h is not None:
            h.thread.wait(5000)              # the run slot has returned; let the thread wind down
        self.stop_button.setEnabled(False)
        self._update_line()
        self.runFinished.emit(summary)

    def _sample_viewer_fps(self) -> None:
        draws = self.viewer.viewer_draws()
        self.viewer_fps = draws - self._last_draws
        self._last_draws = draws
        if self.running:
            self._update_line()

    def monitor_text(self) -> str:
        """The monitors line: state, engine and viewer FPS, frames, latency, session folder."""
        s, parts = self.last_stats, []
        if self.last_summary is not None:
            sm = self.last_summary
            parts.append("error" if sm.get("error") else ("stopped" if sm.get("stopped") else "done"))
        else:
            parts.append("running" if self.running else "opening")
        fps = s.get("fps")
        parts.append(f"engine {fps:.1f} fps" if fps else "engine – fps")
        parts.append(f"viewer {self.viewer_fps} fps")
        parts.append(f"{self.viewer.frame_count} frames")
        lat = s.get("latency_ms")
        if lat:
            parts.append(f"{lat:.0f} ms/push")
        dropped = s.get("dropped")
        if dropped:
            parts.append(f"{dropped} dropped")
        if self.session_folder:
            parts.append(f"session {self.session_folder}")
        return " · ".join(parts)

    def _update_line(self) -> None:
        self.monitor_line.setText(self.monitor_text())
        if self.error:
            self.monitor_line.setToolTip(self.error)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the stream and the timers (the dock is closing)."""
        self._fps_timer.stop()
        self.stop(wait=wait)


class StreamDock(QtWidgets.QDockWidget):
    """The dock holding a StreamView; closing it stops only that stream."""

    closed = QtCore.Signal(object)           # self

    def __init__(self, view: StreamView, parent: Optional[QtWidgets.QWidget] = None):
        super().__init__(view.title, parent)
        self.view = view
        self.setObjectName(f"stream-view-{id(self):x}")
        self.setWidget(view)
        self.setFeatures(QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetClosable
                         | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QtWidgets.QDockWidget.DockWidgetFeature.DockWidgetFloatable)

    def closeEvent(self, e) -> None:
        # stop only this stream; wait for its thread (the current push) so nothing outlives the dock
        if not self.view.stop(wait=True):
            log.warning("second view %r: engine thread did not stop in time", self.view.title)
        self.view.shutdown(wait=False)
        super().closeEvent(e)
        self.closed.emit(self)


class SourceDialog(QtWidgets.QDialog):
    """Choose the second source: the same video / folder / webcam choices as the main panel."""

    def __init__(self, parent: Optional[QtWidgets.QWidget] = None):
        super().__init__(parent)
        from .source_panel import SourcePanel
        self.setWindowTitle("Open a second source")
        self.panel = SourcePanel()
        lay = QtWidgets.QVBoxLayout(self)
        note = QtWidgets.QLabel("The second source runs with the current engine settings, in its own "
                                "view and session folder. The first stream keeps running.")
        note.setWordWrap(True)
        lay.addWidget(note)
        lay.addWidget(self.panel)
        buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.StandardButton.Open
                                             | QtWidgets.QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)


def source_title(spec) -> str:
    """A short dock title for a source spec."""
    import os
    s = str(spec)
    if s.lower().startswith("webcam:"):
        return f"Webcam {s.split(':', 1)[1]}"
    return os.path.basename(s.rstrip("/\\")) or s

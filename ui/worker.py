"""The engine worker: runs a reconstruction off the GUI thread and reports over Qt signals.

`EngineWorker` is a QObject moved to a QThread (see `WorkerHandle`). Its `run` slot opens the
source, the engine session (through the stream layer, engine/shared_streams.py, as `reconstudio run`
does) and the session store (its bounded background writer), then hands them to the one run loop,
`engine.run_driver.RunDriver`, with two sinks: the store (EVERY result) and
the display sink here, which converts results to display packets and emits them. Display packets
are coalesced to the display rate (~30 Hz) and only sent when the GUI has taken the previous batch
(`ack`), so a slow viewer receives bigger, rarer batches; when `max_pending` packets wait for it
the engine waits too (a live source then drops frames, counted, instead of building latency).
Control methods (pause / resume / step / seek / stop) are called from the GUI thread and only set
flags of the driver's `RunControl`, so they return at once.
"""
from __future__ import annotations

import errno
import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

from PySide6 import QtCore

from engine.api import EngineError, SessionConfig
from engine.run_driver import Controls, RunControl, RunDriver, Sink, StoreSink

from .display import FRUSTUM_FRACTION, depth_colours, make_display_frame
from .settings_schema import default as display_default

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """What one run needs. `speed`: 0 = as fast as possible, 1 = real time, N = N× real time."""

    source: Any                                  # path, webcam index or "webcam:N"
    config: SessionConfig = field(default_factory=SessionConfig)
    session_dir: Optional[str] = None            # exact folder; None = new folder under session_root
    session_root: Optional[str] = None           # None = engine.io.store.default_session_root()
    speed: float = 0.0
    loop: bool = False
    start_frame: int = 0
    max_frames: Optional[int] = None             # stop after this many input frames
    start_paused: bool = False
    display_stride: int = field(default_factory=lambda: display_default("display/stride"))   # viewer subsampling
    display_hz: float = 30.0
    stats_hz: float = 4.0
    webcam_resolution: Optional[tuple] = None    # (w, h) requested from a webcam
    model: Any = None                            # a loaded network for neural engines (optional)
    max_pending: int = 32                        # display packets waiting for the GUI before the engine waits
    retention: Optional[tuple] = None            # (max_gb, max_age_days) applied to session_root first
    keep_sessions: tuple = ()                    # session folders retention must not delete (e.g. shown)
    store_queue: int = 4                         # frames waiting for the session store's writer thread
    session_factory: Any = None                  # (config, source) -> session; None = a StreamHubs of its own


class _DisplaySink(Sink):
    """Turns results into display packets, coalesced to the display rate and sent only when the
    GUI has taken the previous batch (`ack`): a slow viewer gets bigger, rarer batches. When
    `max_pending` packets wait for a GUI that has not caught up, the engine waits (backpressure:
    the packets never pile up without bound), and a live source drops frames instead."""

    def __init__(self, worker: "EngineWorker"):
        self.w = worker
        self.pending: list = []
        self.last_emit = 0.0
        self.frustum_depth: Optional[float] = None

    def on_results(self, results) -> None:
        o = self.w.options
        for r in results:
            self.w.results_total += 1
            # frustums keep the size set by the first frame with depth (one scene scale)
            d = make_display_frame(r, o.display_stride, frustum_depth=self.frustum_depth)
            if self.frustum_depth is None and len(d.depth):
                self.frustum_depth = FRUSTUM_FRACTION * d.median_depth
            # previews: only the newest image and the newest depth map of a batch travel
            if self.pending:
                prev = self.pending[-1]
                prev.image = None
                if d.depth_map is not None:
                    for p in self.pending:
                        p.depth_map = p.conf_map = p.depth_rgb = None
            self.pending.append(d)
        self.flush()
        if len(self.pending) >= o.max_pending and self.w.driver is not None:
            # the GUI is behind by max_pending frames: wait for it (never for longer than a stop)
            self.w.driver.wait_while(lambda: not self.gui_ready())
            self.flush()

    def on_event(self, e) -> None:
        if e.kind == "realign" and e.transform is not None:
            frames = getattr(e, "frames", None)     # a frame range (loop closure) or None = all
            self.w.realigned.emit(int(e.segment), e.transform,
                                  None if frames is None else (int(frames[0]), int(frames[1])))
        elif e.message:
            self.w.message.emit(e.message)

    def on_message(self, text) -> None:
        # the source's own warnings (a truncated video, a skipped image) are the user's to see
        source = self.w.driver.source if self.w.driver is not None else None
        if text in (getattr(source, "warnings", None) or ()):
            self.w.warning.emit(text)
        else:
            self.w.message.emit(text)

    def on_stats(self, stats) -> None:
        self.w.stats.emit(stats)

    def on_idle(self) -> None:
        self.flush(force=self.w.paused)

    def gui_ready(self) -> bool:
        return self.w._emitted - self.w._acked <= 0

    def flush(self, force: bool = False) -> None:
        if not self.pending:
            return
        now = time.perf_counter()
        if force or (self.gui_ready() and now - self.last_emit >= 1.0 / self.w.options.display_hz):
            pending, self.pending = self.pending, []
            for d in pending:                   # at most one depth map a batch: coloured here
                if d.depth_map is not None and d.depth_rgb is None:
                    d.depth_rgb = depth_colours(d.depth_map)
            self.last_emit = now
            self.w._emitted += 1
            self.w.frameResult.emit(pending)


def disk_full(exc: BaseException) -> bool:
    """Whether a store failure is a full disk: engine.io.store.DiskFullError where it exists,
    else ENOSPC in the exception chain or its message (StoreError carries the OS text)."""
    from engine.io import store
    cls = getattr(store, "DiskFullError", None)
    e: Optional[BaseException] = exc
    while e is not None:
        if (cls is not None and isinstance(e, cls)) or getattr(e, "errno", None) == errno.ENOSPC:
            return True
        e = e.__cause__ or e.__context__
    text = str(exc).lower()
    return "no space left" in text or "disk full" in text or os.strerror(errno.ENOSPC).lower() in text


class EngineWorker(QtCore.QObject, Controls):
    frameResult = QtCore.Signal(object)      # list[DisplayFrame], coalesced
    stats = QtCore.Signal(object)            # dict: session.stats() + run counters
    realigned = QtCore.Signal(int, object, object)   # segment, 4x4 similarity (absolute), frames (first, last) | None
    message = QtCore.Signal(str)             # info text for the status bar
    warning = QtCore.Signal(str)             # an input warning (truncated video, skipped image): the banner
    error = QtCore.Signal(str)               # user-facing failure; the run ends
    opened = QtCore.Signal(object)           # dict: source name, kind, frames, fps, session folder
    finished = QtCore.Signal(object)         # dict summary (always emitted, exactly once)

    def __init__(self, options: RunOptions):
        super().__init__()
        self.options = options
        self.control = RunControl(start_paused=bool(options.start_paused))
        self.driver: Optional[RunDriver] = None
        self._emitted = 0          # display batches sent
        self._acked = 0            # display batches the GUI has consumed
        self.results_total = 0     # engine results produced (all stored)
        self.session_folder: Optional[str] = None
        self._running = False

    # -- control (GUI thread): flags only, they return at once ------------------------------------
    # pause / resume / step / seek / stop / paused: Controls (engine/run_driver.py)
    def ack(self) -> None:
        """The GUI has drawn a batch; the next one may be sent."""
        self._acked += 1
        self.control.wake()

    @property
    def frames_in(self) -> int:
        """Frames pushed to the engine so far."""
        return self.driver.frames_in if self.driver is not None else 0

    @property
    def dropped(self) -> int:
        """Live frames the engine could not take (never a file's)."""
        return self.driver.dropped if self.driver is not None else 0

    @property
    def running(self) -> bool:
        return self._running

    # -- the run (worker thread) --------------------------------------------------------------
    @QtCore.Slot()
    def run(self) -> None:
        self._running = True
        summary = {"results": 0, "frames": 0, "dropped": 0, "error": None, "stopped": False,
                   "cut_short": "", "session": None}
        source = session = store = opened_store = None
        display = _DisplaySink(self)
        try:
            source, session, store = self._open()
            opened_store = store
            summary["session"] = self.session_folder
            self.driver = RunDriver(source, session, [StoreSink(store), display], speed=self.options.speed,
                                    max_frames=self.options.max_frames, stats_hz=self.options.stats_hz,
                                    control=self.control)
            store = None                   # the store sink closes it (and marks a cut-short run)
            result = self.driver.run()
            summary["stopped"] = result.stopped
            summary["cut_short"] = result.cut_short
        except EngineError as exc:
            if disk_full(exc):
                summary["disk_full"] = True
                summary["error"] = (f"Disk full: no space left for the session folder {self.session_folder}. "
                                    "The run stopped; the frames stored before it are kept there (free "
                                    f"some space, then open or export them). ({exc})")
            else:
                summary["error"] = str(exc)
            self.error.emit(summary["error"])
        except Exception as exc:  # a bug must not take the window down; show it and log it
            log.error("engine worker failed:\n%s", traceback.format_exc())
            summary["error"] = f"Internal error: {type(exc).__name__}: {exc}"
            self.error.emit(summary["error"])
        finally:
            # the store sink closes the store, unless finishing failed before it could (a full
            # disk fails marking the session too): closing again joins its writer threads, closes
            # its files and releases its lock, whatever happened (close is idempotent)
            if store is None and opened_store is not None:
                store = opened_store
            for obj, what in ((session, "engine session"), (source, "source"), (store, "session store")):
                if obj is not None:
                    try:
                        obj.close()
                    except Exception as exc:  # closing must not hide the run's outcome
                        log.warning("closing the %s failed: %s", what, exc)
            display.flush(force=True)
            if self.session_folder and not os.path.isdir(self.session_folder):
                summary["session"] = self.session_folder = None    # nothing was stored: removed
            summary["results"] = self.results_total
            summary["frames"] = self.frames_in
            summary["dropped"] = self.dropped
            if self.driver is not None and self.driver.summary.error and summary["error"] is None:
                summary["error"] = f"Saving the session failed: {self.driver.summary.error}"
                self.error.emit(summary["error"])
            self._running = False
            self.finished.emit(summary)

    def _apply_retention(self) -> None:
        """Old sessions go before a new one starts (never one in use or in keep_sessions)."""
        from engine.io.retention import apply_retention
        from engine.io.store import default_session_root

        o = self.options
        max_gb, max_days = o.retention
        try:
            deleted = apply_retention(o.session_root or default_session_root(), max_gb=max_gb,
                                      max_age_days=max_days, keep=o.keep_sessions)
        except OSError as exc:                 # retention must never stop a run
            log.warning("session retention failed: %s", exc)
            return
        if deleted:
            self.message.emit(f"Removed {len(deleted)} old session(s) to stay within the sessions limits "
                              f"({max_gb:g} GB, {max_days:g} days; File > Sessions folder)")

    def _open(self):
        from engine.io.sources import open_source
        from engine.shared_streams import StreamHubs
        from engine.io.store import SessionStore, new_session_folder

        o = self.options
        source = open_source(o.source, fps=o.config.fps, loop=o.loop, max_side=o.config.decode_max_side or None,
                             resolution=o.webcam_resolution)
        try:
            if o.start_frame:
                if source.seekable:
                    source.seek(int(o.start_frame))
                else:                      # a webcam has no frame numbers: start live
                    self.message.emit(f"{source.name} cannot start at frame {o.start_frame}; starting live")
            # the stream layer `reconstudio run` opens its sessions with too (one run path)
            factory = o.session_factory or StreamHubs(preloaded=o.model).open_session
            session = factory(o.config, source)
        except BaseException:
            source.close()
            raise
        try:
            if not o.session_dir and o.retention:
                self._apply_retention()
            folder = o.session_dir or str(new_session_folder(source.name, o.session_root))
            # bounded background writer: compression overlaps the engine, a slow disk makes it wait
            store = SessionStore(folder, o.config, source.name, background=True, queue_size=o.store_queue,
                                 meta={"kind": source.kind, "fps": source.fps, "frames": len(source)})
        except BaseException:
            session.close()
            source.close()
            raise
        self.session_folder = str(store.folder)
        self.opened.emit({"name": source.name, "kind": source.kind, "frames": len(source),
                          "fps": source.fps, "session": self.session_folder,
                          "seekable": bool(source.seekable)})
        return source, session, store


class WorkerHandle:
    """A worker and its QThread, started together; `stop_and_wait` ends both cleanly."""

    def __init__(self, options: RunOptions, parent: Optional[QtCore.QObject] = None):
        self.worker = EngineWorker(options)
        self.thread = QtCore.QThread(parent)
        self.thread.setObjectName("reconstudio-engine")
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        # Direct: the thread must end even while the GUI thread is blocked in stop_and_wait
        # (a queued quit would wait for the GUI event loop → deadlock on window close).
        self.worker.finished.connect(self.thread.quit, QtCore.Qt.ConnectionType.DirectConnection)

    def start(self) -> None:
        self.thread.start()

    def is_running(self) -> bool:
        return self.thread.isRunning()

    def stop_and_wait(self, timeout_ms: int = 120_000) -> bool:
        """Ask the worker to stop and wait for its thread to end (the current push finishes
        first). Returns False if it did not end within the timeout."""
        self.worker.stop()
        if not self.thread.isRunning():
            return True
        return self.thread.wait(timeout_ms)

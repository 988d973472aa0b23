"""The engine worker: runs a reconstruction off the GUI thread and reports over Qt signals.

`EngineWorker` is a QObject moved to a QThread (see `start_worker`). Its `run` slot opens the
source, the engine session and the session store, then loops: decode a frame (and resize it, in
`engine.io.sources`), push it, write EVERY result to the store, convert results to display packets
and emit them. Display packets are coalesced to the display rate (~30 Hz) and only sent when the
GUI has taken the previous batch (`ack`), so a slow viewer receives bigger, rarer batches — its
display updates (previews, monitors) are dropped, never engine results, and the engine never waits
for the GUI. Control methods (pause / resume / step / seek / stop) are called from the GUI thread
and only set flags under a condition variable, so they return at once.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

from PySide6 import QtCore

from engine.api import EngineError, SessionConfig

from .display import FRUSTUM_FRACTION, make_display_frame

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
    display_stride: int = 2                      # per-frame point subsampling for the viewer
    display_hz: float = 30.0
    stats_hz: float = 4.0
    decode_max_side: Optional[int] = 960         # frames are resized on the worker side
    webcam_resolution: Optional[tuple] = None    # (w, h) requested from a webcam
    model: Any = None                            # a loaded network for neural engines (optional)


class _StoreWriter:
    """Writes results and events to the SessionStore on its own thread, in order, so the
    engine thread does not wait for compression and disk. Nothing is ever dropped: `close`
    drains the queue; a write failure is kept and re-raised to the engine thread."""

    def __init__(self, store):
        self.store = store
        self._q: "queue.Queue" = queue.Queue()
        self.error: Optional[BaseException] = None
        self._t = threading.Thread(target=self._run, name="reconstudio-store", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            kind, item = self._q.get()
            if kind == "end":
                return
            if self.error is not None:
                continue
            try:
                self.store.write(item) if kind == "result" else self.store.write_event(item)
            except BaseException as exc:   # reported by check()
                self.error = exc

    def put_result(self, r) -> None:
        self._q.put(("result", r))

    def put_event(self, e) -> None:
        self._q.put(("event", e))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Drain the queue, then close the store."""
        self._q.put(("end", None))
        self._t.join()
        self.store.close()
        self.check()


class EngineWorker(QtCore.QObject):
    frameResult = QtCore.Signal(object)      # list[DisplayFrame], coalesced
    stats = QtCore.Signal(object)            # dict: session.stats() + run counters
    realigned = QtCore.Signal(int, object)   # segment, 4x4 similarity (absolute)
    message = QtCore.Signal(str)             # info / warning text for the status bar
    error = QtCore.Signal(str)               # user-facing failure; the run ends
    opened = QtCore.Signal(object)           # dict: source name, kind, frames, fps, session folder
    finished = QtCore.Signal(object)         # dict summary (always emitted, exactly once)

    def __init__(self, options: RunOptions):
        super().__init__()
        self.options = options
        self._cond = threading.Condition()
        self._paused = bool(options.start_paused)
        self._steps = 0
        self._stop = False
        self._seek: Optional[int] = None
        self._emitted = 0          # display batches sent
        self._acked = 0            # display batches the GUI has consumed
        self.results_total = 0     # engine results produced (all stored)
        self.frames_in = 0         # frames pushed to the engine
        self.session_folder: Optional[str] = None
        self._running = False

    # -- control (GUI thread) -----------------------------------------------------------------
    def pause(self) -> None:
        with self._cond:
            self._paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def step(self, n: int = 1) -> None:
        """Process n more input frames, then stay paused."""
        with self._cond:
            self._paused = True
            self._steps += int(n)
            self._cond.notify_all()

    def seek(self, index: int) -> None:
        with self._cond:
            self._seek = int(index)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def ack(self) -> None:
        """The GUI has drawn a batch; the next one may be sent."""
        self._acked += 1

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def running(self) -> bool:
        return self._running

    # -- the run (worker thread) --------------------------------------------------------------
    @QtCore.Slot()
    def run(self) -> None:
        self._running = True
        summary = {"results": 0, "frames": 0, "error": None, "stopped": False, "session": None}
        source = session = store = None
        try:
            source, session, store = self._open()
            summary["session"] = self.session_folder
            self._loop(source, session, store)
            summary["stopped"] = self._stop
        except EngineError as exc:
            summary["error"] = str(exc)
            self.error.emit(str(exc))
        except Exception as exc:  # a bug must not take the window down; show it and log it
            log.error("engine worker failed:\n%s", traceback.format_exc())
            summary["error"] = f"Internal error: {type(exc).__name__}: {exc}"
            self.error.emit(summary["error"])
        finally:
            for obj, what in ((session, "engine session"), (source, "source"), (store, "session store")):
                if obj is not None:
                    try:
                        obj.close()
                    except Exception as exc:  # closing must not hide the run's outcome
                        log.warning("closing the %s failed: %s", what, exc)
                        if obj is store and summary["error"] is None:   # results were lost
                            summary["error"] = f"Saving the session failed: {exc}"
                            self.error.emit(summary["error"])
            self._flush_display(force=True)
            summary["results"] = self.results_total
            summary["frames"] = self.frames_in
            self._running = False
            self.finished.emit(summary)

    def _open(self):
        from engine import open_session
        from engine.io.sources import open_source
        from engine.io.store import SessionStore, new_session_folder

        o = self.options
        source = open_source(o.source, fps=o.config.fps, loop=o.loop, max_side=o.decode_max_side,
                             resolution=o.webcam_resolution)
        try:
            if o.start_frame:
                if source.seekable:
                    source.seek(int(o.start_frame))
                else:                      # a webcam has no frame numbers: start live
                    self.message.emit(f"{source.name} cannot start at frame {o.start_frame}; starting live")
            session = open_session(o.config, model=o.model)
        except BaseException:
            source.close()
            raise
        try:
            folder = o.session_dir or str(new_session_folder(source.name, o.session_root))
            store = SessionStore(folder, o.config, source.name,
                                 meta={"kind": source.kind, "fps": source.fps, "frames": len(source)})
        except BaseException:
            session.close()
            source.close()
            raise
        self.session_folder = str(store.folder)
        store = _StoreWriter(store)
        self.opened.emit({"name": source.name, "kind": source.kind, "frames": len(source),
                          "fps": source.fps, "session": self.session_folder,
                          "seekable": bool(source.seekable)})
        return source, session, store

    def _loop(self, source, session, store) -> None:
        o = self.options
        self._pending: list = []
        self._last_emit = 0.0
        self._last_stats = 0.0
        self._frustum_depth: Optional[float] = None
        self._t_start = time.perf_counter()
        clock = None                       # (wall time, media time) anchor for paced replay
        warned = 0
        while True:
            with self._cond:
                while self._paused and self._steps == 0 and not self._stop and self._seek is None:
                    self._flush_display(force=True)
                    self._cond.wait(0.1)
                    clock = None
                if self._stop:
                    return self._finish(session, store)
                if self._seek is not None:
                    target, self._seek = self._seek, None
                    try:
                        source.seek(target)
                        self.message.emit(f"Jumped to frame {target}")
                    except EngineError as exc:
                        self.message.emit(str(exc))
                    clock = None
                    continue
                stepping = self._steps > 0
                if stepping:
                    self._steps -= 1
            frame = source.read()
            for w in source.warnings[warned:]:
                self.message.emit(w)
            warned = len(source.warnings)
            if frame is None:
                return self._finish(session, store)
            if o.speed > 0 and not stepping:
                if clock is None:
                    clock = (time.perf_counter(), frame.timestamp)
                due = clock[0] + (frame.timestamp - clock[1]) / o.speed
                if self._sleep_until(due):
                    return self._finish(session, store)
            self._handle(session.push(frame.image, frame.timestamp), session, store)
            self.frames_in += 1
            if o.max_frames and self.frames_in >= o.max_frames:
                return self._finish(session, store)

    def _sleep_until(self, due: float) -> bool:
        """Wait for a paced frame; True if a stop came meanwhile."""
        with self._cond:
            while not self._stop:
                left = due - time.perf_counter()
                if left <= 0 or self._seek is not None:
                    break
                self._cond.wait(min(left, 0.05))
            return self._stop

    def _finish(self, session, store) -> None:
        self._handle(session.flush(), session, store)
        self._emit_stats(session, force=True)

    def _handle(self, results, session, store) -> None:
        o = self.options
        store.check()                      # a failed write ends the run with its message
        for r in results:
            store.put_result(r)            # every result is stored (on the writer thread)
            self.results_total += 1
            # frustums keep the size set by the first frame with depth (one scene scale)
            d = make_display_frame(r, o.display_stride, frustum_depth=self._frustum_depth)
            if self._frustum_depth is None and len(d.depth):
                self._frustum_depth = FRUSTUM_FRACTION * d.median_depth
            # previews: only the newest image and the newest depth map of a batch travel
            if self._pending:
                prev = self._pending[-1]
                prev.image = None
                if d.depth_map is not None:
                    for p in self._pending:
                        p.depth_map = p.conf_map = None
            self._pending.append(d)
        for e in session.poll_events():
            store.put_event(e)
            if e.kind == "realign" and e.transform is not None:
                self.realigned.emit(int(e.segment), e.transform)
            elif e.message:
                self.message.emit(e.message)
        self._flush_display()
        self._emit_stats(session)

    def _flush_display(self, force: bool = False) -> None:
        pending = getattr(self, "_pending", None)
        if not pending:
            return
        now = time.perf_counter()
        gui_ready = self._emitted - self._acked <= 0
        if force or (gui_ready and now - self._last_emit >= 1.0 / self.options.display_hz):
            self._pending = []
            self._last_emit = now
            self._emitted += 1
            self.frameResult.emit(pending)

    def _emit_stats(self, session, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_stats < 1.0 / self.options.stats_hz:
            return
        self._last_stats = now
        try:
            s = dict(session.stats())
        except Exception as exc:  # stats are advisory; never end a run over them
            log.warning("engine stats failed: %s", exc)
            s = {}
        s["frames_in"] = self.frames_in
        s["results_total"] = self.results_total
        s["wall_s"] = now - self._t_start
        self.stats.emit(s)


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

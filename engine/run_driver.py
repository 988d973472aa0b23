"""The one run loop: frames from a source go through an engine session into sinks.

Every client (the `run` CLI, the GUI worker, evaluation, the benchmarks) drives its session with
`RunDriver` instead of its own read → push → store → events loop:

    driver = RunDriver(source, session, [StoreSink(store), my_sink], speed=1.0)
    summary = driver.run()          # on the calling thread; pause/step/seek/stop from any thread

`reconstudio run` (one driver per input) and the GUI worker open `session` through the stream layer
(engine/shared_streams.py `StreamHubs`), so both run the same objects; the driver takes any session.

Policies
- Pacing: `speed` 0 = as fast as possible, 1 = real time (by the frames' timestamps), N = N x real
  time. A seek, a pause or a step restarts the clock, so the run never rushes to catch up.
- Backpressure: sinks are called on the driver's thread, in order; a sink that blocks (the store's
  bounded background queue, a `ThreadedSink` whose bounded queue is full, the GUI waiting for the
  viewer) makes the engine wait. Nothing is ever dropped from a sink.
- Live sources (a webcam, or any source with `live = True`) are read on their own thread by a
  `LatestFrame` mailbox of one slot: the engine always takes the newest frame; a frame replaced
  before the engine took it is counted in `dropped` (never queued, so latency cannot grow).
  Frames a live source delivers while the run is paused are skipped, not counted as dropped.
- File sources (video, image folder, `SequenceSource`) are read ahead on a reader thread
  (`Prefetch`, `prefetch` frames at most, never dropped) which also runs the session's own
  preprocessing (`session.prepare_frame`, where it has one): decoding and resizing the next frames
  overlap the engine's step instead of adding to it. `prefetch=0` reads on the driver's thread.
  A live source's grabber thread runs `prepare_frame` as well (on every frame it reads, also those
  replaced before the engine takes them: that thread is otherwise idle).
- Timing: `run_stats()` reports the driver thread's milliseconds per input frame, split into
  waiting for the frame (`read_ms`), the engine's push (`push_ms`) and the sinks, events and stats
  (`sinks_ms`) -- where a run's time goes when its FPS is below the engine benchmark's.
- Events (realign, segment, info, warning) are polled after every push and forwarded to the sinks
  in order; source warnings go to `on_message`.

The driver owns neither the source, the session nor the store: the caller opens and closes them
(the `StoreSink` closes its store in `on_finish`, marking a cut-short run).
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from .api import EngineError, EngineEvent, FrameResult

__all__ = ["RunDriver", "RunControl", "RunSummary", "Sink", "StoreSink", "CallbackSink", "ThreadedSink", "CollectSink",
           "SequenceSource", "LatestFrame", "Prefetch", "is_live"]


# --- sinks ------------------------------------------------------------------------------------

class Sink:
    """Receives what a run produces, on the driver's thread. Override what you need; blocking in
    a method makes the engine wait (backpressure)."""

    def on_start(self, driver: "RunDriver") -> None: ...
    def on_results(self, results: list) -> None: ...
    def on_event(self, event: EngineEvent) -> None: ...
    def on_message(self, text: str) -> None: ...
    def on_stats(self, stats: dict) -> None: ...
    def on_idle(self) -> None: ...        # called ~10x per second while paused or pacing
    def on_finish(self, summary: "RunSummary") -> None: ...


class CallbackSink(Sink):
    """A sink from plain callables (any may be None)."""

    def __init__(self, results=None, event=None, message=None, stats=None, idle=None, finish=None):
        self._cb = {"results": results, "event": event, "message": message, "stats": stats,
                    "idle": idle, "finish": finish}

    def _call(self, name, *a):
        f = self._cb[name]
        if f is not None:
            f(*a)

    def on_results(self, results): self._call("results", results)
    def on_event(self, event): self._call("event", event)
    def on_message(self, text): self._call("message", text)
    def on_stats(self, stats): self._call("stats", stats)
    def on_idle(self): self._call("idle")
    def on_finish(self, summary): self._call("finish", summary)


class CollectSink(Sink):
    """Keeps every result and event in memory (evaluation, benchmarks, tests)."""

    def __init__(self):
        self.results: list = []
        self.events: list = []
        self.messages: list = []

    def on_results(self, results): self.results.extend(results)
    def on_event(self, event): self.events.append(event)
    def on_message(self, text): self.messages.append(text)


class StoreSink(Sink):
    """Writes every result and event to a `SessionStore` (open it with `background=True`: its
    bounded queue is the backpressure). `on_finish` marks a cut-short run and closes the store."""

    def __init__(self, store, close: bool = True):
        self.store = store
        self.close_store = close

    def on_results(self, results):
        for r in results:
            self.store.write(r)

    def on_event(self, event):
        self.store.write_event(event)

    def on_finish(self, summary):
        # the store is closed even when marking fails (a full disk): its writer threads, files and
        # lease must never outlive the run
        try:
            if summary.cut_short and hasattr(self.store, "mark_cut_short"):
                self.store.mark_cut_short(summary.cut_short, frames_in=summary.frames_in)
        finally:
            if self.close_store:
                # a run that produced nothing (a failed start) leaves no empty session folder
                self.store.close(discard_empty=summary.results == 0)


class ThreadedSink(Sink):
    """Runs another sink on its own thread behind a bounded queue: the driver blocks when
    `maxsize` calls are waiting (backpressure, nothing dropped). A failure in the inner sink is
    re-raised on the driver's thread at the next call."""

    def __init__(self, inner: Sink, maxsize: int = 4, name: str = "run-sink"):
        self.inner = inner
        self._q: queue.Queue = queue.Queue(maxsize=max(1, int(maxsize)))
        self.error: Optional[BaseException] = None
        self._t = threading.Thread(target=self._work, name=name, daemon=True)
        self._t.start()

    def _work(self):
        while True:
            name, args = self._q.get()
            try:
                if name is None:
                    return
                if self.error is None:
                    getattr(self.inner, name)(*args)
            except BaseException as exc:   # surfaced on the driver's thread
                self.error = exc
            finally:
                self._q.task_done()

    def _put(self, name, *args):
        if self.error is not None:
            raise self.error
        self._q.put((name, args))

    @property
    def pending(self) -> int:
        return self._q.qsize()

    def on_start(self, driver): self.inner.on_start(driver)
    def on_results(self, results): self._put("on_results", list(results))
    def on_event(self, event): self._put("on_event", event)
    def on_message(self, text): self._put("on_message", text)
    def on_stats(self, stats): self._put("on_stats", stats)

    def on_finish(self, summary):
        self._q.put(("on_finish", (summary,)))
        self._q.put((None, ()))
        self._t.join()
        if self.error is not None:
            raise self.error


# --- sources ----------------------------------------------------------------------------------

@dataclass
class _Frame:
    index: int
    timestamp: float
    image: Any


class SequenceSource:
    """A file-like source over a list: each item is an image, or anything `load(item)` turns
    into one (e.g. a path); timestamps given or index / fps. Seekable, never live."""

    kind = "sequence"
    live = False
    seekable = True

    def __init__(self, items: Sequence, timestamps: Optional[Sequence[float]] = None, fps: float = 30.0,
                 load: Optional[Callable[[Any], Any]] = None, name: str = "sequence"):
        self.items = items
        self.timestamps = timestamps
        self.fps = float(fps)
        self.load = load
        self.name = name
        self.warnings: list = []
        self._pos = 0

    def __len__(self):
        return len(self.items)

    def read(self):
        if self._pos >= len(self.items):
            return None
        i = self._pos
        self._pos += 1
        image = self.items[i] if self.load is None else self.load(self.items[i])
        ts = float(self.timestamps[i]) if self.timestamps is not None else i / self.fps
        return _Frame(i, ts, image)

    def seek(self, index: int) -> None:
        if not 0 <= int(index) < len(self.items):
            raise EngineError(f"cannot seek to frame {index}: {self.name} has {len(self.items)} frames")
        self._pos = int(index)

    def close(self) -> None:
        pass


def is_live(source) -> bool:
    """A live source delivers frames at its own pace whether or not anyone takes them."""
    return bool(getattr(source, "live", False)) or getattr(source, "kind", "") == "webcam"


def _prepared(f, prepare: Callable[[Any], Any]) -> "_Frame":
    """The frame with its image replaced by `prepare(image)` (the session's preprocessing)."""
    return _Frame(f.index, f.timestamp, prepare(f.image))


@dataclass
class _Rejected:
    """A live frame that `prepare` refused (raised when the engine takes it)."""
    error: BaseException


class LatestFrame:
    """Reads a live source on its own thread into a one-slot mailbox. `take()` returns the newest
    frame (waiting for one); a frame overwritten before it was taken counts in `dropped`.
    `prepare(image)` (the session's preprocessing) runs on that thread too, so the engine's thread
    only runs the engine; a frame it rejects is raised by `take()` (the run ends on it, as a push
    would have)."""

    def __init__(self, source, name: str = "live-source", prepare: Optional[Callable[[Any], Any]] = None):
        self.source = source
        self.prepare = prepare
        self.dropped = 0
        self.skipped = 0           # replaced while the run was paused (not the engine's fault)
        self.delivered = 0
        self.counting = True       # False while paused
        self.ended = False
        self.error: Optional[BaseException] = None
        self._slot = None
        self._cond = threading.Condition()
        self._quit = False
        self._t = threading.Thread(target=self._work, name=name, daemon=True)
        self._t.start()

    def _work(self):
        try:
            while not self._quit:
                f = self.source.read()
                if f is not None and self.prepare is not None:
                    try:
                        f = _prepared(f, self.prepare)
                    except Exception as exc:     # the frame's own fault: take() raises it
                        f = _Frame(f.index, f.timestamp, _Rejected(exc))
                with self._cond:
                    if f is None:
                        break
                    self.delivered += 1
                    if self._slot is not None:
                        if self.counting:
                            self.dropped += 1
                        else:
                            self.skipped += 1
                    self._slot = f
                    self._cond.notify_all()
        except BaseException as exc:     # a failing camera ends the stream; the driver reports it
            self.error = exc
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def take(self, timeout: float = 0.1):
        """The newest frame, None if none came within `timeout`; raises StopIteration at the end."""
        with self._cond:
            if self._slot is None and not self.ended:
                self._cond.wait(timeout)
            f, self._slot = self._slot, None
            if f is None and self.ended:
                raise StopIteration
            if f is not None and isinstance(f.image, _Rejected):
                raise f.image.error
            return f

    def discard(self) -> None:
        """Drop whatever waits (while paused: the engine must get a fresh frame on resume)."""
        with self._cond:
            if self._slot is not None:
                self.skipped += 1
                self._slot = None

    def close(self, timeout: float = 2.0) -> None:
        self._quit = True
        self._t.join(timeout)


class Prefetch:
    """Reads a file source ahead on its own thread: at most `depth` frames wait in a queue, each
    already passed through `prepare(image)` when given (the session's preprocessing; its result
    replaces the frame's image). Frames come out in order, none dropped; a read or prepare error is
    raised by `take()` at that frame's place. `seek` stops the reader, seeks the source and starts
    again (frames read ahead are discarded). Only the reader thread touches the source while it runs."""

    def __init__(self, source, prepare: Optional[Callable[[Any], Any]] = None, depth: int = 3,
                 name: str = "prefetch"):
        self.source = source
        self.prepare = prepare
        self.depth = max(1, int(depth))
        self.name = name
        self._t: Optional[threading.Thread] = None
        self._start()

    def _start(self) -> None:
        self._quit = threading.Event()
        self._q: queue.Queue = queue.Queue(maxsize=self.depth)
        self._t = threading.Thread(target=self._work, args=(self._q, self._quit), name=self.name, daemon=True)
        self._t.start()

    def _work(self, q: queue.Queue, quit_: threading.Event) -> None:
        def put(item) -> bool:
            while not quit_.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    pass
            return False

        try:
            while not quit_.is_set():
                f = self.source.read()
                if f is None:
                    put(("end", None))
                    return
                if self.prepare is not None:
                    f = _prepared(f, self.prepare)
                if not put(("frame", f)):
                    return
        except BaseException as exc:     # raised on the driver's thread, at this frame's place
            put(("error", exc))

    def take(self):
        """The next frame (waiting for it), None at the end of the source."""
        kind, value = self._q.get()
        if kind == "error":
            self._q.put((kind, value))   # a later take fails the same way
            raise value
        if kind == "end":
            self._q.put((kind, value))
            return None
        return value

    def _halt(self) -> None:
        self._quit.set()
        while self._t is not None and self._t.is_alive():
            try:
                self._q.get(timeout=0.05)        # unblock a reader waiting on a full queue
            except queue.Empty:
                pass
        self._t = None

    def seek(self, index: int) -> None:
        """Seek the source (its errors propagate; the reader restarts either way)."""
        self._halt()
        try:
            self.source.seek(index)
        finally:
            self._start()

    def close(self) -> None:
        self._halt()


# --- the driver -------------------------------------------------------------------------------

@dataclass
class RunSummary:
    frames_in: int = 0              # frames pushed to the engine
    results: int = 0                # results handed to the sinks
    dropped: int = 0                # live frames the engine could not take
    ended: bool = False             # the source ran out (or max_frames was reached)
    stopped: bool = False           # stop() was called
    interrupted: str = ""           # why the run was interrupted (a signal), "" if not
    error: Optional[str] = None     # the run ended on this error
    wall_s: float = 0.0
    stats: dict = field(default_factory=dict)   # the session's last stats()

    @property
    def cut_short(self) -> str:
        """Why the session holds less than the run was asked for ("" when it does not): an
        error, an interruption or a stop before the end of a file source."""
        if self.error:
            return f"error: {self.error}"
        if self.interrupted:
            return f"interrupted ({self.interrupted}) after {self.frames_in} input frames"
        if self.stopped and not self.ended and not self._live:
            return f"stopped by the user after {self.frames_in} input frames"
        return ""

    _live: bool = False


class RunControl:
    """Pause / step / seek / stop requests, settable from any thread before or during a run
    (a GUI creates it with its worker, before the source and session exist)."""

    def __init__(self, start_paused: bool = False):
        self.cond = threading.Condition()          # re-entrant lock: sinks may call back in
        self.paused = bool(start_paused)
        self.steps = 0
        self.stop_requested = False
        self.seek_to: Optional[int] = None
        self.reason = ""                           # set by stop(reason): the run was interrupted

    def pause(self) -> None:
        with self.cond:
            self.paused = True
            self.cond.notify_all()

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def step(self, n: int = 1) -> None:
        """Process n more input frames, then stay paused."""
        with self.cond:
            self.paused = True
            self.steps += int(n)
            self.cond.notify_all()

    def seek(self, index: int) -> None:
        with self.cond:
            self.seek_to = int(index)
            self.cond.notify_all()

    def stop(self, reason: str = "") -> None:
        """End the run after the current push (the session is still flushed into the sinks).
        `reason` (e.g. "SIGTERM") marks the run as interrupted: the session is cut short."""
        with self.cond:
            self.stop_requested = True
            if reason and not self.reason:
                self.reason = reason
            self.cond.notify_all()

    def wake(self) -> None:
        """Re-check the state (e.g. a consumer a sink waits on has caught up)."""
        with self.cond:
            self.cond.notify_all()


class Controls:
    """pause / resume / step / seek / stop / wake / paused forwarded to `self.control` (a
    RunControl): for RunDriver and for a GUI worker that holds the control before its driver exists
    (ui/worker.py). Callable from any thread; they only set flags and return at once."""

    control: RunControl

    def pause(self) -> None:
        self.control.pause()

    def resume(self) -> None:
        self.control.resume()

    def step(self, n: int = 1) -> None:
        """Process n more input frames, then stay paused."""
        self.control.step(n)

    def seek(self, index: int) -> None:
        self.control.seek(index)

    def stop(self, reason: str = "") -> None:
        self.control.stop(reason)

    def wake(self) -> None:
        self.control.wake()

    @property
    def paused(self) -> bool:
        return self.control.paused


class RunDriver(Controls):
    """See the module docstring. Control methods (Controls) may be called from any thread."""

    def __init__(self, source, session, sinks: Iterable[Sink] = (), *, speed: float = 0.0,
                 max_frames: Optional[int] = None, start_paused: bool = False, stats_hz: float = 4.0,
                 live: Optional[bool] = None, flush: bool = True, control: Optional[RunControl] = None,
                 prefetch: int = 3):
        if speed < 0:
            raise EngineError(f"speed must be 0 (as fast as possible) or positive, got {speed}")
        self.source = source
        self.session = session
        self.sinks: list = list(sinks)
        self.speed = float(speed)
        self.max_frames = int(max_frames) if max_frames else None
        self.stats_hz = float(stats_hz)
        self.live = is_live(source) if live is None else bool(live)
        self.flush_at_end = flush
        self.summary = RunSummary(_live=self.live)
        self.control = control or RunControl(start_paused)
        self._cond = self.control.cond
        self._grabber: Optional[LatestFrame] = None
        self.prefetch = 0 if self.live else max(0, int(prefetch))
        self._reader: Optional[Prefetch] = None
        self._phase_ms: collections.deque = collections.deque(maxlen=64)   # (read, push, sinks) per frame
        self._warned = 0
        self._last_stats = 0.0
        self._t0 = time.perf_counter()
        self._times: collections.deque = collections.deque(maxlen=64)   # wall time per result

    # -- control (any thread): pause / resume / step / seek / stop / wake / paused from Controls
    @property
    def stopping(self) -> bool:
        return self.control.stop_requested

    @property
    def frames_in(self) -> int:
        return self.summary.frames_in

    @property
    def dropped(self) -> int:
        return self._grabber.dropped if self._grabber is not None else self.summary.dropped

    def wait_while(self, predicate: Callable[[], bool], timeout: float = 0.05) -> bool:
        """For sinks that wait on a consumer: block while `predicate()` holds and the run is not
        stopping; False if a stop came meanwhile."""
        c = self.control
        with c.cond:
            while predicate() and not c.stop_requested:
                c.cond.wait(timeout)
            return not c.stop_requested

    # -- the run (calling thread) ------------------------------------------------------------
    def run(self) -> RunSummary:
        s = self.summary
        self._t0 = time.perf_counter()
        for k in self.sinks:
            k.on_start(self)
        if self.live:
            self._grabber = LatestFrame(self.source, prepare=getattr(self.session, "prepare_frame", None))
        elif self.prefetch:
            self._reader = Prefetch(self.source, getattr(self.session, "prepare_frame", None), self.prefetch)
        try:
            self._loop()
            if self.flush_at_end:
                self._deliver(self.session.flush())
        except KeyboardInterrupt:
            s.interrupted = s.interrupted or "Ctrl-C"
            s.stopped = True
            try:                            # the engine's queued frames are results too
                if self.flush_at_end:
                    self._deliver(self.session.flush())
            except Exception:
                pass
        except BaseException as exc:
            s.error = str(exc) or type(exc).__name__
            raise
        finally:
            if self.control.reason and not s.interrupted:
                s.interrupted = self.control.reason
            if self._reader is not None:
                self._reader.close()
            if self._grabber is not None:
                self._grabber.close()
                s.dropped = self._grabber.dropped
                if self._grabber.error is not None and not s.error:
                    self._message(f"{getattr(self.source, 'name', 'source')} failed: {self._grabber.error}")
            s.wall_s = time.perf_counter() - self._t0
            try:
                s.stats = dict(self.session.stats())
            except Exception:
                s.stats = {}
            self._emit_stats(force=True)
            self._finish_sinks()
        return s

    def _finish_sinks(self) -> None:
        first: Optional[BaseException] = None
        for k in self.sinks:
            try:
                k.on_finish(self.summary)
            except BaseException as exc:   # every sink gets to finish (the store must close)
                first = first or exc
        if first is not None and not self.summary.error:
            self.summary.error = str(first)
            raise first

    def _loop(self) -> None:
        s = self.summary
        clock = None                  # (wall, media time) anchor of paced replay
        while True:
            c = self.control
            with c.cond:
                while c.paused and c.steps == 0 and not c.stop_requested and c.seek_to is None:
                    if self._grabber is not None:
                        self._grabber.counting = False
                        self._grabber.discard()
                    c.cond.wait(0.1)
                    self._idle()
                    clock = None
                if c.stop_requested:
                    s.stopped = True
                    return
                if c.seek_to is not None:
                    target, c.seek_to = c.seek_to, None
                    self._do_seek(target)
                    clock = None
                    continue
                stepping = c.steps > 0
                if stepping:
                    c.steps -= 1
                if self._grabber is not None:
                    self._grabber.counting = True
            t_read = time.perf_counter()
            frame = self._read()
            read_ms = (time.perf_counter() - t_read) * 1e3      # pacing waits below are not read time
            if frame is None:
                s.ended = True
                return
            if self.speed > 0 and not stepping and not self.live:
                if clock is None:
                    clock = (time.perf_counter(), frame.timestamp)
                if self._sleep_until(clock[0] + (frame.timestamp - clock[1]) / self.speed):
                    s.stopped = True
                    return
            t_push = time.perf_counter()
            results = self.session.push(frame.image, frame.timestamp)
            t_sinks = time.perf_counter()
            self._deliver(results)
            self._phase_ms.append((read_ms, (t_sinks - t_push) * 1e3, (time.perf_counter() - t_sinks) * 1e3))
            s.frames_in += 1
            if self.max_frames and s.frames_in >= self.max_frames:
                s.ended = True
                return

    def _read(self):
        self._check_warnings()
        if self._reader is not None:
            f = self._reader.take()
            self._check_warnings()
            return f
        if self._grabber is None:
            f = self.source.read()
            self._check_warnings()
            return f
        while True:
            try:
                f = self._grabber.take(0.1)
            except StopIteration:
                self._check_warnings()
                return None
            if f is not None:
                return f
            if self.control.stop_requested:
                return None
            self._idle()

    def _do_seek(self, target: int) -> None:
        if self.live or not getattr(self.source, "seekable", False):
            self._message(f"{getattr(self.source, 'name', 'this source')} cannot seek")
            return
        try:
            (self._reader or self.source).seek(target)
            self._message(f"Jumped to frame {target}")
        except EngineError as exc:
            self._message(str(exc))

    def _sleep_until(self, due: float) -> bool:
        """Wait for a paced frame; True if a stop came meanwhile (a seek or pause ends the wait)."""
        c = self.control
        with c.cond:
            while not c.stop_requested:
                left = due - time.perf_counter()
                if left <= 0 or c.seek_to is not None or (c.paused and c.steps == 0):
                    break
                c.cond.wait(min(left, 0.1))
                self._idle()
            return c.stop_requested

    def _deliver(self, results: list) -> None:
        if results:
            now = time.perf_counter()
            self._times.extend([now] * len(results))
            self.summary.results += len(results)
            for k in self.sinks:
                k.on_results(results)
        for e in self.session.poll_events():
            for k in self.sinks:
                k.on_event(e)
        self._emit_stats()

    def _idle(self) -> None:
        for k in self.sinks:
            k.on_idle()
        self._emit_stats()

    def _message(self, text: str) -> None:
        for k in self.sinks:
            k.on_message(text)

    def _check_warnings(self) -> None:
        w = getattr(self.source, "warnings", None) or []
        for text in w[self._warned:]:
            self._message(text)
        self._warned = len(w)

    def run_stats(self) -> dict:
        """The driver's own counters: frames_in, results, dropped, engine_fps (results per wall
        second over the last 64 results), wall_s, paused, and the driver thread's mean ms per
        input frame over the last 64 frames: read_ms, push_ms, sinks_ms (None before a frame)."""
        now = time.perf_counter()
        t = self._times
        fps = (len(t) - 1) / (t[-1] - t[0]) if len(t) >= 2 and t[-1] > t[0] else None
        if t and now - t[-1] > 2.0:
            fps = 0.0                              # nothing for 2 s (paused, stalled)
        ph = list(self._phase_ms)
        means = [sum(x[i] for x in ph) / len(ph) for i in range(3)] if ph else [None] * 3
        return {"frames_in": self.summary.frames_in, "results_total": self.summary.results,
                "dropped": self.dropped, "engine_fps": fps, "wall_s": now - self._t0, "paused": self.control.paused,
                "read_ms": means[0], "push_ms": means[1], "sinks_ms": means[2]}

    def _emit_stats(self, force: bool = False) -> None:
        if not self.stats_hz or not self.sinks:
            return
        now = time.perf_counter()
        if not force and now - self._last_stats < 1.0 / self.stats_hz:
            return
        self._last_stats = now
        try:
            st = dict(self.session.stats())
        except Exception:            # stats are advisory; never end a run over them
            st = {}
        st.update(self.run_stats())
        for k in self.sinks:
            k.on_stats(st)


def run_frames(session, frames: Sequence, timestamps: Optional[Sequence[float]] = None, *,
               sinks: Iterable[Sink] = (), load: Optional[Callable] = None, fps: float = 30.0) -> CollectSink:
    """Convenience for evaluation and benchmarks: push a list of frames (or paths with `load`)
    as fast as possible; returns the CollectSink holding results and events in order."""
    collect = CollectSink()
    driver = RunDriver(SequenceSource(frames, timestamps, fps=fps, load=load), session,
                       [collect, *sinks], stats_hz=0)
    driver.run()
    return collect

"""The stream layer every run goes through: sessions whose steps may share one model.

`reconstudio run` (one input or several), the GUI's main run and its second views open their
sessions with `StreamHubs.open_session(config, source)` and drive each with one
`engine.run_driver.RunDriver` (on its own thread when there are several). A LingBot-Map streaming
config gets a `SharedSession` of the `SharedStreams` for its model; any other engine or mode an
ordinary session (`engine.open_session`). So a figure measured with `run` describes the GUI: the
same objects run the same steps.

`SharedStreams` hands out sessions (`SharedSession`: push / flush / stats / poll_events / close)
that all go through ONE `engine.scheduler.StreamScheduler` over ONE loaded network, so two sources
cost one copy of the weights and their streamed frames are batched into one forward:

    hub = SharedStreams(model, max_batch=4)
    s1 = hub.open_session(cfg, name="cam0", frame_size=(640, 480))     # in worker thread 1
    s2 = hub.open_session(cfg, name="cam1")                            # in worker thread 2
    results = s1.push(frame, t)      # blocks until this frame's round ran (like a session's push)

A stream that is the only one open is a pass-through: its frame runs in its session's own `push`
on the pushing thread (`StreamScheduler.push_alone`): no round, no stacking, no extra copy or
thread, results deferred exactly as the session's own (on CUDA a push returns the results up to
the previous frame, `defer_results`). As soon as a second stream is open the frames go through
batched rounds; on CUDA the scheduler pipelines them (`pipeline`), with the same deferral.

How the threads share the scheduler: `push` puts the frame in an inbox and waits. One waiting
thread at a time becomes the *runner*: it moves the inbox into the scheduler and runs one
`step()` (the other threads keep queueing meanwhile), hands every stream its results and wakes
the others; whoever still waits for a frame runs the next round. Before a round the runner waits
up to `gather_s` for the frames of the other open streams (those that pushed before), so the
streams fall into step and their frames share rounds instead of alternating. Everything that
touches the scheduler (open, step, stats, close) runs as the runner, one thread at a time.

Errors: a frame that fails ends only its stream (`push` raises its EngineError, the others go on);
a failed batched forward (e.g. out of memory) ends the streams of that round. No Qt; importing this
module is cheap (torch and the scheduler load with the first SharedStreams).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Optional

from .api import EngineError, SessionConfig


class SharedStreams:
    """Thread-safe front of one StreamScheduler (see the module docstring)."""

    ACTIVE_S = 0.5           # a stream that pushed within this is expected to push again soon

    def __init__(self, model, *, max_batch: int = 8, gather_s: float = 0.02, pipeline: Optional[bool] = None,
                 **scheduler_kw):
        # pipeline (None = on CUDA): a push returns the results of the stream's previous frames, as a
        # LingBot-Map session does on CUDA (defer_results): no host wait per round
        from .scheduler import StreamScheduler
        if pipeline is None:
            pipeline = getattr(getattr(model, "device", None), "type", "cpu") == "cuda"
        self.scheduler = StreamScheduler(model, max_batch=max_batch, pipeline=bool(pipeline), **scheduler_kw)
        self.gather_s = float(gather_s)
        self._cv = threading.Condition()
        self._running = False                 # a thread is the runner (owns the scheduler)
        self._inbox: list = []                # (SharedSession, frame, timestamp)
        self.sessions: list["SharedSession"] = []

    @property
    def model(self):
        return self.scheduler.model

    def open_sessions(self) -> int:
        with self._cv:
            return sum(not s.closed for s in self.sessions)

    @contextlib.contextmanager
    def _as_runner(self):
        """Exclusive use of the scheduler; the lock itself is free meanwhile (others queue)."""
        with self._cv:
            while self._running:
                self._cv.wait()
            self._running = True
        try:
            yield
        finally:
            with self._cv:
                self._running = False
                self._cv.notify_all()

    def open_session(self, config: SessionConfig, *, name: Optional[str] = None,
                     frame_size: Optional[tuple] = None, latency_budget_ms: Optional[float] = None,
                     live: bool = False) -> "SharedSession":
        """Admit a stream (AdmissionError when its caches would not fit, as `open_stream`)."""
        with self._as_runner():
            stream = self.scheduler.open_stream(config, name=name, frame_size=frame_size,
                                                latency_budget_ms=latency_budget_ms, live=live)
        s = SharedSession(self, stream)
        with self._cv:
            self.sessions.append(s)
        return s

    # ------------------------------------------------------------------ rounds
    def _push(self, s: "SharedSession", frame, timestamp) -> list:
        with self._cv:
            s._check()
            self._inbox.append((s, frame, timestamp))
            s._sent += 1
            s._last_push = time.monotonic()
            self._cv.notify_all()             # a runner gathering frames may be waiting for this one
            want = s._sent
            while True:
                if s.error is not None:
                    if self._running:
                        self._cv.wait()
                        continue
                    if not s.closed:          # end the stream; its frames done before the failure
                        self._running = True  # (pipelined: still in flight) come out first
                        self._cv.release()
                        try:
                            rest = self.scheduler.close_stream(s.stream)
                        except BaseException:
                            rest = []
                        finally:
                            self._cv.acquire()
                            self._running = False
                            s.closed = True
                            self._cv.notify_all()
                        s._out += rest
                    out, s._out = s._out, []
                    if out:                   # the next push (or flush) raises
                        return out
                    s._error_raised = True
                    raise EngineError(s.error)
                if s._done >= want:
                    out, s._out = s._out, []
                    return out
                if self._running:
                    self._cv.wait()
                    continue
                self._running = True          # this thread runs the next round
                self._gather()
                inbox, self._inbox = self._inbox, []
                for o, _, _ in inbox:
                    o._moved += 1
                alone = len(inbox) == 1 and self._alone(inbox[0][0])
                self._cv.release()
                try:
                    served, failure = self._round(inbox, alone), None
                except BaseException as exc:   # a failed forward: the streams of this round end
                    served, failure = [], exc
                finally:
                    self._cv.acquire()
                    self._running = False
                self._settle(served, failure)
                self._cv.notify_all()

    def _gather(self) -> None:
        """(lock held) Wait up to gather_s for the other open streams' next frames, so that they
        join this round. Streams that failed, or pushed nothing for ACTIVE_S (paused, waiting on
        their display), are not waited for."""
        if self.gather_s <= 0:
            return
        now = time.monotonic()
        end = now + self.gather_s
        while True:
            waiting = {o for o, _, _ in self._inbox}
            missing = [o for o in self.sessions if not o.closed and o.error is None and o._sent
                       and now - o._last_push < self.ACTIVE_S
                       and o not in waiting and o._moved - o._done == 0]
            left = end - time.monotonic()
            if not missing or left <= 0:
                return
            self._cv.wait(left)

    def _round(self, inbox: list, alone: bool) -> list:
        sched = self.scheduler
        if alone:                             # nobody to batch with: a pass-through
            s, frame, ts = inbox[0]
            return sched.push_alone(s.stream, frame, ts)
        for s, frame, ts in inbox:
            sched.submit(s.stream, frame, ts)
        return sched.step()

    def _alone(self, s: "SharedSession") -> bool:
        """(lock held) No other stream is open: none could share a round with `s` (a stream opened
        meanwhile joins from the next round on)."""
        return all(o is s or o.closed for o in self.sessions)

    def _settle(self, served: list, failure: Optional[BaseException]) -> None:
        """(lock held) Hand out results; a frame counts as done once it left its stream's queue
        (served, dropped as late, or its stream failed; pipelined, its results come with a later
        round or the stream's flush)."""
        by_stream = {s.stream: s for s in self.sessions}
        for stream, results in served:
            by_stream[stream]._out.extend(results)
        for s in self.sessions:
            if s.stream.error is not None and s.error is None:
                s.error = s.stream.error
            if failure is not None and s._moved > s._done and s.error is None:
                s.error = (str(failure) if isinstance(failure, EngineError)
                           else f"the batched step failed: {type(failure).__name__}: {failure}")
            s._done = s._moved - len(s.stream.queue)

    # ------------------------------------------------------------------ per-session calls
    def _flush_close(self, s: "SharedSession", keep: bool) -> list:
        res = []
        with self._as_runner():
            if not s.closed:
                try:
                    res = self.scheduler.close_stream(s.stream)
                finally:
                    with self._cv:
                        s.closed = True
                if s.stream.error is not None and s.error is None:
                    s.error = s.stream.error
        with self._cv:                        # results a round handed out after its last push
            out, s._out = s._out + res, []
            if keep and not out and s.error is not None and not s._error_raised:
                s._error_raised = True        # a failure not reported by a push yet
                raise EngineError(s.error)
        return out if keep else []

    def _stats(self, s: "SharedSession") -> dict:
        with self._as_runner():                # not while a round mutates the caches
            st = dict(s.stream.session.stats())
            sched = self.scheduler.stats()
        st["scheduler"] = {"streams": sum(not x.closed for x in self.scheduler.streams),
                           "largest_batch": sched["largest_batch"], "rounds": sched["rounds"],
                           "round_ms_median": sched["round_ms_median"]}
        return st

    def close(self) -> None:
        """Close every session still open."""
        for s in list(self.sessions):
            s.close()


class SharedSession:
    """A session of a SharedStreams (the Session protocol of engine/api.py)."""

    def __init__(self, hub: SharedStreams, stream):
        self.hub = hub
        self.stream = stream
        self.config = stream.session.config
        self.error: Optional[str] = None
        self.closed = False
        self._sent = 0            # frames pushed
        self._moved = 0           # frames handed to the scheduler
        self._done = 0            # frames that left its queue
        self._out: list = []      # results not yet returned
        self._last_push = 0.0     # time.monotonic() of the last push
        self._error_raised = False

    @property
    def name(self) -> str:
        return self.stream.name

    def _check(self) -> None:
        if self.closed:
            raise EngineError(self.error or f"stream {self.stream.name!r} is closed")

    def push(self, frame, timestamp: Optional[float] = None) -> list:
        return self.hub._push(self, frame, timestamp)

    def flush(self) -> list:
        """The stream's remaining results; the stream ends (its caches are freed)."""
        return self.hub._flush_close(self, keep=True)

    def stats(self) -> dict:
        return self.hub._stats(self)

    def poll_events(self) -> list:
        return self.stream.session.poll_events()

    def close(self) -> None:
        self.hub._flush_close(self, keep=False)

    def __getattr__(self, name: str) -> Any:      # read-only facts (device, model, kv ...) of the session
        if name.startswith("_") or name in ("hub", "stream"):
            raise AttributeError(name)
        return getattr(self.stream.session, name)


def shares_model(config: SessionConfig) -> bool:
    """Configs whose sessions can go through a SharedStreams: LingBot-Map, streaming mode, one
    process (the ring's sequence-parallel scale phase is a multi-process run of its own)."""
    return (config.engine == "lingbot-map" and config.mode == "streaming"
            and getattr(config, "sequence_parallel", "off") == "off")


def model_key(config: SessionConfig) -> tuple:
    """What the loaded network depends on: streams with the same key can share it."""
    import torch
    return (str(config.checkpoint or ""), str(config.model or "lingbot-map"), str(torch.device(config.device)),
            config.dtype, str(getattr(config, "weight_dtype", "")), bool(getattr(config, "compile_blocks", False)))


class StreamHubs:
    """A program's stream layer: one SharedStreams per loaded model (model_key). `open_session(config,
    source)` is how every run opens its session (`reconstudio run`, `ui.worker.RunOptions.session_factory`):
    LingBot-Map streaming configs share one network per model and batch their frames; other configs
    get an ordinary session. A hub whose streams have all closed is dropped (its model freed) when a
    config needs another model. `preloaded`: a model to use instead of loading the checkpoint (tests,
    a host program; the GUI's loaded network)."""

    def __init__(self, preloaded=None, *, max_batch: int = 4, gather_s: float = 0.02):
        self.preloaded = preloaded
        self.max_batch, self.gather_s = int(max_batch), float(gather_s)
        self._hubs: dict = {}
        self._lock = threading.Lock()

    def hub(self, config: SessionConfig) -> SharedStreams:
        # a preloaded model is the one network: every config shares it (the scheduler refuses a
        # stream on another device or dtype with a clear message)
        key = ("preloaded",) if self.preloaded is not None else model_key(config)
        with self._lock:
            hub = self._hubs.get(key)
            if hub is None:
                for k in [k for k, h in self._hubs.items() if not h.open_sessions()]:
                    del self._hubs[k]                       # idle hubs: free their model first
                model = self.preloaded
                if model is None:
                    from .lingbot.session import load_model
                    model = load_model(config)
                hub = self._hubs[key] = SharedStreams(model, max_batch=self.max_batch, gather_s=self.gather_s)
        return hub

    def open_session(self, config: SessionConfig, source=None, *, name: Optional[str] = None,
                     frame_size: Optional[tuple] = None):
        """The session of one run over `source` (its name, and whether it is a webcam): a SharedSession
        when `shares_model(config)`, else `engine.open_session(config, model=preloaded)`. `name`
        overrides the source's; `frame_size` (w, h) makes the admission estimate exact (unknown: 4:3).
        AdmissionError when a shared stream's caches would not fit."""
        if not shares_model(config):
            from .api import open_session
            return open_session(config, model=self.preloaded)
        name = name or getattr(source, "name", None)
        live = getattr(source, "kind", "") == "webcam"
        return self.hub(config).open_session(config, name=name, frame_size=frame_size, live=live)

    def open_streams(self) -> int:
        with self._lock:
            return sum(h.open_sessions() for h in self._hubs.values())

    def hubs(self) -> list:
        """The SharedStreams loaded now (their scheduler's statistics: run summaries, tests)."""
        with self._lock:
            return list(self._hubs.values())

"""Windowed mode of the neural engines (`SessionConfig(mode="windowed", window_size=, overlap=)`).

LingBot-Map's own recipe for very long videos, and the same for VGGT: run the engine's ordinary
session (LingBot-Map streaming, VGGT chunked) on a window of `window_size` frames, then close it
(its KV cache and graphs are freed) and start a fresh one that first re-reads the last `overlap`
frames of the previous window. Each window is a **segment** in its own coordinates:

- results of window w carry `segment=w` and are the engine's raw output for that window (the
  overlap frames are reconstructed again but reported only once, by the window that saw them
  first);
- window w > 0 is placed by a confidence-weighted IRLS Sim(3) with Huber weights
  (`engine.align.overlap_similarity`: `irls_sim3` plus rejection of residuals beyond 3 robust
  sigmas) between the back-projected depth of the overlap frames as window w-1 saw them and as
  window w sees them; composed with window w-1's placement, that gives
  the absolute similarity T_w of segment w, announced as an `EngineEvent("realign", segment=w,
  transform=T_w)` (plus a "segment" event when the window starts). The viewer moves whole
  segments by it; the store and the exports apply it (engine.geometry.apply_realignments), so
  exported poses are the aligned ones.

Memory is bounded by one window's session (the engines' own caches are bounded too); the model
is loaded once and shared by every window. Frame indices and timestamps are the stream's own.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any, Optional

import numpy as np

from .align.overlap import overlap_similarity
from .api import EngineError, EngineEvent, FrameResult, SessionConfig
from .session_timing import SessionTiming, require_ints


def _inner_class(engine: str):
    if engine == "lingbot-map":
        from .lingbot.session import LingBotMapSession
        return LingBotMapSession
    if engine == "vggt-1b":
        from .vggt.session import VGGTChunkedSession
        return VGGTChunkedSession
    raise EngineError(f"windowed mode is available for lingbot-map and vggt-1b, not {engine!r}")


def _validate(cfg: SessionConfig) -> None:
    require_ints(cfg, (("window_size", 2), ("overlap", 1)), lambda msg: EngineError(f"windowed mode: {msg}"))
    if cfg.overlap >= cfg.window_size:
        raise EngineError(f"windowed mode: overlap ({cfg.overlap}) must be smaller than window_size "
                          f"({cfg.window_size}) so every window adds new frames")


class WindowedSession(SessionTiming):
    """See the module docstring. `model` is shared by every window (loaded once if None)."""

    _SESSION_NAME = "windowed"

    def __init__(self, config: SessionConfig, model: Any = None):
        _validate(config)
        self.config = config
        self._inner_cfg = dataclasses.replace(config, mode="streaming")
        self._cls = _inner_class(config.engine)
        self.inner = self._cls(self._inner_cfg, model)       # validates the engine's own settings
        self.model = self.inner.model
        self.window = 0
        self._in_window = 0             # frames pushed into the current inner session (overlap included)
        self._map: list[int] = []       # inner index -> stream index, current window
        self._tail: deque = deque(maxlen=config.overlap)    # (frame, timestamp, index) of the newest frames
        self._overlap_idx: list[int] = []                   # stream indices re-read by this window
        self._prev_overlap: dict = {}   # index -> (c2w, K, depth, conf) in the previous window's coordinates
        self._cur_overlap: dict = {}    # the same, as this window sees them
        self._tail_geom: deque = deque(maxlen=config.overlap)   # (index, geometry) of the newest results
        self._placement = np.eye(4)     # T of the current window (window coords -> world)
        self._aligned = True            # window 0 needs no alignment
        self._events: list[EngineEvent] = []
        self._next_index = 0
        self._frames = 0
        self.alignments: list[dict] = []
        self._init_timing()             # latency / rate of recent calls, closed flag

    # ------------------------------------------------------------------ contract
    def prepare_frame(self, frame):
        """The inner sessions' preprocessing (pinned on their device); safe on another thread."""
        return self.inner.prepare_frame(frame)

    def push(self, frame, timestamp: Optional[float] = None) -> list[FrameResult]:
        self._check_open()
        t0 = time.perf_counter()
        index = self._next_index
        ts = float(timestamp) if timestamp is not None else index / float(self.config.fps)
        out: list[FrameResult] = []
        if self._in_window >= self.config.window_size:
            out += self._next_window()
        try:
            out += self._push_inner(frame, ts, index)
        except BaseException:
            self._map.pop()             # the inner session did not take the frame (e.g. a bad frame)
            self._in_window -= 1
            raise
        self._next_index += 1
        self._tail.append((frame, ts, index))
        self._account(t0, out)
        return out

    def flush(self) -> list[FrameResult]:
        self._check_open()
        t0 = time.perf_counter()
        out = self._collect(self.inner.flush())
        self._account(t0, out)
        return out

    def stats(self) -> dict:
        st = dict(self.inner.stats())
        # fps and percentiles over this wrapper's calls; latency_ms stays the inner session's last run
        st.update({k: v for k, v in self._timing_stats().items() if k != "latency_ms"})
        st.update({"frames": self._frames,
                   "segments": self.window + 1, "window": self.window, "window_frames": self._in_window,
                   "last_alignment": self.alignments[-1] if self.alignments else None})
        from .fast_path import windowed_fast_path
        st["fast_path"] = windowed_fast_path(st.get("fast_path"), self.config.window_size)
        if st.get("step_graph") is not None:    # one decision: why_not is fast_path's reason
            st["step_graph"] = dict(st["step_graph"], why_not=st["fast_path"]["reason"])
        return st

    def poll_events(self) -> list[EngineEvent]:
        ev = self._events + self.inner.poll_events()
        self._events = []
        return ev

    def close(self) -> None:
        self._closed = True
        self.inner.close()
        self._tail.clear()
        self._tail_geom.clear()

    # ------------------------------------------------------------------ internals
    def _account(self, t0: float, out: list) -> None:
        self._record_run(time.perf_counter() - t0, len(out))
        self._frames += len(out)

    def _push_inner(self, frame, ts: float, index: int) -> list[FrameResult]:
        self._map.append(index)
        self._in_window += 1
        return self._collect(self.inner.push(frame, ts))

    def _next_window(self) -> list[FrameResult]:
        """Finish the current window, start the next one on the overlap frames."""
        out = self._collect(self.inner.flush())
        self.inner.close()                     # frees its KV cache before the next one allocates
        self._prev_overlap = {i: g for i, g in self._tail_geom}
        self.window += 1
        self.inner = self._cls(self._inner_cfg, self.model)
        self._in_window = 0
        self._map = []
        self._cur_overlap = {}
        self._overlap_idx = [i for _, _, i in self._tail]
        self._aligned = False
        first = self._tail[0][2] if self._tail else self._next_index
        self._events.append(EngineEvent("segment", segment=self.window, message=(
            f"window {self.window} starts at frame {self._next_index} (re-reading frames {first}.."
            f"{self._next_index - 1} to align it)")))
        for frame, ts, index in list(self._tail):
            out += self._push_inner(frame, ts, index)
        return out

    def _collect(self, results: list[FrameResult]) -> list[FrameResult]:
        """Inner results -> stream results: map indices, keep overlap geometry, align, tag segments."""
        out = []
        for r in results:
            r.index = self._map[r.index]
            r.segment = self.window
            geom = (r.c2w, r.K, r.depth, r.conf)
            if r.index in self._overlap_idx and not self._aligned:
                self._cur_overlap[r.index] = geom
                self._tail_geom.append((r.index, geom))     # may anchor the next window too
                if len(self._cur_overlap) == len(self._overlap_idx):
                    self._align()
                continue
            if not self._aligned:      # cannot happen: results come in order, overlap frames first
                raise EngineError("windowed mode: a new frame's result arrived before the overlap frames'")
            self._tail_geom.append((r.index, geom))
            out.append(r)
        return out

    def _align(self) -> None:
        idx = self._overlap_idx
        prev = [self._prev_overlap[i] for i in idx if i in self._prev_overlap]
        new = [self._cur_overlap[i] for i in idx if i in self._prev_overlap]
        if not prev:
            raise EngineError("windowed mode: the overlap frames of the previous window were not kept")
        try:
            S, info = overlap_similarity(prev, new)
        except EngineError as exc:            # keep streaming; the segment stays where the last one was
            S, info = np.eye(4), {"scale": 1.0, "points": 0, "inliers": 0.0, "rms": float("nan")}
            self._events.append(EngineEvent("warning", segment=self.window,
                                            message=f"window {self.window}: {exc}; placed without alignment"))
        self._placement = self._placement @ S
        info.update(window=self.window, frames=(idx[0], idx[-1]))
        self.alignments.append(info)
        self._events.append(EngineEvent("realign", segment=self.window, transform=self._placement.copy(),
                                        message=f"window {self.window} aligned on {len(prev)} overlap frames "
                                                f"(scale {info['scale']:.4g}, {info['inliers']:.0%} inliers)"))
        self._aligned = True

"""Windowed mode of the neural engines (`SessionConfig(mode="windowed", window_size=, overlap=)`).

LingBot-Map's own recipe for very long videos, and the same for VGGT: run the engine's ordinary
session (LingBot-Map streaming, VGGT chunked) on a window of `window_size` frames, then close it
(its KV cache and graphs are freed) and start a fresh one that first re-reads the last `overlap`
frames of the previous window. Each window is a **segment** in its own coordinates:

- results of window w carry `segment=w` and are the engine's raw output for that window (the
  overlap frames are reconstructed again but reported only once, by the window that saw them
  first);
- window w > 0 is placed by a confidence-weighted IRLS Sim(3) with Huber weights
  (`engine.align.irls_sim3`, plus rejection of residuals beyond 3 robust sigmas) between the back-projected depth of the overlap frames as window
  w-1 saw them and as window w sees them; composed with window w-1's placement, that gives
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

from .api import EngineError, EngineEvent, FrameResult, SessionConfig
from .session_timing import SessionTiming, require_ints


def backproject(c2w: np.ndarray, K: np.ndarray, depth: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """World points [N, 3] of every `step`-th pixel (pixel centres) and their flat pixel indices."""
    h, w = depth.shape
    v, u = np.mgrid[step // 2:h:step, step // 2:w:step]
    idx = (v * w + u).ravel()
    z = depth.ravel()[idx].astype(np.float64)
    x = (u.ravel() + 0.5 - K[0, 2]) / K[0, 0] * z
    y = (v.ravel() + 0.5 - K[1, 2]) / K[1, 1] * z
    cam = np.stack((x, y, z), axis=1)
    return cam @ np.asarray(c2w)[:3, :3].T + np.asarray(c2w)[:3, 3], idx


def overlap_correspondences(prev: list, new: list, points_per_frame: int = 4096):
    """3D correspondences of the same pixels of the overlap frames: `prev` and `new` are lists of
    (c2w, K, depth, conf) of the same frames in two reconstructions. Returns (src = new points,
    dst = prev points, weights = sqrt((conf_prev - 1)(conf_new - 1)), the confidences' excess over
    their floor of 1), keeping pixels with positive, finite depth in both."""
    src, dst, wts = [], [], []
    for (c2w_p, K_p, d_p, c_p), (c2w_n, K_n, d_n, c_n) in zip(prev, new):
        h, w = d_n.shape
        step = max(1, int(np.sqrt(h * w / points_per_frame)))
        Xp, idx = backproject(c2w_p, K_p, d_p, step)
        Xn, _ = backproject(c2w_n, K_n, d_n, step)
        if c_p is None or c_n is None:
            cw = np.ones(len(idx))
        else:
            cw = np.sqrt(np.clip(c_p.ravel()[idx] - 1.0, 0, None) * np.clip(c_n.ravel()[idx] - 1.0, 0, None))
        ok = (np.isfinite(Xp).all(1) & np.isfinite(Xn).all(1) & np.isfinite(cw)
              & (d_p.ravel()[idx] > 0) & (d_n.ravel()[idx] > 0))
        src.append(Xn[ok])
        dst.append(Xp[ok])
        wts.append(cw[ok])
    return np.concatenate(src), np.concatenate(dst), np.concatenate(wts)


def overlap_similarity(prev: list, new: list, points_per_frame: int = 4096) -> tuple[np.ndarray, dict]:
    """4x4 similarity S placing reconstruction `new` onto `prev` (x_prev ≈ S x_new) from their
    overlap frames (see `overlap_correspondences`), by confidence-weighted Huber IRLS
    (engine.align.irls_sim3) with rejection of residuals beyond 3 robust sigmas. Returns (S, info)
    with info = {"scale", "points", "inliers" (share at full weight), "rms" (weighted residual)}."""
    from .align import irls_sim3, sim3_matrix
    src, dst, wts = overlap_correspondences(prev, new, points_per_frame)
    if len(src) < 3 or wts.sum() <= 0:
        raise EngineError("the overlap frames carry no usable depth to align the next window/chunk")
    # Huber IRLS alone holds up to ~10 % gross outliers (wrong depths along the rays); beyond that
    # its start (plain Umeyama) is too far off, so points past 3 robust sigmas of the fit are
    # dropped and the fit repeated, until the kept set stops changing (at most 3 rounds).
    keep = wts
    for _ in range(4):
        s, R, t, w_final = irls_sim3(src, dst, keep)
        res = np.linalg.norm(dst - (s * src @ R.T + t), axis=1)
        live = keep > 0
        sigma = 1.4826 * float(np.median(res[live]))
        new_keep = np.where(res <= 3.0 * max(sigma, 1e-12), wts, 0.0)
        if (new_keep > 0).sum() < 3 or np.array_equal(new_keep > 0, live):
            break
        keep = new_keep
    used = wts > 0
    info = {"scale": float(s), "points": int(used.sum()),
            "inliers": float((w_final[used] >= 0.999 * wts[used]).mean()) if used.any() else 0.0,
            "rms": float(np.sqrt(np.average(res ** 2, weights=np.maximum(w_final, 1e-300))))}
    return sim3_matrix(s, R, t), info


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

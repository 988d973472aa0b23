"""The "synthetic" engine: a soak-test harness that behaves like a neural engine without weights.

It emits, for every pushed frame, one `FrameResult` with a dense depth map at the neural engine's
resolution (518 x 392 for a 4:3 input: width `image_width`, height following the input aspect, a
multiple of 14), a confidence map, colours (the input frame resampled, or a procedural texture when
the input is tiny or not an image) and a camera that moves smoothly along a closed loop. It needs
no weights, no torch and no GPU, so the whole GUI and the run driver can be driven at neural-engine
rates anywhere (CI, a 2-core VM).

Everything is a function of the frame index (never of the wall clock), so two runs are identical.
`synthetic_fps` paces the engine: each `push` returns no sooner than 1/rate after the previous one
(0 = as fast as possible). `synthetic_segment_frames` starts a new segment every N frames (with a
"segment" and a "realign" event) so the code paths of tracking breaks are exercised too.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Any, Optional

import numpy as np

from .api import EngineError, EngineEvent, FrameResult, SessionConfig, register_engine

PATCH = 14                       # the neural engines' patch size: result sizes are multiples of it
DEFAULT_ASPECT = 3 / 4           # height / width used when the input has no usable size
MIN_INPUT_SIDE = 32              # smaller inputs get the procedural texture


def result_size(width: int, in_w: int, in_h: int) -> tuple[int, int]:
    """(w, h) of the results: `width` wide, height from the input aspect, rounded to a multiple of 14."""
    aspect = in_h / in_w if in_w >= MIN_INPUT_SIDE and in_h >= MIN_INPUT_SIDE else DEFAULT_ASPECT
    h = max(PATCH, int(round(width * aspect / PATCH)) * PATCH)
    return int(width), h


def _as_rgb(frame: Any) -> Optional[np.ndarray]:
    """uint8 HxWx3 from an image-like input, or None when it is not an image big enough to use."""
    if not isinstance(frame, np.ndarray) or frame.ndim not in (2, 3):
        return None
    if frame.ndim == 2:
        frame = frame[:, :, None].repeat(3, axis=2)
    if frame.shape[2] < 3 or frame.shape[0] < MIN_INPUT_SIDE or frame.shape[1] < MIN_INPUT_SIDE:
        return None
    frame = frame[:, :, :3]
    if frame.dtype != np.uint8:
        f = np.nan_to_num(frame.astype(np.float32))
        frame = np.clip(f * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return frame


def _resample(rgb: np.ndarray, w: int, h: int) -> np.ndarray:
    """Nearest-neighbour resize at pixel centres (numpy only; cheap enough at 518 x 392)."""
    ys = ((np.arange(h) + 0.5) * rgb.shape[0] / h).astype(np.intp)
    xs = ((np.arange(w) + 0.5) * rgb.shape[1] / w).astype(np.intp)
    return np.ascontiguousarray(rgb[ys[:, None], xs[None, :]])


def camera_pose(index: int, period: int = 600) -> np.ndarray:
    """Camera-to-world (OpenCV axes) of frame `index`: a slow orbit of radius 1 around the origin
    with a small vertical bob, looking at a point ahead of the orbit centre; smooth and periodic."""
    a = 2.0 * math.pi * index / period
    eye = np.array([math.cos(a), 0.15 * math.sin(2.0 * a), math.sin(a)])
    target = np.array([0.4 * math.cos(a + 0.9), 0.0, 0.4 * math.sin(a + 0.9)]) * 4.0
    z = target - eye
    z /= np.linalg.norm(z)
    down = np.array([0.0, 1.0, 0.0])                      # OpenCV: y points down
    x = np.cross(down, z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = x, y, z, eye
    return c2w


class SyntheticSession:
    """Session protocol implementation; see the module docstring."""

    def __init__(self, config: SessionConfig, model: Any = None):
        self.config = config
        self.width = int(config.image_width or 518)
        if self.width < PATCH or self.width % PATCH:
            raise EngineError(f"image_width must be a positive multiple of {PATCH}, got {config.image_width}")
        self.rate = float(getattr(config, "synthetic_fps", 0.0) or 0.0)
        if self.rate < 0 or not math.isfinite(self.rate):
            raise EngineError(f"synthetic_fps must be 0 (as fast as possible) or positive, got {self.rate}")
        self.segment_frames = int(getattr(config, "synthetic_segment_frames", 0) or 0)
        if self.segment_frames < 0:
            raise EngineError(f"synthetic_segment_frames must be ≥ 0, got {self.segment_frames}")
        self.keyframe_interval = max(1, int(config.keyframe_interval or 1))
        self._size: Optional[tuple[int, int]] = None
        self._grid = None
        self._n = 0
        self._n_kf = 0
        self._segment = 0
        self._events: list[EngineEvent] = []
        self._latencies: collections.deque = collections.deque(maxlen=300)
        self._intervals: collections.deque = collections.deque(maxlen=100)
        self._last_out: Optional[float] = None
        self._next_due: Optional[float] = None
        self._closed = False

    # --- contract ----------------------------------------------------------------------------
    def push(self, frame: Any, timestamp: Optional[float] = None) -> list[FrameResult]:
        if self._closed:
            raise EngineError("session is closed")
        t0 = time.perf_counter()
        rgb = _as_rgb(frame)
        if self._size is None:
            in_h, in_w = rgb.shape[:2] if rgb is not None else (0, 0)
            self._setup(*result_size(self.width, in_w, in_h))
        w, h = self._size
        i = self._n
        if self.segment_frames and i and i % self.segment_frames == 0:
            self._segment += 1
            self._events.append(EngineEvent("segment", self._segment, message=f"synthetic segment {self._segment}"))
            # place the new segment where it is (identity): exercises the client's realign path
            self._events.append(EngineEvent("realign", self._segment, transform=np.eye(4)))
        image = _resample(rgb, w, h) if rgb is not None else self._texture(i)
        depth, conf = self._depth(i)
        is_kf = i % self.keyframe_interval == 0
        ts = float(timestamp) if timestamp is not None else i / float(self.config.fps or 30.0)
        result = FrameResult(index=i, timestamp=ts, is_keyframe=is_kf, c2w=camera_pose(i), K=self.K.copy(),
                             image=image, depth=depth, conf=conf, segment=self._segment)
        self._n += 1
        self._n_kf += int(is_kf)
        self._pace()
        now = time.perf_counter()
        self._latencies.append(now - t0)
        if self._last_out is not None:
            self._intervals.append(now - self._last_out)
        self._last_out = now
        return [result]

    def flush(self) -> list[FrameResult]:
        return []

    def poll_events(self) -> list[EngineEvent]:
        events, self._events = self._events, []
        return events

    def stats(self) -> dict:
        lat = np.array(self._latencies) * 1e3 if self._latencies else None
        iv = list(self._intervals)
        return {
            "frames": self._n, "keyframes": self._n_kf,
            "fps": (len(iv) / sum(iv)) if iv and sum(iv) > 0 else None,
            "latency_ms": float(lat[-1]) if lat is not None else None,
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat is not None else None,
            "latency_p95_ms": float(np.percentile(lat, 95)) if lat is not None else None,
            "gpu_allocated_bytes": None, "gpu_reserved_bytes": None,
            "segments": self._segment + 1 if self._n else 0,
            "resolution": list(self._size) if self._size else None,
        }

    def close(self) -> None:
        self._closed = True

    # --- internals ---------------------------------------------------------------------------
    def _setup(self, w: int, h: int) -> None:
        self._size = (w, h)
        f = 0.5 * w / math.tan(math.radians(60.0) / 2)    # 60° horizontal field of view
        self.K = np.array([[f, 0, w / 2], [0, f, h / 2], [0, 0, 1]], dtype=np.float64)
        u = (np.arange(w, dtype=np.float32) + 0.5) / w
        v = (np.arange(h, dtype=np.float32) + 0.5) / h
        self._grid = (u[None, :], v[:, None])
        r2 = (u[None, :] - 0.5) ** 2 + (v[:, None] - 0.5) ** 2
        self._conf = (1.0 + 4.0 * np.exp(-r2 / 0.08)).astype(np.float32)   # centre most confident
        self._events.append(EngineEvent("info", 0, message=f"synthetic engine: {w}×{h} depth, "
                                        f"{'as fast as possible' if not self.rate else f'{self.rate:g} frames/s'}"))

    def _depth(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """A wavy wall 2-3 units away whose waves drift with the frame index (float32, > 0)."""
        u, v = self._grid
        p = 0.05 * i
        depth = 2.5 + 0.35 * np.sin(9.0 * u + p) * np.cos(7.0 * v - 0.5 * p) + 0.3 * (v - 0.5)
        conf = self._conf
        if i % 2:       # a little variation so a confidence threshold keeps a changing subset
            conf = conf * np.float32(0.9)
        return depth.astype(np.float32), conf.copy()

    def _texture(self, i: int) -> np.ndarray:
        """Procedural colours when the input is not a usable image: moving diagonal stripes."""
        u, v = self._grid
        s = 0.5 + 0.5 * np.sin(40.0 * (u + v) + 0.2 * i)
        blue = np.broadcast_to(120 + 100 * v, s.shape)
        rgb = np.stack([s * 220 + 20, (1 - s) * 180 + 40, blue], axis=-1)
        return np.ascontiguousarray(rgb.astype(np.uint8))

    def _pace(self) -> None:
        """Hold the push until 1/rate after the previous one (a steady `rate` frames per second)."""
        if not self.rate:
            return
        now = time.perf_counter()
        if self._next_due is None:
            self._next_due = now
        delay = self._next_due - now
        if delay > 0:
            time.sleep(delay)
        # never bank more than one frame of credit: a slow consumer must not cause a burst later
        self._next_due = max(self._next_due, time.perf_counter() - 1.0 / self.rate) + 1.0 / self.rate


CAPABILITIES = {
    "label": "Synthetic (soak test, no weights)",
    "needs_checkpoint": False,
    "devices": ["cpu"],
    "fields": ["image_width", "keyframe_interval"],      # shared fields it honours besides its own
}


def _factory(config: SessionConfig, model: Any = None) -> SyntheticSession:
    return SyntheticSession(config, model)


register_engine("synthetic", _factory, CAPABILITIES)

"""The "geometric" engine session: KLT tracks → monocular tracker → ordered FrameResults, with
keyframe depth computed behind the tracker on a worker thread.

Over 800 lines on purpose: the ordering contract below ties the tracker, the depth worker, the
loop closer and self-calibration's held frames to one queue of pending frames, kept in one place.

Ordering contract
- `push` returns results strictly in input order (each frame at most once).
- Frames seen before the map is initialised wait and are returned together once it is (like the
  scale phase of the neural engines); frames that never get a pose (no initialisation within
  `max_init_frames`, a blank stretch, end of stream) are never returned — `stats()["untracked"]`
  counts them and coverage = returned / pushed.
- A keyframe waits for its depth map; the frames after it wait behind it. When a keyframe is more
  than `depth_max_lag` frames old, `push` blocks until its depth is ready, so the depth worker
  keeps up by back-pressure and memory stays bounded. `flush()` drains everything.
- Keyframes carry `depth`/`conf`. A keyframe with no usable neighbour keyframe yet (too little
  sideways baseline) waits up to `depth_max_lag` frames for a later keyframe to pair with, then
  goes out with depth=None. Other frames carry depth=None, conf=None (the viewer back-projects
  keyframes only).
- Poses are final when the frame is tracked (a keyframe's after its own bundle adjustment); later
  refinements are not fed back, so results do not depend on how fast the depth worker runs.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Optional

import cv2
import numpy as np

from ..align import sim3_inverse, sim3_split
from ..api import EngineError, EngineEvent, FrameResult, SessionConfig
from ..geometry import apply_similarity
from ..intrinsics import resolve_intrinsics
from .depth import DepthView, choose_neighbours, choose_sweep_neighbours, keyframe_depth, limit_depth
from .frontend import KLTFrontend
from .loop import Forget, LoopCloser, LoopParams, SegmentLink
from .selfcal import FocalEstimate, FocalEstimator
from .tracker import MonoTracker, TrackerParams


class FrameError(EngineError):
    """A pushed frame cannot be used (message is user-facing); the session stays usable."""


def to_rgb_uint8(frame: Any) -> np.ndarray:
    """uint8 H×W×3 RGB from a uint8 RGB array, a float array in [0,1] (H×W×3) or a float tensor
    [3,h,w] in [0,1]."""
    if hasattr(frame, "detach"):   # torch tensor, without importing torch here
        frame = frame.detach().cpu().numpy()
        if frame.ndim == 3 and frame.shape[0] == 3:
            frame = np.transpose(frame, (1, 2, 0))
    if not isinstance(frame, np.ndarray):
        raise FrameError(f"a frame must be an image array, got {type(frame).__name__}")
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    if frame.ndim != 3 or frame.shape[2] not in (3, 4):
        raise FrameError(f"a frame must be H×W×3 RGB, got shape {frame.shape}")
    frame = frame[:, :, :3]
    if frame.shape[0] < 32 or frame.shape[1] < 32:
        raise FrameError(f"frame of {frame.shape[1]}×{frame.shape[0]} pixels is too small (at least 32×32)")
    if frame.dtype == np.uint8:
        return np.ascontiguousarray(frame)
    if np.issubdtype(frame.dtype, np.floating):
        if not np.isfinite(frame).all():
            raise FrameError("frame contains NaN or infinite values")
        return np.ascontiguousarray(np.clip(frame * 255.0 + 0.5, 0, 255).astype(np.uint8))
    raise FrameError(f"unsupported frame dtype {frame.dtype} (use uint8 RGB or float in [0, 1])")


def _typed(default, v):
    """A developer knob's value as the type of its default ("false" is False for a bool)."""
    if isinstance(default, bool) and isinstance(v, str):
        if v.strip().lower() not in ("true", "false", "1", "0", "on", "off", "yes", "no"):
            raise ValueError(f"expected true or false, got {v!r}")
        return v.strip().lower() in ("true", "1", "on", "yes")
    return type(default)(v)


def _zncc(a: np.ndarray, pa, b: np.ndarray, pb, r: int = 5) -> float:
    """Zero-mean normalised cross-correlation of the (2r+1)² patches of images a and b around
    the sub-pixel points pa and pb (−1 where a patch leaves its image or has no texture)."""
    size = (2 * r + 1, 2 * r + 1)
    A = cv2.getRectSubPix(a, size, (float(pa[0]), float(pa[1])), patchType=cv2.CV_32F).ravel()
    B = cv2.getRectSubPix(b, size, (float(pb[0]), float(pb[1])), patchType=cv2.CV_32F).ravel()
    A, B = A - A.mean(), B - B.mean()
    den = float(np.sqrt((A @ A) * (B @ B)))
    return float(A @ B) / den if den > 1e-6 else -1.0


class _FrameView:
    """A posed non-keyframe as a depth partner: its pose as tracked, its small grey image made
    only if it is chosen (depth.DepthView's fields)."""
    __slots__ = ("fid", "c2w", "segment", "_rgb", "_size", "_gray")

    def __init__(self, rec, size):
        self.fid, self.c2w, self.segment = rec.fid, np.array(rec.c2w, np.float64), rec.segment
        self._rgb, self._size, self._gray = rec.image, size, None

    @property
    def gray(self) -> np.ndarray:
        if self._gray is None:
            self._gray = cv2.cvtColor(cv2.resize(self._rgb, self._size, interpolation=cv2.INTER_AREA),
                                      cv2.COLOR_RGB2GRAY)
        return self._gray


class _Pending:
    __slots__ = ("fid", "timestamp", "image", "c2w", "is_kf", "segment", "future", "dropped", "deferred",
                 "world_scale", "depth_scale")

    def __init__(self, fid, timestamp, image):
        self.fid, self.timestamp, self.image = fid, timestamp, image
        self.c2w = None
        self.is_kf = False
        self.segment = 0
        self.future: Optional[Future] = None
        self.dropped = False
        self.deferred = False     # keyframe waiting for a neighbour keyframe with enough baseline
        self.world_scale = 1.0    # the tracker's world scale when this frame was posed
        self.depth_scale = 1.0    # depth computed in a later (re-anchored) world → this frame's world


class GeometricSession:
    def __init__(self, config: SessionConfig, model: Any = None):
        self.config = config
        extra = config.extra or {}
        try:
            self.max_side = int(config.max_side or 640)
            self.depth_width = int(config.depth_width)
            self.depth_max_lag = int(config.depth_max_lag)
            self.depth_enabled = bool(config.depth)
            self.max_features = int(config.max_features)
            self.max_depth_ratio = float(getattr(config, "max_depth_ratio", 8.0))
            self.loop_max_keyframes = int(getattr(config, "loop_max_keyframes", 1000))
            self._params = TrackerParams(max_init_frames=int(getattr(config, "init_max_frames", 300)),
                                         min_init_angle_deg=float(getattr(config, "init_min_parallax_deg", 1.0)),
                                         reuse_points=bool(getattr(config, "map_point_reuse", True)),
                                         rotation_aided=bool(getattr(config, "rotation_aided", True)))
            self._loop_params = LoopParams(flow_verify=bool(getattr(config, "loop_flow_verify", True)))
            for k, v in extra.items():
                if k.startswith("loop_") and hasattr(self._loop_params, k[5:]):   # developer knobs
                    setattr(self._loop_params, k[5:], _typed(getattr(self._loop_params, k[5:]), v))
                if k.startswith("tracker_"):
                    if not hasattr(self._params, k[8:]):
                        raise EngineError(f"unknown geometric engine setting {k!r}")
                    setattr(self._params, k[8:], _typed(getattr(self._params, k[8:]), v))
        except (TypeError, ValueError) as exc:
            raise EngineError(f"invalid geometric engine setting: {exc}") from None
        if self.max_side < 64:
            raise EngineError(f"max_side must be at least 64 pixels, got {config.max_side}")
        if self._params.max_init_frames < 3 or not (0.0 < self._params.min_init_angle_deg < 45.0) \
                or not self.max_depth_ratio > 1.0:
            raise EngineError("init_max_frames must be ≥ 3, init_min_parallax_deg in (0, 45) and max_depth_ratio > 1")
        if self.loop_max_keyframes < 10:
            raise EngineError(f"loop_max_keyframes must be at least 10, got {self.loop_max_keyframes}")
        if self.depth_width < 64 or self.max_features < 20 or self.depth_max_lag < 0:
            raise EngineError("depth_width must be ≥ 64, max_features ≥ 20 and depth_max_lag ≥ 0")
        self._input_size: Optional[tuple[int, int]] = None
        self._frames_in = 0
        self._queue: collections.deque[_Pending] = collections.deque()
        self._by_fid: dict[int, _Pending] = {}
        self._events: list[EngineEvent] = []
        self._kf_views: collections.deque = collections.deque(maxlen=10)
        self._kf_gray: dict[int, np.ndarray] = {}      # tracker keyframe → grey image (map-point reuse)
        self._gray: Optional[np.ndarray] = None
        self.reuse_radius = 8.0                        # px at 640 wide: a reused point lands this close to its projection
        self.reuse_max_sources = 3                     # keyframe images matched from per keyframe
        self.min_stereo_ratio = 0.012                  # last-resort stereo baseline / median depth
        self.stereo_partners = 3                       # keyframes fused per depth map
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geom-depth") if self.depth_enabled else None
        self._n_out = self._n_kf = self._n_untracked = 0
        self._latencies: collections.deque = collections.deque(maxlen=300)
        self._track_times: collections.deque = collections.deque(maxlen=100)
        self._track_cpu: collections.deque = collections.deque(maxlen=100)
        self._depth_cpu: collections.deque = collections.deque(maxlen=50)
        self._depth_times: collections.deque = collections.deque(maxlen=50)
        self._depth_wait = 0.0
        self._loop_wait = 0.0
        self._closed = False
        self.loop_enabled = bool(getattr(config, "loop_closure", True))
        self._loop: Optional[LoopCloser] = None
        self._loop_pool = None
        self._loop_jobs: collections.deque = collections.deque()   # (keyframe fid, Future)
        self._T_cur: dict[int, np.ndarray] = {}        # keyframe fid → current pose (similarity, node → world)
        self._anchors: dict[int, list] = {}            # segment → [(first fid, keyframe fid, pose as produced)]
        self._sent: dict[tuple, np.ndarray] = {}       # (segment, first fid) → last correction sent
        self._links: dict[int, tuple] = {}             # segment → (root segment, similarity into its world)
        self._n_links = 0
        self._n_cont = 0
        self._loop_seg: Optional[int] = None           # segment of the last keyframe given to the closer
        self._kept: dict[int, int] = {}                # ended segment → its keyframes still in the closer's database
        # relocalised while tracking: segment → (first frame continued, segment continued, placement
        # then): frames from there on are returned in that segment's world, with its id
        self._cont: dict[int, tuple] = {}
        self._whole: dict[int, np.ndarray] = {}        # result segment → last whole-segment realign sent
        self._epoch = 0                                # loop solutions applied
        self._loops_closed = 0
        self.tracker: Optional[MonoTracker] = None
        self.intrinsics_note = ""
        # focal self-calibration (no intrinsics stated; "focal self-calibration" below): the first
        # frames are held until the focal length is known, so K never changes once a frame is posed
        self.self_calibration = bool(getattr(config, "self_calibration", True))
        self._calib: Optional[FocalEstimator] = None
        self._held: list = []           # (fid, ids, uv, gray, detected ids, detected uv) while calibrating
        self.focal: Optional[FocalEstimate] = None
        self.focal_source = ""
        self.calib_min_frames = 20      # frames before the first estimate is trusted
        self.calib_max_frames = 60      # the hold ends here whatever the estimate's spread
        self.calib_target = 0.01        # relative sigma that ends the hold early
        self.calib_accept = 0.05        # relative sigma above which the assumed FOV is kept
        self.calib_refine_keyframes = 6 # keyframes of the scratch map before the focal bundle adjustment
        self.calib_max_held = 150       # frames held in all (memory bound: their images wait too)
        self._scratch: Optional[MonoTracker] = None

    # --- setup on the first frame ------------------------------------------------------------
    def _setup(self, w_in: int, h_in: int):
        intr, note = resolve_intrinsics(self.config, w_in, h_in)
        s = min(1.0, self.max_side / max(w_in, h_in))
        self.work_size = (max(32, int(round(w_in * s))), max(32, int(round(h_in * s))))
        self.intr = intr.scaled_to(*self.work_size)
        self.K = self.intr.matrix()
        ds = min(1.0, self.depth_width / self.work_size[0])
        self.depth_size = (max(32, int(round(self.work_size[0] * ds))), max(32, int(round(self.work_size[1] * ds))))
        self.K_depth = self.intr.scaled_to(*self.depth_size).matrix()
        px = self.work_size[0] / 640.0
        self.frontend = KLTFrontend(*self.work_size, max_features=self.max_features)
        params = dataclasses.replace(self._params, px=px)
        self.tracker = MonoTracker(self.K, params)
        if params.reuse_points:
            self.tracker.matcher = self._match_points
        if self.loop_enabled:
            self._loop = LoopCloser(self.K, dataclasses.replace(self._loop_params, max_keyframes=self.loop_max_keyframes),
                                    px=px)
            self._loop_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geom-loop")
        self._input_size = (w_in, h_in)
        self.intrinsics_note = note
        stated = getattr(self.config, "intrinsics", None) is not None or bool(getattr(self.config, "intrinsics_file", None))
        self.focal_source = "stated" if stated else "assumed"
        if not stated and self.self_calibration:
            self._calib = FocalEstimator(*self.work_size)
            note = f"{note}, self-calibrating the focal length over the first frames"
        self._events.append(EngineEvent("info", 0, message=f"geometric engine: {self.work_size[0]}×{self.work_size[1]}, "
                                                   f"intrinsics {note}; scale is arbitrary (monocular)"))
        if self.work_size != (w_in, h_in):
            self._events.append(EngineEvent("info", 0, message=(
                f"Input of {w_in}×{h_in} pixels is processed at a working size of {self.work_size[0]}×"
                f"{self.work_size[1]} (max_side {self.max_side}); results, depth and exports are at that size")))

    # --- contract ----------------------------------------------------------------------------
    def push(self, frame: Any, timestamp: Optional[float] = None) -> list[FrameResult]:
        if self._closed:
            raise EngineError("session is closed")
        t0 = time.perf_counter()
        c0 = time.thread_time()
        rgb = to_rgb_uint8(frame)
        h_in, w_in = rgb.shape[:2]
        if self._input_size is None:
            self._setup(w_in, h_in)
        elif (w_in, h_in) != self._input_size:
            raise FrameError(f"frame size changed from {self._input_size[0]}×{self._input_size[1]} to "
                             f"{w_in}×{h_in} within one session; open a new session for a new input")
        fid = self._frames_in
        self._frames_in += 1
        ts = float(timestamp) if timestamp is not None else fid / float(self.config.fps or 30.0)
        if (w_in, h_in) != self.work_size:
            rgb = cv2.resize(rgb, self.work_size, interpolation=cv2.INTER_AREA)
        gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
        rec = _Pending(fid, ts, rgb)
        self._queue.append(rec)
        self._by_fid[fid] = rec

        self._loop_poll(fid)
        ids, uv = self.frontend.track(gray)
        self._gray = gray
        if self._calib is not None or self._scratch is not None:
            self._hold(fid, ids, uv, gray)
            self._track_times.append(time.perf_counter() - t0)
            self._track_cpu.append(time.thread_time() - c0)
            out = self._drain(block_older_than=fid - self.depth_max_lag)
            self._latencies.append(time.perf_counter() - t0)
            return out
        self._track(fid, ids, uv, gray)
        self._track_times.append(time.perf_counter() - t0)
        self._track_cpu.append(time.thread_time() - c0)
        out = self._drain(block_older_than=fid - self.depth_max_lag)
        self._latencies.append(time.perf_counter() - t0)
        return out

    def flush(self) -> list[FrameResult]:
        if self.tracker is None:
            return []
        if self._calib is not None:
            self._start_map(self._calib.estimate())
        if self._scratch is not None:
            self._end_hold(self._scratch.refine_focal() if len(self._scratch.keyframes) >= 3 else None)
        self._apply(self.tracker.finish(), None)
        self._loop_poll(None)
        return self._drain(block_older_than=None, all_=True)

    def poll_events(self) -> list[EngineEvent]:
        ev, self._events = self._events, []
        return ev

    def stats(self) -> dict:
        lat = np.array(self._latencies) * 1e3 if self._latencies else None
        track_fps = len(self._track_times) / sum(self._track_times) if self._track_times else None
        recent = list(self._latencies)[-100:]
        fps = len(recent) / sum(recent) if recent else None
        dt, dc = list(self._depth_times), list(self._depth_cpu)   # snapshots: the worker appends
        depth_fps = len(dt) / sum(dt) if dt and sum(dt) > 0 else None
        pending = sum(1 for r in self._queue if r.future is not None and not r.future.done())
        return {
            "frames": self._n_out, "keyframes": self._n_kf, "fps": fps,
            "latency_ms": float(lat[-1]) if lat is not None else None,
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat is not None else None,
            "latency_p95_ms": float(np.percentile(lat, 95)) if lat is not None else None,
            "gpu_allocated_bytes": None, "gpu_reserved_bytes": None,
            "segments": (self.tracker.segment + 1) if self.tracker else 0,
            "tracked": self._n_out, "untracked": self._n_untracked, "frames_in": self._frames_in,
            "depth_pending": pending, "depth_fps": depth_fps, "tracking_fps": track_fps,
            # CPU seconds of the tracking / depth threads: speed without the other processes' load
            "tracking_cpu_ms": 1e3 * float(np.mean(self._track_cpu)) if self._track_cpu else None,
            "depth_cpu_ms": 1e3 * float(np.mean(dc)) if dc else None,
            "depth_wait_s": self._depth_wait, "map_points": self.tracker.n_points if self.tracker else 0,
            "map_points_reused": self.tracker.reused_total if self.tracker else 0,
            "rotation_aided_frames": self.tracker.rotation_aided_total if self.tracker else 0,
            "resolution": list(self.work_size) if self._input_size else None,
            "intrinsics": self.intrinsics_note or None,
            # the focal length in use at the working resolution; sigma only when self-calibrated
            "focal_px": float(self.K[0, 0]) if self._input_size else None,
            "focal_sigma_px": self.focal.sigma if self.focal is not None else None,
            "focal_source": self.focal_source or None,
            "self_calibrating_frames": len(self._held),      # held until the focal length is settled
            "loops_closed": self._loops_closed, "segments_relocalised": self._n_links,
            "segments_continued": self._n_cont,
            "loops_consistent": self._loop.loops_consistent if self._loop is not None else 0,
            "loops_rejected": self._loop.loops_rejected if self._loop is not None else 0, "loop_wait_s": self._loop_wait,
            "loop_cpu_ms": (1e3 * float(np.mean(list(self._loop.detect_cpu)[-50:]))
                            if self._loop is not None and self._loop.detect_cpu else None),
            "loop_keyframes": len(self._loop.db) if self._loop is not None else 0,
        }

    def memory(self, settle: bool = False) -> dict:
        """Sizes of the structures that could grow over a long run (soak benchmark, tests).
        settle: first wait until the loop worker has done every job queued so far (its answers
        are still applied at their usual frame), so the figures do not depend on its speed."""
        if settle:
            wait([f for _, f in self._loop_jobs])
        tr = self.tracker
        out = {"tracker_points": tr.n_points if tr else 0, "tracker_keyframes": len(tr.keyframes) if tr else 0,
               "tracker_tracks": len(tr.first_obs) if tr else 0, "tracker_poses": len(tr.poses) if tr else 0,
               "queue": len(self._queue), "poses": len(self._T_cur),
               "anchors": sum(len(a) for a in self._anchors.values()), "sent": len(self._sent),
               "links": len(self._links), "loop_jobs": len(self._loop_jobs),
               "reuse_images": len(self._kf_gray), "reuse_image_bytes": sum(g.nbytes for g in self._kf_gray.values())}
        if self._loop is not None:
            out.update({f"loop_{k}": v for k, v in self._loop.memory().items()})
        return out

    def close(self) -> None:
        if self._loop_pool is not None:
            self._loop_pool.shutdown(wait=True, cancel_futures=True)
            self._loop_pool = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._queue.clear()
        self._by_fid.clear()
        self._closed = True

    # --- internals ---------------------------------------------------------------------------
    def _apply(self, step, gray):
        for kind, seg, msg in step.events:
            self._events.append(EngineEvent(kind, seg, message=msg))
        for f in step.untracked:
            rec = self._by_fid.get(f)
            if rec is not None:
                rec.dropped = True
        new_kfs = []
        for pf in step.posed:
            rec = self._by_fid.get(pf.fid)
            if rec is None:
                continue
            rec.c2w, rec.is_kf, rec.segment = pf.c2w, pf.is_keyframe, pf.segment
            rec.world_scale = self.tracker.world_scale
            if pf.is_keyframe:
                new_kfs.append(rec)
        # register every new keyframe first, so the two keyframes of a fresh map pair up
        for rec in new_kfs:
            small = cv2.cvtColor(cv2.resize(rec.image, self.depth_size, interpolation=cv2.INTER_AREA),
                                 cv2.COLOR_RGB2GRAY)
            self._kf_views.append(DepthView(rec.fid, small, rec.c2w.copy(), rec.segment))
        reuse = self.tracker.matcher is not None
        for rec in new_kfs:
            # the keyframe's grey image at working size, made once for loop closure and map-point reuse
            gray = cv2.cvtColor(rec.image, cv2.COLOR_RGB2GRAY) if reuse or self._loop is not None else None
            self._loop_add(rec, gray)
            if reuse:       # kept as a reuse source as long as the tracker keeps the keyframe
                self._kf_gray[rec.fid] = gray
        if reuse and new_kfs:
            kept = {k.fid for k in self.tracker.keyframes}
            for f in [f for f in self._kf_gray if f not in kept]:
                del self._kf_gray[f]
        if new_kfs:
            # keyframes that had no usable neighbour may pair with the new ones
            for rec in [r for r in self._queue if r.deferred and not r.dropped] + new_kfs:
                self._submit_depth(rec)

    def _submit_depth(self, rec: _Pending, last_chance: bool = False):
        """Queue the depth job of keyframe `rec` with its best stereo (or plane-sweep) partner
        keyframes; with none it stays deferred. `last_chance` (it is about to go out without
        depth): posed non-keyframes waiting in the queue become partners too."""
        if self._pool is None:
            return
        view, cands = None, []
        for v in self._kf_views:
            if v.segment != rec.segment:
                continue
            pose = self.tracker.keyframe_pose(v.fid)   # bundle adjustment may have moved it
            if pose is None:
                continue
            if v.fid == rec.fid:
                view = DepthView(v.fid, v.gray, pose, v.segment)
            else:
                cands.append(DepthView(v.fid, v.gray, pose, v.segment))
        if view is None:
            return
        uv, z = self.tracker.visible_points(rec.fid)
        sd = self.depth_size[0] / self.work_size[0]
        nbrs = choose_neighbours(view, cands, self.tracker.median_depth, k=self.stereo_partners)
        if not nbrs and last_chance:
            # posed frames still waiting in the queue (non-keyframes; their poses are not bundle
            # adjusted, so keyframes come first): right after the map starts every held frame has
            # a pose, so the first keyframes get depth without waiting for later keyframes
            near = [_FrameView(r, self.depth_size) for r in self._queue if r.c2w is not None and not r.is_kf
                    and not r.dropped and r.segment == rec.segment]
            nbrs = choose_neighbours(view, near, self.tracker.median_depth)
            if not nbrs:
                # a start that mostly turns (short clips): one partner at a shorter baseline; its
                # far pixels fall to the triangulation-angle cull
                nbrs = choose_neighbours(view, cands + near, self.tracker.median_depth, k=1,
                                         min_ratio=self.min_stereo_ratio)
        sweep = False
        if not nbrs and not last_chance:   # no sideways baseline: plane sweep against neighbours in any direction
            nbrs = choose_sweep_neighbours(view, cands, self.tracker.median_depth)
            sweep = bool(nbrs)
        rec.deferred = not nbrs
        rec.depth_scale = rec.world_scale / self.tracker.world_scale
        if nbrs:
            rec.future = self._pool.submit(self._depth_job, view, nbrs, uv * sd, z, sweep)

    def _track(self, fid, ids, uv, gray) -> None:
        """Frame `fid`'s tracks (`ids`, `uv`, from the frontend on `gray`) through the tracker;
        the frontend follows the tracker's decisions (outliers, resets, revivals, new corners)."""
        try:
            step = self.tracker.process(fid, ids, uv)
        except Exception as exc:   # numerical corner cases must not end a live session
            step = self.tracker.recover(fid, f"internal error: {type(exc).__name__}: {exc}")
        if step.reset_tracks:
            self.frontend.reset()
            self._kf_gray.clear()       # a new map: the old keyframes' images are not sources any more
        else:
            self.frontend.remove(step.drop_ids)
            self.frontend.add(step.revived_ids, step.revived_uv)
        if step.need_features:
            new_ids, new_uv = self.frontend.detect(gray)
            self.tracker.add_tracks(fid, new_ids, new_uv)
        self._apply(step, gray)

    # --- focal self-calibration --------------------------------------------------------------
    # Three phases while no intrinsics are stated: (1) "pairs": the frames are held and their
    # tracks feed the two-view estimator (selfcal.py) until its spread is small or the hold is
    # full; (2) "map": a scratch tracker runs on the held and the following frames with that
    # focal length, nothing is returned, until its map has `calib_refine_keyframes` keyframes,
    # then a bundle adjustment over them refines the focal length; (3) a fresh frontend tracks
    # every held frame again into the session's tracker with the refined focal length and the
    # session goes on as usual (so the run is the run given that focal length).
    # Results are only ever produced with the final focal length, so no pose or depth is made
    # in one camera model and returned in another.
    def _hold(self, fid, ids, uv, gray) -> None:
        """A frame seen while calibrating (phases 1 and 2)."""
        det_ids, det_uv = np.zeros(0, np.int64), np.zeros((0, 2), np.float32)
        if self._scratch is None:
            # keep enough tracks alive (new corners whenever they thin out), so that pairs up to
            # the estimator's largest gap share tracks
            if len(ids) < 0.8 * self.max_features:
                det_ids, det_uv = self.frontend.detect(gray)
            self._calib.add_frame(np.concatenate([ids, det_ids]), np.concatenate([uv, det_uv]))
            self._held.append((fid, ids, uv, gray, det_ids, det_uv))
            n = len(self._held)
            est = None
            if n >= self.calib_max_frames or (n >= self.calib_min_frames and n % 5 == 0):
                est = self._calib.estimate()
            if n >= self.calib_max_frames or (est is not None and est.rel_sigma <= self.calib_target):
                self._start_map(est)
            return
        self._act(self._scratch_step(fid, ids, uv, gray, det_ids, det_uv, live=True))

    def _scratch_step(self, fid, ids, uv, gray, det_ids, det_uv, live: bool) -> str:
        """One frame through the scratch tracker (phase 2), kept for the replay. `live`: the
        frame is the current one, so new corners may be detected in it (held frames only bring
        the corners detected when they arrived). Returns "more", "refine" or "stop"."""
        tr = self._scratch
        try:
            step = tr.process(fid, ids, uv)
        except Exception:          # any trouble in the scratch map: keep the two-view estimate
            step = None
        if step is not None:
            self.frontend.remove(step.drop_ids)
            if step.need_features and live:
                det_ids, det_uv = self.frontend.detect(gray)
            if len(det_ids):
                tr.add_tracks(fid, det_ids, det_uv)
        self._held.append((fid, ids, uv, gray, det_ids, det_uv))
        if step is None or step.reset_tracks:
            return "stop"
        if len(tr.keyframes) >= self.calib_refine_keyframes:
            return "refine"
        return "stop" if len(self._held) >= self.calib_max_held else "more"

    def _act(self, what: str) -> None:
        if what == "refine":
            self._end_hold(self._scratch.refine_focal())
        elif what == "stop":
            self._end_hold(None)

    def _start_map(self, est: Optional[FocalEstimate]) -> None:
        """End of phase 1: adopt the two-view estimate when its spread is acceptable, else fall
        back to the assumed field of view (said once, as a warning) and replay at once; with an
        estimate, phase 2 starts on the held frames."""
        self._calib = None
        if est is None or est.rel_sigma > self.calib_accept:
            why = ("too few frame pairs with enough motion" if est is None else
                   f"estimate {est.focal:.1f} ± {est.sigma:.1f} px too uncertain")
            self.intrinsics_note = f"{self.intrinsics_note} (self-calibration failed: {why})"
            self._events.append(EngineEvent("warning", 0, message=(
                f"Focal length could not be self-calibrated ({why}); using the assumed {self.config.fov_deg:g}° "
                "field of view. Give intrinsics (intrinsics.txt or --intrinsics) for better geometry")))
            self._end_hold(None)
            return
        self._set_focal(est.focal)
        self.focal, self.focal_source = est, "self-calibrated"
        # the wait goes on until the scratch map is refined: say what is known so far
        self._events.append(EngineEvent("info", 0, message=(
            f"Focal length about {est.focal:.1f} ± {est.sigma:.1f} px from {est.pairs} frame pairs; refining it "
            f"over the first {self.calib_refine_keyframes} keyframes before the first poses")))
        self._scratch = MonoTracker(self.K, dataclasses.replace(self.tracker.p))
        held, self._held = self._held, []
        what = "more"
        for k, h in enumerate(held):
            what = self._scratch_step(*h, live=False)
            if what != "more":
                self._held += held[k + 1:]
                break
        self._act(what)

    def _set_focal(self, f: float) -> None:
        """Use focal length f (px at the working size; square pixels, centred principal point)."""
        w, h = self.work_size
        from ..intrinsics import Intrinsics
        self.intr = Intrinsics(f, f, (w - 1) / 2.0, (h - 1) / 2.0, w, h)
        self.K = self.intr.matrix()
        self.K_depth = self.intr.scaled_to(*self.depth_size).matrix()
        self.tracker.K = self.K.copy()
        if self._loop is not None:
            self._loop.K = self.K.copy()

    def _end_hold(self, refined) -> None:
        """End of phase 2: adopt the bundle adjustment's focal length (`refined` = (f, sigma), or
        None to keep the current one) and replay the held frames (phase 3)."""
        scratch, self._scratch, self._calib = self._scratch, None, None
        est = self.focal
        if refined is not None and est is not None:
            f, sigma = refined
            self._set_focal(f)
            self.focal = FocalEstimate(f, sigma, est.pairs, est.frames)
        if self.focal is not None:
            fov = 2 * np.degrees(np.arctan(self.work_size[0] / 2.0 / self.focal.focal))
            how = (f"{est.focal:.1f} ± {est.sigma:.1f} from {est.pairs} frame pairs, refined by bundle adjustment "
                   f"over {len(scratch.keyframes)} keyframes" if refined is not None and scratch is not None else
                   f"{est.pairs} frame pairs over {est.frames} frames")
            self.intrinsics_note = (f"self-calibrated: focal {self.focal.focal:.1f} ± {self.focal.sigma:.1f} px at "
                                    f"{self.work_size[0]}×{self.work_size[1]} ({fov:.1f}° horizontal FOV; {how})")
            self._events.append(EngineEvent("info", 0, message=f"Focal length {self.intrinsics_note}"))
        self._replay()

    def _replay(self) -> None:
        """Phase 3: the held frames through a fresh frontend and the session's tracker, as if they
        had just arrived (results, depth and loop closure as usual). Their images are tracked
        again rather than their held tracks replayed: the hold detects corners by its own rule
        (whenever tracks thin out), the tracker by its own (reference and keyframe needs), and
        which corners a map starts from changes a long run. Tracked again, a self-calibrated run
        is the run given that focal length as intrinsics, frame for frame."""
        held, self._held = self._held, []
        if not held:
            return
        self.frontend = KLTFrontend(*self.work_size, max_features=self.max_features)
        for fid, _ids, _uv, gray, _det_ids, _det_uv in held:
            self._loop_poll(fid)
            ids, uv = self.frontend.track(gray)
            self._gray = gray
            self._track(fid, ids, uv, gray)

    # --- map-point reuse ---------------------------------------------------------------------
    def _match_points(self, fid, R, t, ids, X, src_fid, src_uv, pred_uv):
        """The tracker's matcher: find map points in the current frame (`self._gray`) by
        Lucas-Kanade from the keyframe image where each was last seen, started at its projection
        (`pred_uv`); kept when the flow comes back to where it started (forward-backward < 1 px),
        lands near the prediction and the two 11×11 patches correlate (ZNCC ≥ 0.7)."""
        fe = self.frontend
        gate = self.reuse_radius * self.work_size[0] / 640.0
        w, h = self.work_size
        b = fe.border + 4
        out_ids, out_uv = [], []
        live = fe.pts
        inside = (pred_uv[:, 0] >= b) & (pred_uv[:, 1] >= b) & (pred_uv[:, 0] < w - b) & (pred_uv[:, 1] < h - b)
        held = np.array([f in self._kf_gray for f in src_fid.tolist()], bool) & inside
        # one flow call per source image (each builds both pyramids): the few sources that hold
        # the most candidates
        fids, counts = np.unique(src_fid[held], return_counts=True)
        for f in fids[np.argsort(-counts, kind="stable")][:self.reuse_max_sources].tolist():
            src = self._kf_gray[f]
            m = (src_fid == f) & held
            p0 = src_uv[m].astype(np.float32).reshape(-1, 1, 2)
            p1 = pred_uv[m].astype(np.float32).reshape(-1, 1, 2)
            p1, st, _ = cv2.calcOpticalFlowPyrLK(src, self._gray, p0, p1.copy(), winSize=fe.win, maxLevel=2,
                                                 criteria=fe._criteria, flags=cv2.OPTFLOW_USE_INITIAL_FLOW)
            if p1 is None:
                continue
            p0b, stb, _ = cv2.calcOpticalFlowPyrLK(self._gray, src, p1, p0.copy(), winSize=fe.win, maxLevel=2,
                                                   criteria=fe._criteria, flags=cv2.OPTFLOW_USE_INITIAL_FLOW)
            q0, q1 = p0.reshape(-1, 2), p1.reshape(-1, 2)
            fb = np.linalg.norm(p0b.reshape(-1, 2) - q0, axis=1)
            ok = (st.ravel() == 1) & (stb.ravel() == 1) & (fb < fe.fb_thresh) \
                & (np.linalg.norm(q1 - pred_uv[m], axis=1) < gate) \
                & (q1[:, 0] >= b) & (q1[:, 1] >= b) & (q1[:, 0] < w - b) & (q1[:, 1] < h - b)
            idm = ids[m]
            for k in np.flatnonzero(ok):
                if _zncc(src, q0[k], self._gray, q1[k]) < 0.7:
                    continue
                out_ids.append(int(idm[k]))
                out_uv.append(q1[k])
        if not out_ids:
            return np.zeros(0, np.int64), np.zeros((0, 2))
        out_uv = np.array(out_uv)
        if len(live):   # a live track already on that spot is the same corner: keep one of them
            d = np.min(np.linalg.norm(out_uv[:, None, :] - live[None, :, :], axis=2), axis=1)
            keep = d > 2.0
            return np.array(out_ids)[keep], out_uv[keep]
        return np.array(out_ids), out_uv

    # --- loop closure ------------------------------------------------------------------------
    def _loop_add(self, rec: _Pending, gray: Optional[np.ndarray]) -> None:
        """Register a new keyframe (`gray`: its grey image at working size) with the loop closer
        and queue its detection job."""
        seg = rec.segment
        T = np.array(rec.c2w, np.float64)
        self._T_cur[rec.fid] = T
        self._anchors.setdefault(seg, []).append((rec.fid, rec.fid, T))
        if self._loop is None:
            return
        data = self.tracker.keyframe_data(rec.fid)
        if data is None:
            return
        uv, P, cov = data
        if self._loop_seg is not None and seg != self._loop_seg:
            # the previous segment has ended: once its detections are done (queued before) the
            # closer drops its graph and we drop its correction state (Forget)
            self._loop_jobs.append((rec.fid, self._loop_pool.submit(self._loop.end_segment, self._loop_seg)))
        self._loop_seg = seg
        # the tracker's current poses of earlier keyframes, in the world this keyframe was produced in
        tposes = {f: self.tracker.keyframe_pose(f) for f in cov}
        tposes = {f: T_f for f, T_f in tposes.items() if T_f is not None}
        self._loop.add_keyframe(rec.fid, seg, T, self._T_cur.__getitem__, uv, P, gray, cov, self._epoch,
                                tracker_poses=tposes)
        self._loop_jobs.append((rec.fid, self._loop_pool.submit(self._loop.detect, rec.fid)))

    def _loop_poll(self, fid: Optional[int]) -> None:
        """Apply the loop closer's answers for keyframes at least `lag` frames old (all of them when
        fid is None), waiting for them if needed: results never depend on the worker's speed."""
        while self._loop_jobs and (fid is None or self._loop_jobs[0][0] + self._loop.p.lag <= fid):
            kfid, fut = self._loop_jobs.popleft()
            t0 = time.perf_counter()
            try:
                sol = fut.result()
            except Exception as exc:   # a failed detection must not end the session
                self._events.append(EngineEvent("warning", 0, message=f"loop detection at keyframe {kfid} failed: {exc}"))
                sol = None
            self._loop_wait += time.perf_counter() - t0
            if isinstance(sol, Forget):
                sol = [sol]
            for item in sol or []:
                if isinstance(item, SegmentLink):
                    self._apply_link(item, fid)
                elif isinstance(item, Forget):
                    self._forget(item)
                else:
                    self._apply_loop(item, fid)

    def _forget(self, item: Forget) -> None:
        """Drop the correction state the closer no longer needs: poses of forgotten keyframes and,
        for an ended segment, its frame-range anchors (nothing can move it again: its loops were
        all applied, its placement is fixed). A segment with no database keyframe left loses its
        placement too (no later segment can be placed through it)."""
        for f in item.fids:
            self._T_cur.pop(f, None)
        seg = item.segment
        if seg is not None:
            if self.tracker is not None and seg == self.tracker.segment:
                return   # (cannot happen: a segment ends when a later one has keyframes)
            self._anchors.pop(seg, None)
            self._cont.pop(seg, None)
            self._whole.pop(seg, None)
            for key in [k for k in self._sent if k[0] == seg]:
                del self._sent[key]
            self._kept[seg] = len(item.kept)
        else:
            for s in item.segments:
                if s in self._kept:
                    self._kept[s] -= 1
        for s in [s for s, n in self._kept.items() if n <= 0]:
            del self._kept[s]
            self._links.pop(s, None)
        for seg_m, c, p, R in item.merged:
            self._merge_node(seg_m, c, p, R)

    def _merge_node(self, seg: int, c: int, p: int, R: np.ndarray) -> None:
        """Pose-graph compaction: keyframe c now moves rigidly with keyframe p (T_c = T_p · R).
        Its frame ranges are re-pointed to p; consecutive ranges that then get the same correction
        become one (always, unless a loop correction bent c against p since they were produced)."""
        self._T_cur.pop(c, None)
        anchors = self._anchors.get(seg)
        if not anchors:
            return
        Rinv = sim3_inverse(R)
        anchors = sorted(((f, p, T @ Rinv) if a == c else (f, a, T) for f, a, T in anchors), key=lambda x: x[0])
        cont = self._cont.get(seg)
        out = [anchors[0]]
        dirty = False
        for f, a, T in anchors[1:]:
            pf, pa, pT = out[-1]
            if a == pa and np.abs(T - pT).max() < 1e-9 and not (cont is not None and f == cont[0]):
                # same correction as the range before: one range. If the two had different events,
                # the merged range is re-sent now (so every frame of it has the same latest event)
                a_sent, b_sent = self._sent.pop((seg, f), None), self._sent.get((seg, pf))
                if (a_sent is None) != (b_sent is None) or (a_sent is not None and np.abs(a_sent - b_sent).max() > 1e-9):
                    self._sent[(seg, pf)] = np.full((4, 4), np.nan)
                    dirty = True
                continue
            out.append((f, a, T))
        self._anchors[seg] = out
        if dirty:
            self._send_corrections(seg)

    def _apply_loop(self, sol, fid: Optional[int]) -> None:
        seg = sol.segment
        m = sol.query_fid
        C_m = sol.poses[m] @ sim3_inverse(self._T_cur[m])
        seg_fids = [f for f, a, _ in self._anchors.get(seg, []) if f == a]
        for f in seg_fids:
            if f in sol.poses:
                self._T_cur[f] = sol.poses[f]
            elif f > m:
                self._T_cur[f] = C_m @ self._T_cur[f]
        self._epoch += 1
        self._loops_closed += 1
        if fid is not None and self.tracker.initialised and self.tracker.segment == seg and seg_fids:
            # tracking goes on in the corrected world from this frame on
            self.tracker.transform_world(C_m)
            self.tracker.reuse_from = fid
            self._anchors[seg].append((fid, seg_fids[-1], self._T_cur[seg_fids[-1]].copy()))
        s_m = sim3_split(C_m)[0]
        self._events.append(EngineEvent("info", seg, message=(
            f"Loop closed: keyframe {m} matches keyframe {sol.match_fid} ({sol.inliers} points, loop scale "
            f"{sol.scale:.3f}); {len(sol.poses)} keyframes corrected (latest moved by scale {s_m:.3f})")))
        self._send_corrections(seg)

    def _placement(self, seg: int) -> np.ndarray:
        """Similarity placing segment `seg`'s world in the world of the first segment it is linked
        to (through relocalisation, chains flattened); identity for an unlinked segment."""
        return self._links[seg][1] if seg in self._links else np.eye(4)

    def _apply_link(self, link, fid: Optional[int] = None) -> None:
        """Relocalisation: a keyframe of a new segment was recognised in an earlier segment's map.
        The new segment is placed in that world by a whole-segment "realign" event (and its
        frame-range corrections are re-sent composed with the placement). When the new segment is
        still being tracked, tracking *continues the lost segment*: frames from `fid` on are
        returned in the lost segment's world (the placement applied) with its id."""
        if link.segment in self._links or link.query_fid not in self._T_cur or link.match_fid not in self._T_cur:
            return
        seg = link.segment
        L = self._T_cur[link.match_fid] @ link.S @ sim3_inverse(self._T_cur[link.query_fid])
        root = self._links[link.target][0] if link.target in self._links else link.target
        self._links[seg] = (root, self._placement(link.target) @ L)
        self._n_links += 1
        moved = {seg}
        for other, (r, Ls) in list(self._links.items()):
            if r == seg:     # placed in this segment's world before it was placed itself
                self._links[other] = (root, self._links[seg][1] @ Ls)
                moved.add(other)
        live = (fid is not None and self.tracker is not None and self.tracker.initialised
                and self.tracker.segment == seg and self._anchors.get(seg))
        if live:
            last_node = [a for f, a, _ in self._anchors[seg] if f == a][-1]
            self._anchors[seg].append((fid, last_node, self._T_cur[last_node].copy()))
            self._cont[seg] = (fid, root, self._links[seg][1].copy())
            self._n_cont += 1
            self._events.append(EngineEvent("info", root, message=(
                f"Relocalised: tracking continues segment {root} from frame {fid} (keyframe {link.query_fid} "
                f"matches keyframe {link.match_fid} of segment {link.target}, {link.inliers} points); "
                f"frames {self._anchors[seg][0][0]}–{fid - 1} of segment {seg} are placed in its map")))
        else:
            self._events.append(EngineEvent("info", seg, message=(
                f"Relocalised: segment {seg} is placed in the map of segment {link.target} "
                f"(keyframe {link.query_fid} matches keyframe {link.match_fid}, {link.inliers} points)")))
        fresh = set()
        for other in sorted(self._anchors):
            if other in moved:
                P = self._placement(other)
                self._events.append(EngineEvent("realign", other, P))
                self._whole[other] = P
                fresh.add(other)
        for other in sorted(self._anchors):
            if other in moved:
                self._send_corrections(other, fresh=fresh)

    def _send_corrections(self, seg: int, fresh: frozenset = frozenset()) -> None:
        """One absolute "realign" event per frame range of the segment whose correction changed,
        composed with the segment's placement when it was relocalised in an earlier map. Ranges
        returned in a continued segment's world (and id) are relative to the placement they were
        returned with. `fresh`: result segments that just got a whole-segment event (it replaced
        every earlier event on them, so every range that differs from it is re-sent)."""
        anchors = sorted(self._anchors.get(seg, []), key=lambda a: a[0])
        last_fid = self._frames_in - 1
        P = self._placement(seg)
        cont = self._cont.get(seg)
        eye = np.eye(4)
        for k, (first, node, T_ref) in enumerate(anchors):
            last = anchors[k + 1][0] - 1 if k + 1 < len(anchors) else last_fid
            if last < first:
                continue
            if cont is not None and first >= cont[0]:
                out_seg, emitted = cont[1], cont[2]
            else:
                out_seg, emitted = seg, eye
            C = P @ self._T_cur[node] @ sim3_inverse(T_ref) @ sim3_inverse(emitted)
            base = self._whole.get(out_seg, eye)
            prev = base if out_seg in fresh else self._sent.get((seg, first), base)
            if np.abs(C - prev).max() < 1e-9:
                continue
            self._sent[(seg, first)] = C
            self._events.append(EngineEvent("realign", out_seg, C, frames=(first, last)))

    def _depth_job(self, view, nbrs, uv, z, sweep=False):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            res = keyframe_depth(view, nbrs, self.K_depth, uv, z, self.work_size, sweep=sweep)
            if res is not None:
                d, c, _ = limit_depth(res[0], res[1], z, self.max_depth_ratio)
                res = (d, c)
            return res
        finally:
            self._depth_times.append(time.perf_counter() - t0)
            self._depth_cpu.append(time.thread_time() - c0)

    def _drain(self, block_older_than: Optional[int], all_: bool = False) -> list[FrameResult]:
        out = []
        while self._queue:
            rec = self._queue[0]
            if rec.dropped:
                self._queue.popleft()
                self._by_fid.pop(rec.fid, None)
                self._n_untracked += 1
                continue
            if rec.c2w is None:
                break
            if rec.deferred and not all_ and (block_older_than is None or rec.fid > block_older_than):
                break   # may still find a neighbour in the next keyframe
            if rec.deferred:
                self._submit_depth(rec, last_chance=True)
            if rec.future is not None and not rec.future.done():
                if not all_ and (block_older_than is None or rec.fid > block_older_than):
                    break
                t0 = time.perf_counter()
                wait([rec.future])
                self._depth_wait += time.perf_counter() - t0
            self._queue.popleft()
            self._by_fid.pop(rec.fid, None)
            out.append(self._result(rec))
        return out

    def _result(self, rec: _Pending) -> FrameResult:
        depth = conf = None
        c2w = rec.c2w
        if rec.is_kf:
            self._n_kf += 1
            if rec.future is not None:
                try:
                    res = rec.future.result()
                except Exception as exc:  # a failed depth map must not end the session
                    self._events.append(EngineEvent("warning", rec.segment,
                                                    message=f"depth of keyframe {rec.fid} failed: {exc}"))
                    res = None
                if res is not None:
                    depth, conf = res
                    if depth is not None and rec.depth_scale != 1.0:
                        depth = depth * np.float32(rec.depth_scale)
        self._n_out += 1
        res = FrameResult(index=rec.fid, timestamp=rec.timestamp, is_keyframe=rec.is_kf,
                          c2w=np.array(c2w, np.float64), K=self.K.copy(), image=rec.image,
                          depth=depth, conf=conf, segment=rec.segment)
        cont = self._cont.get(rec.segment)
        if cont is not None and rec.fid >= cont[0]:
            # relocalised while tracking: returned in the continued segment's world, with its id
            res = dataclasses.replace(apply_similarity(res, cont[2]), segment=cont[1])
        return res

"""The "lingbot-map" streaming session: LingBot-Map over the paged KV cache, one frame per push.

Flow (the engine contract in shared/DESIGN.md):
1. every pushed frame is preprocessed (engine/preprocess.py, shared with VGGT) to the model resolution, which is
   fixed by the first frame;
2. **scale phase**: the first `scale_frames` frames are buffered (push returns []) and then run
   together, attending to each other bidirectionally; that push returns all of them. A stream
   shorter than `scale_frames` runs its scale phase at `flush()`;
3. then one frame per push, attending to the KV cache (scale frames, the `window` newest cached
   frames, the special tokens of up to `special_cap` cached frames) and to itself;
4. **keyframes**: frame i (i >= number of scale frames) is a keyframe when
   `(i - scale) % keyframe_interval == 0`. Only keyframes stay cached: for any other frame the KV
   cache and the camera cache are rolled back exactly and the time index does not advance;
5. per frame: pose encoding -> c2w + K (engine/pose.py; for LingBot-Map the decoded [R|t] *is*
   camera-to-world), depth and confidence at the model resolution.

A step (the scale step, or one streamed frame) runs in named phases, each implemented once here:
`prepare_step` (frame intake, keyframe decision) -> `run_steps` (`step_begin`: both caches opened,
`forward_steps`: the network, `step_commit` / `step_abort`) -> `step_results`. `push` runs them for
its own step; the scheduler (engine/scheduler.py) runs the same phases for one streamed step of each
of several sessions around ONE `forward_steps` call that stacks their frames.

Dtypes: the trunk runs in `dtype` (fp32 / bf16 / fp16); the camera and depth heads and the camera
cache stay float32 (as upstream). The global KV cache stores `kv_dtype` ("auto" = compute dtype).

Position limit (3D RoPE time index)
-----------------------------------
The global blocks place frame f at time position f, where f counts the *cached* frames (scale
frames, then keyframes; non-keyframes take the next free position and give it back). Upstream
looks positions up in a table of `max_frame_num` = 1024 rows and fails once f reaches it; the model
was trained with at most 320 cached views. Policy here: **positions are computed from the RoPE
formula, so f keeps counting past 1024 and a stream of any length runs.** This changes nothing
numerically below 1024 (the formula *is* the table), and it is sound past it because attention
under RoPE depends only on position differences: q_f . k_g = function of (f - g). What the
model sees is therefore bounded by the cache policy, not by f: window frames are at most
`window - 1` positions back; only the scale frames and the retained special tokens are far away,
exactly as upstream in its first 1024 frames. Two events mark the crossings: a "warning" when f
passes the trained range (320 cached views; accuracy may degrade), and an "info" when it passes
the released table size (where upstream would stop). Memory does not depend on f: the KV pages,
the special stream (special_cap frames) and the camera cache (scale + special_cap frames) are all
allocated once.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ..api import EngineError, EngineEvent, FrameResult, SessionConfig, check_settings
from ..fast_path import lingbot_fast_path, lingbot_whole_step, step_graph_stats
from ..pose import decode_pose
from ..session_timing import SessionTiming, resolve_device
from ..models.layers import kernel_errors


def _config_error(msg: str) -> EngineError:
    return EngineError(f"LingBot-Map settings: {msg}")


def _validate(cfg: SessionConfig) -> None:
    """Each value against its declared type, choices and range (`check_settings`, the one check),
    then what relates fields to each other or to this session."""
    check_settings(cfg, _config_error)
    if cfg.mode != "streaming":
        raise _config_error(f"mode {cfg.mode!r} is not available for this engine; use 'streaming'")
    if cfg.image_width % 14:
        raise _config_error(f"image_width must be a multiple of 14 (got {cfg.image_width})")
    if cfg.special_cap < cfg.scale_frames + cfg.window:
        raise _config_error(f"special_cap ({cfg.special_cap}) must be at least scale_frames + window "
                            f"({cfg.scale_frames + cfg.window})")


def _device(cfg: SessionConfig) -> torch.device:
    return resolve_device(cfg.device, _config_error)


def model_device(cfg: SessionConfig) -> torch.device:
    """The device a LingBot-Map session of `cfg` runs on (a settings error if it is unknown or absent)."""
    return _device(cfg)


def load_model(cfg: SessionConfig):
    """The network sessions of `cfg` run (what engine.shared_streams loads once for several
    streams): the settings are checked first, so a bad value fails before a multi-GB load."""
    _validate(cfg)
    from ..kv.dtypes import COMPUTE_DTYPES
    return load_lingbot_map(cfg, _device(cfg), COMPUTE_DTYPES[cfg.dtype])


def load_lingbot_map(cfg: SessionConfig, device: torch.device, dtype: torch.dtype):
    """Build the architecture (`cfg.model`, default the released "lingbot-map") on
    `device` in `dtype` and load `cfg.checkpoint` into it (strict; CheckpointError says what is wrong)."""
    if not cfg.checkpoint:
        raise EngineError("LingBot-Map needs weights: choose a checkpoint file (lingbot-map.pt, "
                          "lingbot-map-long.pt or a .safetensors export) in the settings")
    from ..checkpoint import load_checkpoint
    from ..model_zoo import build_model
    with torch.device(device):
        model = build_model(str(cfg.model or "lingbot-map"))
    model.set_dtype(dtype)
    load_checkpoint(model, cfg.checkpoint)
    return model


class LingBotMapSession(SessionTiming):
    """Streaming session of the "lingbot-map" engine (see the module docstring).

    A model passed in is moved to `device` and converted to `dtype` in place (trunk only)."""

    _SESSION_NAME = "LingBot-Map"

    def __init__(self, config: SessionConfig, model: Any = None):
        _validate(config)
        from .model import LingBotMap
        # the memory plan (engine/memory_plan.py) decides window / KV / weight precision /
        # compression for the budget before anything is loaded or allocated; it raises
        # MemoryPlanError when nothing fits. The session runs the planned config.
        from ..memory_plan import apply_plan, session_plan
        self.requested_config = config
        planning_model = model if model is None or isinstance(model, LingBotMap) else None
        self.memory_plan = (session_plan(config, planning_model, _device(config))
                            if model is None or planning_model is not None else None)
        config = apply_plan(config, self.memory_plan)
        # config, device, dtype, the model (converted in place), events, timing (engine/session_timing.py)
        self._open_model(config, model, engine="lingbot-map", kind=LingBotMap, load=load_lingbot_map,
                         error=_config_error)
        if config.weight_dtype in ("int8", "fp8"):      # trunk linear weights via torchao, in place
            from ..weight_quant import quantize_trunk
            quantize_trunk(self.model, config.weight_dtype)
        elif getattr(self.model, "weight_dtype", None):
            self._events.append(EngineEvent("warning", message=(
                f"the model's trunk weights were quantized to {self.model.weight_dtype} by an earlier "
                f"session; reload the checkpoint for unquantized weights")))
        # CUDA graphs for the fixed-shape parts (engine/models/graphs.py); a fresh cache per
        # session, since captured graphs point at the weights as converted above.
        use_graphs = (self.device.type == "cuda" and bool(config.cuda_graphs)
                      and getattr(self.model, "weight_dtype", None) is None)   # quantized: eager
        from ..models.graphs import GraphCache
        self.model.aggregator.graphs = GraphCache() if use_graphs else None
        self.model.step_graph_error = None      # a fresh graph cache tries whole-step graphs again
        self.model.step_graph_pool_bytes = 0
        self.model.step_graph_replays = 0      # counted per graph cache (a bench reuses one model)
        self.model._step_keys_run.clear()       # (keys hold cache ids, which a new session may reuse)
        # opt-in (setting compile_blocks): the blocks' norm/residual
        # halves under torch.compile (engine/models/compile.py; GPU-tested; off by default for its
        # compile time at the first frames)
        from ..models.compile import blocks_compiled, compile_blocks, uncompile_blocks
        if self.device.type == "cuda" and config.compile_blocks:
            compile_blocks(self.model)
        elif blocks_compiled(self.model):
            uncompile_blocks(self.model)
        from ..kv.dtypes import kv_precision
        self.kv_precision = kv_precision(config.dtype, config.kv_dtype)   # decided once, here
        self.kv_dtype = self.kv_precision.storage
        self.kv = None                  # PagedKVCache, built at the first step (needs the token count)
        self._closed_cache_stats = {"kv": None, "kv_page_map": None, "camera_cache": None}
        self._closed_paths = None       # stats()'s "step_graph" and "fast_path" as they were at close()
        self.caches = None              # StreamCaches(kv, camera_cache)
        self.camera_cache = None
        self._hw: Optional[tuple[int, int]] = None
        self._pending: list = []        # scale-phase frames: (index, timestamp, Prepared)
        self._num_scale = 0             # frames in the scale phase once it ran
        self._next_index = 0
        self._time = 0                  # 3D-RoPE time index of the next cached frame
        self._frames = 0
        self._keyframes = 0
        from ..host_copy import HostCopies
        self._host = HostCopies(self.device)    # outputs on their way to the host (see _deliver)
        # On CUDA a streamed frame's results come back from the NEXT push (or flush): the host
        # then never waits for the GPU inside a step and prepares frame N+1 while the GPU runs N
        # (engine/host_copy.py). False: every push returns its own frame (one sync per frame).
        self.defer_results = self.device.type == "cuda"

    # ------------------------------------------------------------------ contract
    def push(self, frame, timestamp: Optional[float] = None) -> list[FrameResult]:
        t0 = time.perf_counter()
        step = self.prepare_step(frame, timestamp)
        if step is None:                # a scale frame buffered
            return []
        return self._timed(t0, lambda: self._run(step))

    def flush(self) -> list[FrameResult]:
        self._check_open()
        if self._num_scale == 0 and self._pending:
            return self._timed(time.perf_counter(), lambda: self._run(self._scale_step()))
        if len(self._host):             # a streamed frame whose results are still in flight
            return self._timed(time.perf_counter(), lambda: self._deliver(keep=0))
        return []

    def stats(self) -> dict:
        caches = self._cache_stats() if self.kv is not None else self._closed_cache_stats
        paths = self._closed_paths or self._paths(caches["kv"])
        out = {
            "frames": self._frames,
            "keyframes": self._keyframes,
            **self._timing_stats(),
            **self._gpu_stats(),
            "segments": 1,
            **caches,
            "time_index": self._time,
            # whole-step CUDA graphs: on, or why not (the same decision as fast_path's reason)
            "step_graph": paths["step_graph"],
            # why a fast kernel was given up for the process (None: in use where it applies)
            "kernel_errors": kernel_errors(),
            "pending_scale_frames": len(self._pending),
            "resolution": (self._hw[1], self._hw[0]) if self._hw else None,
            # the settings the memory budget allowed, with its accounting and reasons
            "memory_plan": self.memory_plan.as_dict() if self.memory_plan is not None else None,
            # graphs / attention path of these settings, or why they leave the fast path
            "fast_path": paths["fast_path"],
        }
        return out

    def _paths(self, kv_stats: Optional[dict]) -> dict:
        """stats()'s "step_graph" and "fast_path", both from ONE decision (engine/fast_path.py
        `lingbot_whole_step`). `kv_stats`: the KV cache's stats() that stats() already has."""
        decision = lingbot_whole_step(self, kv_stats)
        return {"step_graph": step_graph_stats(self.model, decision),
                "fast_path": lingbot_fast_path(self, kv_stats, decision)}

    def _cache_stats(self) -> dict:
        return {"kv": self.kv.stats(), "kv_page_map": self.kv.page_map(),
                "camera_cache": self.camera_cache.stats() if self.camera_cache is not None else None}

    def poll_events(self) -> list[EngineEvent]:
        ev, self._events = self._events, []
        return ev

    def collect_in_flight(self) -> list[FrameResult]:
        """Results of streamed frames still on their way to the host (`defer_results`), oldest
        first, waiting for their copies; [] when none. A scheduler that runs this session's next
        step in a batch takes them first, so the stream's results stay in order."""
        self._check_open()
        return self._deliver(keep=0) if len(self._host) else []

    def close(self) -> None:
        """Frees the session's GPU memory at once (KV pools, camera cache, CUDA graphs): nothing
        else holds them and they are in no reference cycle, so refcounting alone releases them."""
        self._closed = True
        if self.kv is not None:     # what the caches held at the end stays visible (monitors, summaries)
            self._closed_cache_stats = self._cache_stats()
        if self._closed_paths is None:
            self._closed_paths = self._paths(self._closed_cache_stats["kv"])
        self.model.aggregator.graphs = None     # free the captured graphs' buffers
        self.kv = None
        self.camera_cache = None
        self.caches = None
        self._pending.clear()
        self._host.clear()          # a frame still in flight is dropped (flush() first to keep it)

    # ------------------------------------------------------------------ step phases
    # A step is the scale step (the buffered scale frames at once, bidirectional) or one streamed
    # frame. Its phases, each implemented once, here:
    #   prepare_step -> run_steps(step_begin, forward_steps, step_commit | step_abort) -> step_results
    # `push` runs them for its own step; the scheduler (engine/scheduler.py) runs the very same
    # phases for one streamed step of each of several sessions, around ONE `forward_steps` call.
    @property
    def streaming(self) -> bool:
        """The scale phase ran: every further step is one streamed frame."""
        return self._num_scale > 0

    def prepare_step(self, frame, timestamp: Optional[float] = None) -> Optional["Step"]:
        """Phase 1: preprocess and number `frame` (the first one fixes the size) and decide what
        runs: None while the scale phase still buffers, else the Step (keyframe decided here)."""
        self._check_open()
        prep, index, ts = self._take_frame(frame, timestamp)
        if not self.streaming:
            self._pending.append((index, ts, prep))
            if len(self._pending) < self.config.scale_frames:
                return None
            return self._scale_step()
        k = self.config.keyframe_interval
        keyframe = k <= 1 or (index - self._num_scale) % k == 0
        return Step(self, [(index, ts, prep)], scale=False, keyframe=keyframe)

    def _scale_step(self) -> "Step":
        # the buffered frames stay in _pending until the step commits (a failed step keeps them)
        return Step(self, list(self._pending), scale=True, keyframe=True)

    def step_begin(self, step: "Step") -> None:
        """Phase 2: open the step in both caches (built at the first step) and give it what the
        network reads: the model's view of the KV cache, the camera cache, the time indices."""
        self._ensure_caches()
        n = len(step.items)
        self.caches.begin_step(n, scale=step.scale, keyframe=step.keyframe)
        step.kv, step.camera_cache = _KVAdapter(self.kv), self.camera_cache
        step.time_index = range(self._time, self._time + n)

    def step_abort(self, step: "Step") -> None:
        """The network call failed: both caches exactly as before the step."""
        self.caches.abort_step()
        step.kv = step.camera_cache = None      # a step kept for its results holds no cache

    def step_commit(self, step: "Step") -> None:
        """Phase 4: a keyframe stays cached and advances the time index; any other frame's writes
        are rolled back (the caches' keyframe rule). The scale step ends the scale phase."""
        self.caches.end_step()
        step.kv = step.camera_cache = None
        if step.keyframe:
            self._advance_time(len(step.items))
        if step.scale:
            self._pending = []
            self._num_scale = len(step.items)

    def step_results(self, step: "Step", arrays: dict, row: int = 0,
                     seconds: Optional[float] = None) -> list[FrameResult]:
        """Phase 5: FrameResults of the step from the network outputs on the host (`arrays`,
        STEP_OUTPUTS; the step's frames at rows row, row + 1, ...). `seconds`: record a model run of
        that length (a batched round; `push` times itself)."""
        if seconds is not None:
            self._record_run(seconds, len(step.items))
        return [self._result(row + i, idx, ts, prep, arrays, step.keyframe)
                for i, (idx, ts, prep) in enumerate(step.items)]

    def _run(self, step: "Step") -> list[FrameResult]:
        """This session's step alone (push / flush): the phases around its own network call. The
        scale step's results come at once; a streamed frame's from the next push when deferred."""
        forward = None                                          # model.forward_step
        if step.scale and self.config.sequence_parallel != "off":   # ring attention over the ranks
            from ..parallel.lingbot_ring import ring_forward
            forward = ring_forward(self.model, self.config)
        try:
            out = run_steps([step], lambda: forward_steps(self.model, [step], self.config.camera_iterations,
                                                          forward=forward))
        except torch.OutOfMemoryError as exc:
            h, w = self._hw
            raise EngineError(f"out of {self.device.type.upper()} memory running LingBot-Map at {w}x{h} "
                              f"(dtype {self.config.dtype}, window {self.config.window}); use bf16, a "
                              f"smaller window or a smaller image width") from exc
        self._host.submit(out, step)
        return self._deliver(keep=1 if self.defer_results and not step.scale else 0)

    def _ensure_caches(self) -> None:
        if self.kv is not None:
            return
        from ..kv import PagedKVCache, make_compressor
        from ..kv.coordinator import StreamCaches
        h, w = self._hw
        patches = (h // 14) * (w // 14)
        self.replan(patches)
        cfg, geo = self.config, self.model.kv_geometry()
        self.kv = PagedKVCache(geo["num_layers"], geo["num_heads"], geo["head_dim"], patches,
                               special_tokens=geo["special_tokens"], scale_frames=cfg.scale_frames,
                               window=cfg.window, special_cap=cfg.special_cap, dtype=self.kv_precision,
                               device=self.device,
                               backend=cfg.backend,
                               compression=make_compressor(cfg.kv_compression, cfg.kv_keep_ratio,
                                                           cfg.kv_block_size, cfg.kv_seed))
        agg = self.model.aggregator
        if agg.graphs is not None and agg.graph_scope == "step":
            # streamed steps as one CUDA graph where the backend attends with fixed shapes
            # (the cuDNN split; engine/lingbot/model.py `_graphed_step`)
            self.kv.enable_static_steps()
        self.camera_cache = self.model.new_camera_cache(cfg.camera_iterations, cfg.scale_frames, cfg.special_cap)
        self.caches = StreamCaches(self.kv, self.camera_cache)     # stepped together

    def replan(self, patches: int) -> None:
        """The plan again at the frame size the first frame fixed, or that the scheduler was told
        (the plan at open assumed the 518x378 aspect), with the weights as already applied; raises
        before the KV allocation."""
        plan = self.memory_plan
        if plan is None or plan.patch_tokens == patches:
            return
        from ..kv.dtypes import kv_precision
        from ..memory_plan import apply_plan, explicit_fields, model_facts, plan_memory
        req = self.requested_config
        plan = plan_memory(req, plan.budget_bytes / 2**30, model_facts(self.model, req.dtype), patch_tokens=patches,
                           explicit=explicit_fields(req), fixed_weights=self.config.weight_dtype)
        self.memory_plan = plan
        self.config = apply_plan(req, plan)
        self.kv_precision = kv_precision(self.config.dtype, self.config.kv_dtype)
        self.kv_dtype = self.kv_precision.storage

    def _timed(self, t0: float, run) -> list:
        """As SessionTiming._timed, without its GPU synchronisation when results are deferred
        (the push's wall time is then the figure: the GPU work it queued is paid by later pushes)."""
        if not (self.defer_results and self.device.type == "cuda"):
            return super()._timed(t0, run)
        results = run()
        self._record_run(time.perf_counter() - t0, len(results))
        return results

    def _deliver(self, keep: int) -> list[FrameResult]:
        """FrameResults of the steps whose outputs reached the host, oldest first, leaving the
        newest `keep` in flight."""
        out = []
        for step, host in self._host.take(keep):
            out += self.step_results(step, host)
        return out

    def _advance_time(self, n: int) -> None:
        before, self._time = self._time, self._time + n
        mc = self.model.config
        if before < mc.trained_views <= self._time:
            self._events.append(EngineEvent("warning", message=(
                f"{self._time} frames cached: past the {mc.trained_views} views LingBot-Map was trained "
                f"on; the scale-frame anchor is now far in time and accuracy may degrade")))
        if before < mc.max_frame_num <= self._time:
            self._events.append(EngineEvent("info", message=(
                f"{self._time} frames cached: past the released 3D-RoPE table ({mc.max_frame_num}); "
                f"positions continue from the formula (upstream stops here)")))

    def _result(self, i: int, index: int, ts: float, prep, out: dict, keyframe: bool) -> FrameResult:
        h, w = self._hw
        c2w, K = decode_pose(out["pose_enc"][i], (h, w), convention="c2w")
        self._frames += 1
        self._keyframes += int(keyframe)
        return FrameResult(index=index, timestamp=ts, is_keyframe=keyframe, c2w=c2w, K=K, image=prep.image,
                           depth=out["depth"][i].astype(np.float32), conf=out["conf"][i].astype(np.float32),
                           pose_enc=out["pose_enc"][i].astype(np.float32), segment=0)


# CUDA graphs on by default on CUDA devices (SessionConfig.cuda_graphs overrides): a replay is one
# launch instead of dozens, its outputs equal to eager (speed: docs/benchmarks.md).
CUDA_GRAPHS_DEFAULT = True


class _KVAdapter:
    """The model's view of the KV cache (write / attend); the cache converts q to its attention
    dtype and the output back itself (engine/kv/dtypes.py decides both once)."""

    __slots__ = ("kv",)

    def __init__(self, kv):
        self.kv = kv

    def write(self, layer, k, v):
        self.kv.write(layer, k, v)

    def attend(self, layer, q):
        return self.kv.attend(layer, q)

    def static_key(self):
        """The cache's key for a step with fixed shapes and pointers (with the cache's identity:
        sessions sharing a model share its graphs), or None."""
        key = self.kv.static_key()
        return None if key is None else (id(self.kv), *key)


# ---------------------------------------------------------------------- one step, several sessions
STEP_OUTPUTS = ("pose_enc", "depth", "conf")    # what FrameResult carries; nothing else is copied


@dataclass(eq=False)
class Step:
    """One step of a LingBotMapSession between its phases (see "step phases" in the class)."""

    session: LingBotMapSession
    items: list                             # [(index, timestamp, Prepared)], oldest first
    scale: bool                             # the scale step: its frames together, bidirectional
    keyframe: bool                          # stays cached (the scale step always does)
    kv: Any = None                          # set by step_begin: what the network is called with
    camera_cache: Any = None
    time_index: Optional[range] = None      # 3D-RoPE positions of the step's frames

    @property
    def frame_shape(self) -> tuple:
        """[3, H, W] of its frames (the model resolution)."""
        return tuple(self.items[0][2].tensor.shape)


def run_steps(steps: Sequence[Step], network: Callable[[], dict]) -> dict:
    """Begin every step in its session, run `network()`, commit every step; if anything fails,
    the steps begun so far are aborted (their caches exactly as before) and the error raised."""
    begun = []
    try:
        for st in steps:
            st.session.step_begin(st)
            begun.append(st)
        out = network()
    except BaseException:
        for st in begun:
            st.session.step_abort(st)
        raise
    for st in steps:
        st.session.step_commit(st)
    return out


def _to_device(tensors: list, device: torch.device) -> torch.Tensor:
    """[N, 3, H, W] on `device` from N frame tensors. Pinned inputs stay pinned (one frame: a view;
    several: stacked into a pinned block), so the copy is asynchronous and the host does not wait
    for the GPU's queued work; otherwise (the CPU) a fresh stack, which the model may change freely."""
    if device.type != "cuda":
        return torch.stack(tensors)
    if len(tensors) == 1:
        batch = tensors[0].unsqueeze(0)
    elif all(t.is_pinned() for t in tensors):
        batch = torch.stack(tensors, out=torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype,
                                                     pin_memory=True))
    else:
        batch = torch.stack(tensors)
    return batch.to(device, non_blocking=True)


def forward_steps(model, steps: Sequence[Step], iterations: int, side_streams=None, forward=None) -> dict:
    """Phase 3, the network over begun steps -> STEP_OUTPUTS, the steps' frames in order.

    One step (of any number of frames) runs exactly as its session alone. Several streamed steps
    of different sessions (one frame each) are stacked into ONE forward: patch embed, frame blocks
    and heads run once; each frame's global attention and camera-head attention go to its own
    session's caches (BatchKV / BatchCameraCache, engine/kv/batch_attention.py; `side_streams`:
    their per-session attention side by side on CUDA). `forward`: a replacement for
    `model.forward_step` with its signature (the ring's sequence-parallel scale step)."""
    first = steps[0]
    images = _to_device([p.tensor for st in steps for _, _, p in st.items], first.session.device)
    if len(steps) == 1:     # its own caches (and, on CUDA, their per-cache graphs)
        kv, camera, times = first.kv, first.camera_cache, first.time_index
    else:                   # fresh adapters each round: the model must not graph them (S > 1)
        if any(st.scale or len(st.items) != 1 for st in steps):
            raise ValueError("only streamed steps (one frame each) of different sessions are batched")
        from ..kv.batch_attention import BatchCameraCache, BatchKV
        kv = BatchKV([st.kv for st in steps], side_streams)
        camera = BatchCameraCache([st.camera_cache for st in steps])
        times = [t for st in steps for t in st.time_index]
    if forward is None:
        forward = functools.partial(model.forward_step, extras=False)     # only what results use
    out = forward(images, time_index=times, first_frame=first.scale, scale_phase=first.scale, kv=kv,
                  camera_cache=camera, iterations=iterations)
    return {k: out[k] for k in STEP_OUTPUTS}

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
from typing import Any, Optional

import numpy as np
import torch

from ..api import EngineError, EngineEvent, FrameResult, SessionConfig
from ..pose import decode_pose
from ..session_timing import SessionTiming, require_ints, resolve_device

from ..kv.dtypes import COMPUTE_DTYPES as _DTYPES, KV_DTYPES as _KV_DTYPES  # the one dtype table


def _config_error(msg: str) -> EngineError:
    return EngineError(f"LingBot-Map settings: {msg}")


def _validate(cfg: SessionConfig) -> None:
    if cfg.dtype not in _DTYPES:
        raise _config_error(f"dtype must be one of {', '.join(_DTYPES)} (got {cfg.dtype!r})")
    if cfg.kv_dtype not in ("auto", *_KV_DTYPES):
        raise _config_error(f"kv_dtype must be auto, {', '.join(_KV_DTYPES)} (got {cfg.kv_dtype!r})")
    if cfg.backend not in ("auto", "sdpa", "flashinfer", "cudnn"):
        raise _config_error(f"backend must be auto, sdpa, flashinfer or cudnn (got {cfg.backend!r})")
    if cfg.mode != "streaming":
        raise _config_error(f"mode {cfg.mode!r} is not available for this engine; use 'streaming'")
    from ..kv.compression import METHODS
    if (cfg.kv_compression or "none") not in METHODS:
        raise _config_error(f"kv_compression must be one of {', '.join(METHODS)} (got {cfg.kv_compression!r})")
    if not 0.0 < float(cfg.kv_keep_ratio) <= 1.0 or int(cfg.kv_block_size) < 1:
        raise _config_error(f"kv_keep_ratio must be in (0, 1] and kv_block_size >= 1 "
                            f"(got {cfg.kv_keep_ratio!r}, {cfg.kv_block_size!r})")
    if cfg.weight_dtype not in ("auto", "bf16", "int8", "fp8"):
        raise _config_error(f"weight_dtype must be auto, bf16, int8 or fp8 (got {cfg.weight_dtype!r})")
    require_ints(cfg, (("scale_frames", 1), ("window", 1), ("keyframe_interval", 1), ("camera_iterations", 1),
                       ("special_cap", 1), ("image_width", 14)), _config_error)
    if cfg.image_width % 14:
        raise _config_error(f"image_width must be a multiple of 14 (got {cfg.image_width})")
    if cfg.special_cap < cfg.scale_frames + cfg.window:
        raise _config_error(f"special_cap ({cfg.special_cap}) must be at least scale_frames + window "
                            f"({cfg.scale_frames + cfg.window})")
    if not (isinstance(cfg.fps, (int, float)) and cfg.fps > 0):
        raise _config_error(f"fps must be positive (got {cfg.fps!r})")


def _device(cfg: SessionConfig) -> torch.device:
    return resolve_device(cfg.device, _config_error)


def load_lingbot_map(cfg: SessionConfig, device: torch.device, dtype: torch.dtype):
    """Build the architecture (`cfg.model`, default the released "lingbot-map") on
    `device` in `dtype` and load `cfg.checkpoint` into it (strict; CheckpointError says what is wrong)."""
    if not cfg.checkpoint:
        raise EngineError("LingBot-Map needs weights: choose a checkpoint file (lingbot-map.pt, "
                          "lingbot-map-long.pt or a .safetensors export) in the settings")
    from ..checkpoint import load_checkpoint
    from ..models import build_model
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
        self.config = config
        self.device = _device(config)
        self.dtype = _DTYPES[config.dtype]
        if model is None:
            model = load_lingbot_map(config, self.device, self.dtype)
        from .model import LingBotMap
        if not isinstance(model, LingBotMap):
            raise EngineError(f"the lingbot-map engine needs a LingBot-Map model, got {type(model).__name__}")
        # The model is converted in place (no second copy of 4.6 GB). Going up in precision cannot
        # restore what an earlier bf16/fp16 session rounded away, so say so.
        was = model.compute_dtype
        self.model = model.to(self.device).set_dtype(self.dtype).eval()
        upcast = torch.finfo(was).bits < torch.finfo(self.dtype).bits
        self._events: list[EngineEvent] = [] if not upcast else [EngineEvent("warning", message=(
            f"the model was converted to {str(was).replace('torch.', '')} by an earlier session; "
            f"{config.dtype} results use those rounded weights. Reload the checkpoint for exact {config.dtype}"))]
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
        # opt-in: the blocks' norm/residual halves under torch.compile (engine/models/compile.py;
        # measured faster on the H200, outputs not yet checked there, so off by default)
        from ..models.compile import blocks_compiled, compile_blocks, compile_blocks_requested, uncompile_blocks
        if self.device.type == "cuda" and compile_blocks_requested():
            compile_blocks(self.model)
        elif blocks_compiled(self.model):
            uncompile_blocks(self.model)
        from ..kv.dtypes import kv_precision
        self.kv_precision = kv_precision(config.dtype, config.kv_dtype)   # decided once, here
        self.kv_dtype = self.kv_precision.storage
        self.kv = None                  # PagedKVCache, built at the first step (needs the token count)
        self.caches = None              # StreamCaches(kv, camera_cache)
        self.camera_cache = None
        self._hw: Optional[tuple[int, int]] = None
        self._pending: list = []        # scale-phase frames: (index, timestamp, Prepared)
        self._num_scale = 0             # frames in the scale phase once it ran
        self._next_index = 0
        self._time = 0                  # 3D-RoPE time index of the next cached frame
        self._frames = 0
        self._keyframes = 0
        self._init_timing()             # latency / rate of recent model runs, closed flag
        from ..host_copy import HostCopies
        self._host = HostCopies(self.device)    # outputs on their way to the host (see _deliver)
        # On CUDA a streamed frame's results come back from the NEXT push (or flush): the host
        # then never waits for the GPU inside a step and prepares frame N+1 while the GPU runs N
        # (engine/host_copy.py). False: every push returns its own frame (one sync per frame).
        self.defer_results = self.device.type == "cuda"

    # ------------------------------------------------------------------ contract
    def push(self, frame, timestamp: Optional[float] = None) -> list[FrameResult]:
        self._check_open()
        t0 = time.perf_counter()
        prep, index, ts = self._take_frame(frame, timestamp)
        if self._num_scale == 0:
            self._pending.append((index, ts, prep))
            if len(self._pending) < self.config.scale_frames:
                return []
            return self._timed(t0, self._run_scale)
        return self._timed(t0, lambda: self._run_stream(index, ts, prep))

    def flush(self) -> list[FrameResult]:
        self._check_open()
        if self._num_scale == 0 and self._pending:
            return self._timed(time.perf_counter(), self._run_scale)
        if len(self._host):             # a streamed frame whose results are still in flight
            return self._timed(time.perf_counter(), lambda: self._deliver(keep=0))
        return []

    def stats(self) -> dict:
        out = {
            "frames": self._frames,
            "keyframes": self._keyframes,
            **self._timing_stats(),
            **self._gpu_stats(),
            "segments": 1,
            "kv": self.kv.stats() if self.kv is not None else None,
            "kv_page_map": self.kv.page_map() if self.kv is not None else None,
            "camera_cache": self.camera_cache.stats() if self.camera_cache is not None else None,
            "time_index": self._time,
            "pending_scale_frames": len(self._pending),
            "resolution": (self._hw[1], self._hw[0]) if self._hw else None,
        }
        return out

    def poll_events(self) -> list[EngineEvent]:
        ev, self._events = self._events, []
        return ev

    def close(self) -> None:
        """Frees the session's GPU memory at once (KV pools, camera cache, CUDA graphs): nothing
        else holds them and they are in no reference cycle, so refcounting alone releases them."""
        self._closed = True
        self.model.aggregator.graphs = None     # free the captured graphs' buffers
        self.kv = None
        self.camera_cache = None
        self.caches = None
        self._pending.clear()
        self._host.clear()          # a frame still in flight is dropped (flush() first to keep it)

    # ------------------------------------------------------------------ internals
    def _ensure_caches(self) -> None:
        if self.kv is not None:
            return
        from ..kv import PagedKVCache, make_compressor, resolve_backend
        from ..kv.coordinator import StreamCaches
        cfg, geo = self.config, self.model.kv_geometry()
        h, w = self._hw
        patches = (h // 14) * (w // 14)
        self.kv = PagedKVCache(geo["num_layers"], geo["num_heads"], geo["head_dim"], patches,
                               special_tokens=geo["special_tokens"], scale_frames=cfg.scale_frames,
                               window=cfg.window, special_cap=cfg.special_cap, dtype=self.kv_precision,
                               device=self.device,
                               backend=resolve_backend(cfg.backend, self.device, self.kv_precision),
                               compression=make_compressor(cfg.kv_compression, cfg.kv_keep_ratio,
                                                           cfg.kv_block_size, cfg.kv_seed))
        self.camera_cache = self.model.new_camera_cache(cfg.camera_iterations, cfg.scale_frames, cfg.special_cap)
        self.caches = StreamCaches(self.kv, self.camera_cache)     # stepped together

    def _step(self, images: torch.Tensor, n: int, scale: bool, keyframe: bool, first: bool) -> dict:
        forward = functools.partial(self.model.forward_step, extras=False)   # only what results use
        if scale and self.config.sequence_parallel != "off":   # ring attention over the ranks
            from ..parallel.lingbot_ring import ring_forward
            forward = ring_forward(self.model, self.config)
        self._ensure_caches()
        self.caches.begin_step(n, scale=scale, keyframe=keyframe)
        try:
            out = forward(images.to(self.device, non_blocking=True),
                          time_index=range(self._time, self._time + n), first_frame=first,
                          scale_phase=scale, kv=_KVAdapter(self.kv), camera_cache=self.camera_cache,
                          iterations=self.config.camera_iterations)
        except BaseException as exc:
            self.caches.abort_step()
            if isinstance(exc, torch.OutOfMemoryError):
                h, w = self._hw
                raise EngineError(f"out of {self.device.type.upper()} memory running LingBot-Map at {w}x{h} "
                                  f"(dtype {self.config.dtype}, window {self.config.window}); use bf16, a "
                                  f"smaller window or a smaller image width") from exc
            raise
        self.caches.end_step()
        if keyframe:
            self._advance_time(n)
        return {k: out[k] for k in self._OUTPUTS}

    _OUTPUTS = ("pose_enc", "depth", "conf")    # what FrameResult carries; nothing else is copied

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
        for (kind, items, keyframe), host in self._host.take(keep):
            out += [self._result(i, idx, ts, prep, host, keyframe) for i, (idx, ts, prep) in enumerate(items)]
        return out

    def _run_scale(self) -> list[FrameResult]:
        items = list(self._pending)             # kept until the step succeeds
        imgs = torch.stack([p.tensor for _, _, p in items])
        out = self._step(imgs, len(items), scale=True, keyframe=True, first=True)
        self._pending = []
        self._num_scale = len(items)
        self._host.submit(out, ("scale", items, True))
        return self._deliver(keep=0)            # the scale phase's results at once

    def _run_stream(self, index: int, ts: float, prep) -> list[FrameResult]:
        k = self.config.keyframe_interval
        keyframe = k <= 1 or (index - self._num_scale) % k == 0
        out = self._step(prep.tensor[None], 1, scale=False, keyframe=keyframe, first=False)
        self._host.submit(out, ("stream", [(index, ts, prep)], keyframe))
        return self._deliver(keep=1 if self.defer_results else 0)

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


# CUDA graphs on by default on CUDA devices (SessionConfig.cuda_graphs overrides):
# measured on the H200, 20.9 -> 23.2 FPS steady (FlashInfer), outputs equal to eager.
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

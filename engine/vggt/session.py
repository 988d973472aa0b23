"""The "vggt-1b" session: VGGT run chunk by chunk over a sliding window of chunks (bounded memory).

Flow (the RFC's "Reconstruction Engine" design for VGGT):
1. frames are preprocessed (engine/preprocess.py) and buffered; the resolution is fixed by the
   first frame;
2. a **chunk** is `chunk_size` frames. Chunk 0 is frames 0..C-1; chunk k > 0 repeats the last
   `overlap` frames of chunk k-1 and adds C - overlap new ones. `push` returns the new frames'
   results when a chunk completes; `flush` runs the last, shorter chunk;
3. the global attention of a chunk sees its own frames bidirectionally plus the cached keys and
   values of the previous chunks in the window: the KV cache (engine/kv, the same paged
   bookkeeping and backends as LingBot-Map) keeps `sliding_window_num * chunk_size` frames; a
   chunk evicts the oldest chunk's pages (oldest first) before it attends, so the visible set is
   its own C frames plus the `sliding_window_num - 1` previous chunks. `sliding_window_num = 1` is
   VGGT-Long (independent chunks). A page holds one frame's 5 special + patch tokens (the cache's
   own special stream is unused: VGGT keeps no per-frame summary beyond the window);
4. each chunk's first frame is its reference (variant-0 camera/register tokens), so a chunk's
   poses and depths are in that frame's coordinates at the chunk's own scale. Chunk k > 0 is
   **stitched** onto the previous ones by a confidence-weighted IRLS Sim(3) (engine.align.irls_sim3,
   Huber) between the back-projected depth of the overlap frames as the previous chunk placed
   them and as this chunk predicts them. Results leave already aligned: c2w moved by the
   similarity, depth multiplied by its scale (pose_enc stays the raw head output);
5. VGGT's decoded [R|t] is world-to-camera; FrameResult.c2w is its inverse (then aligned).

One chunk covering every frame (chunk_size >= frames) is exactly the offline pass of the camera
and depth heads (same token set, no alignment). The point and track heads are not run here.

Memory: the KV pools are allocated once at the first chunk, exactly `sliding_window_num ×
chunk_size` frame pages (no scale pages, no pages for non-keyframe steps: a chunk is always
committed); pages in use stop growing once the window is full, whatever the length of the stream.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import torch

from ..api import EngineError, EngineEvent, FrameResult, SessionConfig, check_settings
from ..fast_path import vggt_fast_path
from ..pose import decode_pose
from ..session_timing import SessionTiming


def _error(msg: str) -> EngineError:
    return EngineError(f"VGGT settings: {msg}")


def validate(cfg: SessionConfig) -> None:
    """Each value against its declared type, choices and range (`check_settings`, the one check),
    then what relates fields to each other or to this session."""
    check_settings(cfg, _error)
    if cfg.mode != "streaming":
        raise _error(f"mode {cfg.mode!r} is handled by the windowed wrapper, not by the chunked session")
    if cfg.overlap >= cfg.chunk_size:
        raise _error(f"overlap ({cfg.overlap}) must be smaller than chunk_size ({cfg.chunk_size}): each chunk "
                     f"repeats `overlap` frames of the previous one to align it and must add new ones")
    if cfg.image_width % 14:
        raise _error(f"image_width must be a multiple of 14 (got {cfg.image_width})")


def load_vggt(cfg: SessionConfig, device: torch.device, dtype: torch.dtype):
    """Build `cfg.model` (a VGGT name, default vggt-1b) on `device` and load `cfg.checkpoint` (strict)."""
    if not cfg.checkpoint:
        raise EngineError("VGGT needs weights: choose the released model.pt (facebook/VGGT-1B) or a "
                          ".safetensors export as the checkpoint in the settings")
    from ..checkpoint import load_checkpoint
    from .model import MODELS, build_vggt
    name = cfg.model if cfg.model in MODELS else "vggt-1b"
    with torch.device(device):
        model = build_vggt(name)
    model.set_dtype(dtype)
    load_checkpoint(model, cfg.checkpoint)
    return model


class VGGTChunkedSession(SessionTiming):
    """Chunked VGGT session (see the module docstring). A model passed in is moved to `device` and
    converted to `dtype` in place (aggregator only; the heads stay float32)."""

    _SESSION_NAME = "VGGT"

    def __init__(self, config: SessionConfig, model: Any = None):
        validate(config)
        from .model import VGGT
        # config, device, dtype, the model (converted in place), events, timing (engine/session_timing.py)
        self._open_model(config, model, engine="vggt-1b", kind=VGGT, load=load_vggt, error=_error)
        kv_dtype = getattr(config, "kv_dtype", "auto")
        self.kv_dtype = self.dtype if kv_dtype in ("auto", None) else kv_dtype
        self.C, self.W, self.O = config.chunk_size, config.sliding_window_num, config.overlap
        self.kv = None
        self._hw: Optional[tuple[int, int]] = None
        self._carry: list = []          # overlap frames of the previous chunk: (index, ts, Prepared)
        self._pending: list = []        # new frames of the chunk being filled
        self._placed: dict = {}         # index -> (c2w, K, depth, conf) as emitted (aligned), overlap only
        self._next_index = 0
        self._chunks = 0
        self._frames = 0
        self._last_align: Optional[dict] = None

    # ------------------------------------------------------------------ contract
    def push(self, frame, timestamp: Optional[float] = None) -> list[FrameResult]:
        self._check_open()
        t0 = time.perf_counter()
        prep, index, ts = self._take_frame(frame, timestamp)
        self._pending.append((index, ts, prep))
        if len(self._carry) + len(self._pending) < self.C:
            return []
        return self._timed(t0, self._run_chunk)

    def flush(self) -> list[FrameResult]:
        self._check_open()
        if not self._pending:
            return []
        return self._timed(time.perf_counter(), self._run_chunk)

    def stats(self) -> dict:
        kv = self.kv.stats() if self.kv is not None else None
        return {
            "frames": self._frames,
            "keyframes": self._frames,
            "chunks": self._chunks,
            **self._timing_stats(),
            **self._gpu_stats(),
            "segments": 1,
            "kv": kv,
            "kv_page_map": self.kv.page_map() if self.kv is not None else None,
            "last_alignment": self._last_align,
            "pending_frames": len(self._pending),
            "resolution": (self._hw[1], self._hw[0]) if self._hw else None,
            "fast_path": vggt_fast_path(kv, self.device.type),
        }

    def poll_events(self) -> list[EngineEvent]:
        ev, self._events = self._events, []
        return ev

    def close(self) -> None:
        self._closed = True
        self.kv = None
        self._pending.clear()
        self._carry.clear()
        self._placed.clear()

    # ------------------------------------------------------------------ internals
    def _ensure_cache(self) -> None:
        if self.kv is not None:
            return
        from ..kv import PagedKVCache
        geo = self.model.kv_geometry()
        h, w = self._hw
        tokens = geo["special_tokens"] + (h // 14) * (w // 14)      # a page = one whole frame
        self.kv = PagedKVCache(geo["num_layers"], geo["num_heads"], geo["head_dim"], tokens,
                               special_tokens=0, scale_frames=0, window=self.W * self.C, special_cap=1,
                               dtype=self.kv_dtype, device=self.device, backend=self.config.backend,
                               max_step_frames=self.C, keyframes_only=True)   # exactly W*C pages

    def _run_chunk(self) -> list[FrameResult]:
        items = self._carry + self._pending
        n = len(items)
        forward = self.model.forward_chunk
        if self.config.sequence_parallel != "off":         # ring attention over the ranks
            from ..parallel.vggt_ring import chunk_forward_fn
            forward = chunk_forward_fn(self.model, self.config)
        self._ensure_cache()
        images = torch.stack([p.tensor for _, _, p in items]).to(self.device, non_blocking=True)
        self.kv.begin_step(n, scale=False, keyframe=True)
        try:
            out = forward(images, first_frame=True, kv=_KVAdapter(self.kv), heads=("camera", "depth"),
                          camera_iterations=self.config.camera_iterations)
        except BaseException as exc:
            self.kv.abort_step()
            if isinstance(exc, torch.OutOfMemoryError):
                h, w = self._hw
                raise EngineError(f"out of {self.device.type.upper()} memory running VGGT at {w}x{h} (chunk "
                                  f"{self.C}, window {self.W} chunks, {self.config.dtype}); use bf16, a smaller "
                                  f"chunk or window, or a smaller image width") from exc
            raise
        self.kv.end_step()
        out = {k: v.float().cpu().numpy() for k, v in out.items()}
        h, w = self._hw
        raw = []
        for i in range(n):
            c2w, K = decode_pose(out["pose_enc"][i], (h, w), convention="w2c")
            raw.append((c2w, K, out["depth"][i], out["depth_conf"][i]))
        n_old = len(self._carry)
        S = np.eye(4)
        if n_old:
            from ..align import overlap_similarity
            prev = [self._placed[idx] for idx, _, _ in self._carry]
            try:
                S, info = overlap_similarity(prev, raw[:n_old])
                self._last_align = dict(info, chunk=self._chunks)
            except EngineError as exc:        # e.g. no finite depth: keep going, unaligned, and say so
                self._events.append(EngineEvent("warning", message=f"VGGT chunk {self._chunks}: {exc}; "
                                                                   f"placed without alignment"))
        from ..align import apply_to_c2w
        results, placed = [], {}
        for i, (idx, ts, prep) in enumerate(items):
            c2w, K, depth, conf = raw[i]
            c2w = apply_to_c2w(S, c2w)
            depth = (depth * np.float32(np.cbrt(np.linalg.det(S[:3, :3])))).astype(np.float32)
            placed[idx] = (c2w, K, depth, conf)
            if i >= n_old:
                results.append(FrameResult(index=idx, timestamp=ts, is_keyframe=True, c2w=c2w, K=K,
                                           image=prep.image, depth=depth, conf=conf.astype(np.float32),
                                           pose_enc=out["pose_enc"][i].astype(np.float32), segment=0))
        self._carry = items[-self.O:] if n >= self.O else list(items)
        self._placed = {idx: placed[idx] for idx, _, _ in self._carry}
        self._pending = []
        self._chunks += 1
        self._frames += len(results)
        return results


class _KVAdapter:
    """Casts q/k/v to what the cache attends in and the output back to the compute dtype."""

    __slots__ = ("kv", "dtype")

    def __init__(self, kv):
        self.kv = kv
        self.dtype = getattr(kv, "attn_dtype", kv.dtype)

    def write(self, layer, k, v):
        self.kv.write(layer, k, v)

    def attend(self, layer, q):
        return self.kv.attend(layer, q.to(self.dtype)).to(q.dtype)

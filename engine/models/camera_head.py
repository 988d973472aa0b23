"""Causal camera head: iterative pose refinement over each frame's camera token, with its own cache.

Per iteration: AdaLN modulation of the (normalised) camera tokens by an embedding of the current
pose estimate (the learned empty pose first), 4 trunk blocks at dim 2048 (no positional encoding,
no qk-norm), then `pose_branch` predicts a delta that is accumulated and activated
(translation linear, quaternion linear, fov ReLU). Runs in float32 whatever the trunk dtype.

Causality comes from `CameraCache`: each iteration has its own cache (one camera token per frame
and trunk block). A frame attends to the cached tokens of earlier frames plus the tokens of the
frames being processed now (the scale frames attend to each other bidirectionally).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .layers import Block, Mlp, sdpa_bnhd


class CameraCache:
    """Bounded per-iteration K/V cache of the camera trunk, float32.

    Slots: the scale frames (never evicted) followed by a ring of the `cap` newest keyframes. The
    camera trunk has no positional encoding and no mask, so slot order does not matter and the
    ring overwrites the oldest entry in place: memory is allocated once, for `scale + cap` frames.
    A non-keyframe attends to `[cached, itself]` without writing anything, so rollback is exact by
    construction (no tensor or counter changes).
    """

    def __init__(self, iterations: int, depth: int, num_heads: int, head_dim: int, scale_frames: int,
                 cap: int, device="cpu", dtype=torch.float32):
        if cap < 1:
            raise ValueError("camera cache cap must be >= 1")
        self.iterations, self.depth = iterations, depth
        self.scale_frames, self.cap = scale_frames, cap
        self.kv = torch.zeros(iterations, depth, 2, scale_frames + cap, num_heads, head_dim,
                              device=device, dtype=dtype)
        self.num_scale = 0        # scale slots in use (fixed after the scale phase)
        self.ring_count = 0       # ring slots in use
        self.ring_next = 0        # next ring slot to (over)write
        self.frames_seen = 0      # keyframes committed in total
        self._step: Optional[tuple[bool, bool, int]] = None

    # -- step protocol, mirrors the paged KV cache -------------------------------------------
    def begin_step(self, num_frames: int, scale: bool, keyframe: bool) -> None:
        if scale and (self.frames_seen or num_frames > self.scale_frames):
            raise ValueError("the scale phase must come first and hold at most scale_frames frames")
        if not scale and num_frames != 1:
            raise ValueError("streamed steps carry exactly one frame")
        self._step = (scale, keyframe or scale, num_frames)

    def end_step(self) -> None:
        scale, keyframe, n = self._step
        if scale:
            self.num_scale = n
        elif keyframe:
            self.ring_next = (self.ring_next + 1) % self.cap
            self.ring_count = min(self.ring_count + 1, self.cap)
        if keyframe:
            self.frames_seen += n
        self._step = None

    @property
    def visible(self) -> int:
        return self.num_scale + self.ring_count

    def attend_fn(self, iteration: int, block: int):
        scale, keyframe, n = self._step
        store = self.kv[iteration, block]

        def attend(q, k, v):                           # [1, n, H, D]
            if scale:
                store[0, :n] = k[0]
                store[1, :n] = v[0]
                return sdpa_bnhd(q, store[0:1, :n], store[1:2, :n])
            if keyframe:
                slot = self.num_scale + self.ring_next
                store[0, slot] = k[0, 0]
                store[1, slot] = v[0, 0]
                m = self.num_scale + min(self.ring_count + 1, self.cap)
                return sdpa_bnhd(q, store[0:1, :m], store[1:2, :m])
            m = self.visible
            return sdpa_bnhd(q, torch.cat((store[0:1, :m], k), 1), torch.cat((store[1:2, :m], v), 1))

        return attend

    def stats(self) -> dict:
        return {"frames": self.visible, "capacity": self.scale_frames + self.cap,
                "bytes_allocated": self.kv.numel() * self.kv.element_size()}


class CameraHead(nn.Module):
    def __init__(self, dim: int = 2048, depth: int = 4, num_heads: int = 16, mlp_ratio: float = 4.0):
        super().__init__()
        self.dim, self.depth, self.num_heads = dim, depth, num_heads
        self.trunk = nn.Sequential(*[Block(dim, num_heads, mlp_ratio, qk_norm=False) for _ in range(depth)])
        self.token_norm = nn.LayerNorm(dim)
        self.trunk_norm = nn.LayerNorm(dim)
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, 9))
        self.embed_pose = nn.Linear(9, dim)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 3 * dim))
        self.adaln_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.pose_branch = Mlp(dim, dim // 2, 9)

    def new_cache(self, iterations: int, scale_frames: int, cap: int, device) -> CameraCache:
        return CameraCache(iterations, self.depth, self.num_heads, self.dim // self.num_heads,
                           scale_frames, cap, device=device)

    def forward(self, camera_tokens: torch.Tensor, iterations: int = 4,
                cache: Optional[CameraCache] = None) -> list[torch.Tensor]:
        """camera_tokens [S, dim] float32 (token 0 of the last aggregator layer) -> `iterations`
        pose encodings [S, 9]. Without a cache the S frames attend to each other (one batch)."""
        x = self.token_norm(camera_tokens)[None]                # [1, S, dim]
        pred = None
        preds = []
        for it in range(iterations):
            cond = self.embed_pose(self.empty_pose_tokens.expand(1, x.shape[1], -1) if pred is None else pred)
            shift, scale, gate = self.poseLN_modulation(cond).chunk(3, dim=-1)
            h = gate * (self.adaln_norm(x) * (1 + scale) + shift) + x
            for j, blk in enumerate(self.trunk):
                h = blk(h, attend=cache.attend_fn(it, j) if cache is not None else None)
            delta = self.pose_branch(self.trunk_norm(h))
            pred = delta if pred is None else pred + delta
            preds.append(torch.cat((pred[..., :7], torch.relu(pred[..., 7:])), dim=-1)[0])
        return preds

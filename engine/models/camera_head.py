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
import torch.nn.functional as F

from .layers import Block, Mlp, sdpa_bnhd


class CameraCache:
    """Bounded per-iteration K/V cache of the camera trunk, float32 (one token per frame and block).

    Slots: the scale frames (never evicted), a ring of `cap` committed keyframes, and one spare
    slot right after the used ones. Policy (the same as the KV cache's special stream: "append,
    attend, drop"): a streamed frame writes its token into the spare slot and attends to
    `[scale, up to cap committed frames, itself]` -- always one contiguous slice, no copy. At
    commit (keyframes only) the token stays in place while the ring is filling, or replaces the
    oldest ring entry once it is full. The trunk has no positional encoding and no mask, so slot
    order does not matter. Non-keyframes and aborted steps commit nothing: committed slots and
    counters are untouched (only the spare slot's bytes change). Memory is allocated once, for
    `scale_frames + cap + 1` frames x iterations x blocks (~256 KB per frame at full size with 4
    iterations). The slot bookkeeping is the KV cache's own `CappedRing` (engine/kv/page_table.py),
    and sessions step this cache together with the KV cache (engine/kv/coordinator.py).
    """

    def __init__(self, iterations: int, depth: int, num_heads: int, head_dim: int, scale_frames: int,
                 cap: int, device="cpu", dtype=torch.float32):
        if cap < 1 or scale_frames < 1:
            raise ValueError("camera cache: scale_frames and cap must be >= 1")
        self.iterations, self.depth = iterations, depth
        self.scale_frames, self.cap = scale_frames, cap
        self.kv = torch.zeros(iterations, depth, 2, scale_frames + cap + 1, num_heads, head_dim,
                              device=device, dtype=dtype)
        # static-shape attention (CUDA graphs): the write slot as a device tensor and the slot ids
        slots = scale_frames + cap + 1
        self._at = torch.zeros(1, dtype=torch.long, device=device)
        self._slot_ids = torch.arange(slots, device=device)
        self._mask = torch.zeros(1, 1, 1, slots, dtype=dtype, device=device)
        from .capped_ring import CappedRing
        self._ring = CappedRing(cap, pinned_in_cap=False)   # scale slots pinned, then a ring of cap
        self.committed = 0        # keyframes committed in total (scale included)
        self._step: Optional[tuple[bool, bool, int]] = None

    @property
    def num_scale(self) -> int:
        """Scale slots in use (fixed after the scale phase)."""
        return self._ring.pinned

    @property
    def ring_count(self) -> int:
        return self._ring.count

    @property
    def ring_next(self) -> int:
        return self._ring.next

    @property
    def visible(self) -> int:
        """Committed tokens a new frame attends to (besides itself)."""
        return self._ring.visible

    def begin_step(self, num_frames: int, scale: bool, keyframe: bool) -> None:
        if self._step is not None:
            raise RuntimeError("camera cache: begin_step called twice without end_step")
        if scale and (self.committed or num_frames > self.scale_frames):
            raise ValueError("camera cache: the scale phase must come first and hold at most scale_frames frames")
        if not scale and (num_frames != 1 or not self.num_scale):
            raise ValueError("camera cache: streamed steps carry one frame, after the scale phase")
        self._step = (scale, keyframe or scale, num_frames)
        if not scale:
            self._at.fill_(self.visible)       # a kernel, no host sync

    def build_static_mask(self) -> None:
        """Additive mask over every slot: 0 up to and including the write slot, -inf after
        (computed on the device from `_at`, so a captured graph recomputes it every replay)."""
        self._mask.zero_()
        self._mask.masked_fill_(self._slot_ids > self._at, float("-inf"))

    def attend_fn(self, iteration: int, block: int, static: bool = False):
        if static:                             # one streamed frame, full capacity + mask
            store = self.kv[iteration, block]
            at, mask = self._at, self._mask

            def attend_static(q, k, v):        # [1, 1, H, D]
                store[0].index_copy_(0, at, k[0])
                store[1].index_copy_(0, at, v[0])
                qh, kh, vh = q.transpose(1, 2), store[0:1].transpose(1, 2), store[1:2].transpose(1, 2)
                return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask).transpose(1, 2)

            return attend_static
        _, _, n = self._step
        store = self.kv[iteration, block]
        at = self.visible                      # spare slot(s) right after the committed ones

        def attend(q, k, v):                   # [1, n, H, D]
            store[0, at:at + n] = k[0]
            store[1, at:at + n] = v[0]
            return sdpa_bnhd(q, store[0:1, :at + n], store[1:2, :at + n])

        return attend

    def end_step(self) -> None:
        scale, keyframe, n = self._step
        self._step = None
        if scale:
            self._ring.pin(n)
        elif keyframe:      # the token stays in its slot, or replaces the oldest ring entry
            for src, dst in self._ring.commit(n):
                self.kv[:, :, :, dst] = self.kv[:, :, :, src]
        if keyframe:
            self.committed += n

    def abort_step(self) -> None:
        """Forget a step that failed half-way; nothing was committed."""
        self._step = None

    def state(self) -> dict:
        """Counters and a copy of the committed slots (for exact-rollback checks)."""
        return {"num_scale": self.num_scale, "ring_count": self.ring_count, "ring_next": self.ring_next,
                "committed": self.committed, "slots": self.kv[:, :, :, :self.visible].clone()}

    def stats(self) -> dict:
        return {"frames": self.visible, "capacity": self.scale_frames + self.cap,
                "committed": self.committed, "bytes_allocated": self.kv.numel() * self.kv.element_size()}


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
                cache: Optional[CameraCache] = None, static: bool = False) -> list[torch.Tensor]:
        """camera_tokens [S, dim] float32 (token 0 of the last aggregator layer) -> `iterations`
        pose encodings [S, 9]. Without a cache the S frames attend to each other (one batch).
        static=True (one streamed frame, for CUDA-graph capture): attention over the cache's full
        capacity with a mask, the write slot read from a device tensor -- no shape depends on
        how many frames are cached."""
        if static:
            cache.build_static_mask()
        x = self.token_norm(camera_tokens)[None]                # [1, S, dim]
        pred = None
        preds = []
        for it in range(iterations):
            cond = self.embed_pose(self.empty_pose_tokens.expand(1, x.shape[1], -1) if pred is None else pred)
            shift, scale, gate = self.poseLN_modulation(cond).chunk(3, dim=-1)
            h = gate * (self.adaln_norm(x) * (1 + scale) + shift) + x
            for j, blk in enumerate(self.trunk):
                h = blk(h, attend=cache.attend_fn(it, j, static) if cache is not None else None)
            delta = self.pose_branch(self.trunk_norm(h))
            pred = delta if pred is None else pred + delta
            preds.append(torch.cat((pred[..., :7], torch.relu(pred[..., 7:])), dim=-1)[0])
        return preds

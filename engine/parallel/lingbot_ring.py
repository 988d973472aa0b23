"""Sequence-parallel scale phase of LingBot-Map: the scale frames are split over the ranks of a
torch.distributed group and their bidirectional global attention runs as ring attention.

Setting: `SessionConfig.sequence_parallel = "ring"` (engine/api.py). Every rank runs its own
process (one GPU each, e.g. started by `torchrun --nproc-per-node 2`), initialises the default
process group (NCCL on GPUs, gloo on CPUs), opens the same session and pushes the same frames.
In the scale phase rank r runs only its contiguous share of the scale frames through the patch
embed, the frame blocks, the global blocks and the depth head; each global layer's attention is
`ring_attention` over the shards. Nothing is approximated:

* the global attention of the scale phase has no mask and its keys carry their RoPE positions, so
  attention over the shards merged by log-sum-exp equals attention over the whole set;
* the shards that pass each rank during the ring are written into that rank's own paged KV cache,
  so every rank ends the scale phase with the complete cache (as one process would) and the
  streamed frames that follow run replicated on every rank, unchanged;
* the camera head (one token per frame; the scale frames attend to each other in its trunk) runs
  on the gathered camera tokens of all frames, and depth / confidence are gathered, so every rank
  returns the full results of the step.

What is split: activations, attention FLOPs and time of the scale phase (the part of LingBot-Map
that grows quadratically with the number of frames). With fewer scale frames than ranks the step
runs unsplit. No Qt, no session imports (the session calls `scale_forward`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .ring_attention import ring_attention, split_lengths


def ring_active(config, group=None) -> bool:
    """True when `config` asks for ring attention and a process group of > 1 ranks exists.
    Asking for it without a group, or a mode other than off / ring, is an error with a clear
    message (EngineError)."""
    from ..api import EngineError
    mode = getattr(config, "sequence_parallel", "off")
    if mode not in ("off", "ring"):
        raise EngineError(f"sequence_parallel must be 'off' or 'ring' (got {mode!r})")
    if mode != "ring":
        return False
    if not (dist.is_available() and dist.is_initialized()):
        raise EngineError("sequence_parallel 'ring' needs torch.distributed: start one process per GPU "
                          "(e.g. torchrun --nproc-per-node 2) and call torch.distributed.init_process_group; "
                          "or set sequence_parallel to 'off'")
    want = int(getattr(config, "ring_world_size", 0) or 0)
    world = dist.get_world_size(group)
    if want and want != world:
        raise EngineError(f"ring_world_size is {want} but the process group has {world} ranks; "
                          f"start {want} processes or set ring_world_size to 0 (= every rank)")
    return world > 1


def gather_frames(x: torch.Tensor, lengths: Sequence[int], group=None) -> torch.Tensor:
    """Concatenate every rank's x [n_r, ...] (n_r = lengths[r]) along dim 0, on every rank."""
    world = len(lengths)
    m = max(lengths)
    pad = x.new_zeros((m, *x.shape[1:]))
    pad[:x.shape[0]] = x
    parts = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(parts, pad.contiguous(), group=group)
    return torch.cat([p[:n] for p, n in zip(parts, lengths)], dim=0)


class _RingKV:
    """The `kv` object the aggregator's global blocks talk to (write, then attend) for one
    sequence-parallel scale step: attention is ring attention over the frame shards, and the
    shards seen on the way are assembled and written into the rank's own cache (`inner`)."""

    def __init__(self, inner, frame_lengths: Sequence[int], group=None):
        self.inner = inner
        self.lengths = list(frame_lengths)
        self.starts = [sum(self.lengths[:r]) for r in range(len(self.lengths))]
        self.group = group
        self._k = self._v = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._k, self._v = k, v                 # [n, T, H, D]; the ring needs them in attend

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        n, T, H, D = q.shape
        S = sum(self.lengths)
        full_k = q.new_empty((S, T, H, D)) if self.inner is not None else None
        full_v = torch.empty_like(full_k) if full_k is not None else None
        bhld = lambda x: x.reshape(1, n * T, H, D).transpose(1, 2)

        def keep(src: int, kv: torch.Tensor) -> None:      # kv [2, 1, H, n_src*T, D]
            if full_k is None:
                return
            a, m = self.starts[src], self.lengths[src]
            full_k[a:a + m] = kv[0, 0].transpose(0, 1).reshape(m, T, H, D)
            full_v[a:a + m] = kv[1, 0].transpose(0, 1).reshape(m, T, H, D)

        out = ring_attention(bhld(q), bhld(self._k), bhld(self._v), group=self.group,
                             lengths=[m * T for m in self.lengths], on_block=keep)
        if self.inner is not None:
            self.inner.write(layer, full_k, full_v)
        self._k = self._v = None
        return out.transpose(1, 2).reshape(n, T, H, D)


def ring_forward(model, config, group=None):
    """The forward the session uses for its scale step: `model.forward_step` itself, or its
    sequence-parallel equivalent when `config.sequence_parallel` is "ring" over > 1 ranks."""
    if not ring_active(config, group):
        return model.forward_step
    return lambda images, **kw: scale_forward(model, images, group=group, **kw)


@torch.no_grad()
def scale_forward(model, images: torch.Tensor, *, time_index: Sequence[int], first_frame: bool = True,
                  scale_phase: bool = True, kv=None, camera_cache=None, iterations: int = 4,
                  group=None) -> dict:
    """The scale step of `model.forward_step(images, scale_phase=True, first_frame=True, ...)`,
    split over the ranks of `group` (see the module docstring). Same inputs and the same output
    dict on every rank, for all S frames; `kv` must already be in a `begin_step(S, scale=True)`."""
    if not (first_frame and scale_phase):
        raise ValueError("the sequence-parallel step is the scale phase (first_frame and scale_phase)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    S = images.shape[0]
    if S < world:                               # nothing to split: every rank runs the whole step
        return model.forward_step(images, time_index=time_index, first_frame=True, scale_phase=True,
                                  kv=kv, camera_cache=camera_cache, iterations=iterations)
    cfg = model.config
    H, W = images.shape[-2:]
    lengths = split_lengths(S, world)
    a, n = sum(lengths[:rank]), lengths[rank]
    times = list(time_index)
    feats = model.aggregator(images[a:a + n], times[a:a + n], first_frame=(a == 0), scale_phase=True,
                             kv=_RingKV(kv, lengths, group))
    feats32 = [f.float() for f in feats]
    cam_tokens = gather_frames(feats32[-1][:, 0].contiguous(), lengths, group)        # [S, 2C]
    agg = model.aggregator
    with agg._section("camera_head"):
        poses = model.camera_head(cam_tokens, iterations, camera_cache)
    with agg._section("depth_head"):
        depth, conf = model.depth_head(feats32, (H, W), cfg.num_special)
    local_cam = torch.stack([f[:, 0] for f in feats32], dim=1)
    return {"pose_enc": poses[-1], "pose_enc_list": torch.stack(poses, dim=1),
            "depth": gather_frames(depth.contiguous(), lengths, group),
            "conf": gather_frames(conf.contiguous(), lengths, group),
            "camera_features": gather_frames(local_cam.contiguous(), lengths, group)}

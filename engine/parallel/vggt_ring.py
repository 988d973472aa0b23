"""Sequence-parallel VGGT chunks: a chunk's frames are split over the ranks of a torch.distributed
group and its bidirectional global attention runs as ring attention (the same machinery as
LingBot-Map's scale phase, engine/parallel/lingbot_ring.py).

Setting: `SessionConfig.sequence_parallel = "ring"` with the "vggt-1b" engine; one process per GPU,
each opening the same session and pushing the same frames. Rank r runs its share of the chunk
through the patch embed, frame and global blocks (ring attention) and the dense heads; the camera
head (its trunk attends across the chunk's frames) runs on the gathered camera tokens, and the
dense outputs are gathered, so every rank returns the whole chunk and keeps the same KV cache.

A chunk is split when its visible set is the chunk itself: always with `sliding_window_num = 1`
(independent chunks, VGGT-Long) and for the first chunk otherwise. A chunk that also attends to
earlier cached chunks runs unsplit on every rank (exact, not faster): merging the ring with the
cached pages needs an attention-with-log-sum-exp entry in the paged cache (not there yet). The
track head (query points across frames) also runs unsplit.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .lingbot_ring import _RingKV, gather_frames, ring_active
from .ring_attention import split_lengths


def chunk_forward_fn(model, config, group=None):
    """`model.forward_chunk`, or its sequence-parallel equivalent when `config.sequence_parallel`
    is "ring" over > 1 ranks."""
    if not ring_active(config, group):
        return model.forward_chunk
    return lambda images, **kw: chunk_forward(model, images, group=group, **kw)


def _only_own_frames_visible(kv) -> bool:
    """The cache step in progress attends to the new frames only (no earlier chunk visible)."""
    if kv is None:
        return True
    cache = getattr(kv, "kv", kv)
    step = getattr(cache, "step", None)
    return step is not None and step.num_kv_tokens == step.num_frames * cache.page_size


@torch.no_grad()
def chunk_forward(model, images: torch.Tensor, *, first_frame: bool = True, kv=None,
                  heads: Sequence[str] = ("camera", "depth", "point"), camera_iterations: int = 4,
                  query_points=None, group=None) -> dict:
    """`model.forward_chunk(images, ...)` split over the ranks of `group` (module docstring)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    S, _, H, W = images.shape
    if S < world or "track" in heads or not _only_own_frames_visible(kv):
        return model.forward_chunk(images, first_frame=first_frame, kv=kv, heads=heads,
                                   camera_iterations=camera_iterations, query_points=query_points)
    lengths = split_lengths(S, world)
    a, n = sum(lengths[:rank]), lengths[rank]
    feats = model.aggregator(images[a:a + n], first_frame=first_frame and a == 0, kv=_RingKV(kv, lengths, group))
    feats32 = [f.float() for f in feats]
    del feats
    gather = lambda x: gather_frames(x.contiguous(), lengths, group)
    n_sp = model.config.num_special
    sec = model.aggregator._section
    out = {"camera_features": gather(torch.stack([f[:, 0] for f in feats32], dim=1))}
    if "camera" in heads:
        with sec("camera_head"):
            poses = model.camera_head(gather(feats32[-1][:, 0]), camera_iterations)
        out["pose_enc"], out["pose_enc_list"] = poses[-1], torch.stack(poses, dim=1)
    if "depth" in heads:
        with sec("depth_head"):
            d, c = model.depth_head(feats32, (H, W), n_sp)
        out["depth"], out["depth_conf"] = gather(d), gather(c)
    if "point" in heads:
        with sec("point_head"):
            p, c = model.point_head(feats32, (H, W), n_sp)
        out["world_points"], out["world_points_conf"] = gather(p), gather(c)
    return out

"""VGGT-1B (facebookresearch/vggt): aggregator + camera, depth, point and track heads.

Built from the shared layers of engine/models (one `Block`, one `Rope2D`, the DINOv2 patch
embed, the camera head and the DPT): VGGT and LingBot-Map share the aggregator design
(engine/models/trunk.py `Trunk`, and `global_attend` of engine/models/layers.py). VGGT
differs from LingBot-Map in:
- 5 special tokens per frame (camera, 4 registers; no scale token); variant 0 for the reference
  frame (frame 0 of a batch), variant 1 for the others;
- the global blocks use the same 2D RoPE as the frame blocks (no time axis): positions are
  per frame, so a frame's keys do not depend on where it sits in the sequence;
- the global attention is bidirectional over all frames of the batch (offline), or, in the
  chunked session (engine/vggt/session.py), over the chunk plus the KV cache of earlier chunks;
- the camera head attends bidirectionally across the frames it is given (no cache);
- extra heads: points (DPT, 4 channels) and tracks (engine/vggt/track.py).

Forward API:
    out = model(images, query_points=None)      # images [S, 3, H, W] in [0, 1]
    out = model.forward_chunk(images, kv=..., first_frame=True, heads=("camera", "depth"))
Keys of `out`: pose_enc [S, 9], pose_enc_list [S, K, 9], depth [S, H, W], depth_conf,
world_points [S, H, W, 3], world_points_conf, camera_features [S, 4, 2C]; with query_points
[N, 2]: track [S, N, 2], track_iters [K, S, N, 2], track_vis [S, N], track_conf [S, N].
The decoded [R|t] of VGGT's pose encoding is world-to-camera (shared/DESIGN.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.nn as nn

from ..models.camera_head import CameraHead
from ..models.dpt_head import DPTHead
from ..models.layers import global_attend
from ..models.rope import Rope2D
from ..models.trunk import IMAGENET_MEAN, IMAGENET_STD, Trunk, TrunkConfig, TrunkModel, build_preset
from .heads import PointHead
from .track import TrackHead

ALL_HEADS = ("camera", "depth", "point", "track")


@dataclass
class VGGTConfig(TrunkConfig):
    """TrunkConfig (engine/models/trunk.py) and the track head's sizes."""
    track_features: int = 128
    track_hidden: int = 384
    track_heads: int = 8
    track_depth: int = 6
    track_corr_levels: int = 7
    track_corr_radius: int = 4
    track_virtual: int = 64
    track_iterations: int = 4
    track_pos_embed: bool = True        # UV embedding in the track features (upstream default)
    extra: dict = field(default_factory=dict)

    @property
    def num_special(self) -> int:
        return 1 + self.num_register_tokens          # camera, registers


class VGGTAggregator(Trunk):
    """Patch embed + 5 special tokens per frame + alternating frame / global blocks (engine/models/trunk.py)."""

    def __init__(self, cfg: VGGTConfig):
        super().__init__(cfg)
        self.register_buffer("_resnet_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_resnet_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.rope = Rope2D(cfg.embed_dim // cfg.num_heads, cfg.rope_freq)

    def special_tokens(self, num_frames: int, first_frame: bool) -> torch.Tensor:
        """[S, 5, C]: variant 0 for frame 0 when `first_frame`, variant 1 for the rest."""
        tok = torch.cat((self.camera_token, self.register_token), dim=2)[0]          # [2, 5, C]
        rows = tok[1:2].expand(num_frames, -1, -1)
        if first_frame:
            rows = torch.cat((tok[0:1], rows[1:]), dim=0)
        return rows

    def forward(self, images: torch.Tensor, first_frame: bool = True, kv=None) -> list[torch.Tensor]:
        """images [S, 3, H, W] in [0, 1] -> the 4 feature maps [S, T, 2C] the heads read.
        kv None: one bidirectional batch; else a cache with write(layer, k, v) / attend(layer, q)."""
        cfg = self.cfg
        S, _, H, W = images.shape
        gh, gw = H // cfg.patch_size, W // cfg.patch_size
        dtype = self.camera_token.dtype
        rot = self.rope.rotation(gh, gw, cfg.num_special, images.device, dtype)
        x = ((images.float() - self._resnet_mean.float()) / self._resnet_std.float()).to(dtype)
        with self._section("patch_embed"):
            patches = self.patch_embed(x)
        x = torch.cat((self.special_tokens(S, first_frame).to(patches.dtype), patches), dim=1)   # [S, T, C]
        return self.run_blocks(x, lambda i, t: self.frame_blocks[i](t, rope=rot),
                               lambda i, t: self.global_blocks[i](t, rope=rot, attend=global_attend(i, kv)))


class VGGT(TrunkModel, nn.Module):
    def __init__(self, cfg: Optional[VGGTConfig] = None):
        super().__init__()
        self.config = cfg = cfg or VGGTConfig()
        self.check_layers(cfg)
        D2 = 2 * cfg.embed_dim
        oc = tuple(cfg.dpt_out_channels)
        self.aggregator = VGGTAggregator(cfg)
        self.camera_head = CameraHead(D2, cfg.camera_depth, cfg.camera_heads, cfg.mlp_ratio)
        self.depth_head = DPTHead(D2, cfg.patch_size, cfg.dpt_features, oc)
        self.point_head = PointHead(D2, cfg.patch_size, cfg.dpt_features, oc)
        self.track_head = TrackHead(D2, cfg.patch_size, cfg.track_features, oc, iterations=cfg.track_iterations,
                                    pos_embed=cfg.track_pos_embed,
                                    hidden=cfg.track_hidden, heads=cfg.track_heads, depth=cfg.track_depth,
                                    corr_levels=cfg.track_corr_levels, corr_radius=cfg.track_corr_radius,
                                    virtual_tracks=cfg.track_virtual, max_scale=float(cfg.img_size))
        self.eval()

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.aggregator.camera_token.dtype

    def set_dtype(self, dtype: torch.dtype) -> "VGGT":
        """Aggregator in `dtype`; the heads stay float32 and read float32 features (as upstream)."""
        self.aggregator.to(dtype)
        for head in (self.camera_head, self.depth_head, self.point_head, self.track_head):
            head.float()
        return self

    def kv_geometry(self) -> dict:
        c = self.config
        return {"num_layers": c.depth, "num_heads": c.num_heads, "head_dim": c.embed_dim // c.num_heads,
                "special_tokens": c.num_special}

    @torch.no_grad()
    def forward_chunk(self, images: torch.Tensor, *, first_frame: bool = True, kv=None,
                      heads: Sequence[str] = ("camera", "depth", "point"), camera_iterations: int = 4,
                      query_points: Optional[torch.Tensor] = None) -> dict:
        cfg = self.config
        S, C3, H, W = images.shape
        if C3 != 3 or H % cfg.patch_size or W % cfg.patch_size:
            raise ValueError(f"images must be [S, 3, H, W] with H, W multiples of {cfg.patch_size}; got {tuple(images.shape)}")
        unknown = set(heads) - set(ALL_HEADS)
        if unknown:
            raise ValueError(f"unknown heads {sorted(unknown)}; choose from {ALL_HEADS}")
        feats = self.aggregator(images, first_frame=first_frame, kv=kv)
        feats32 = [f.float() for f in feats]
        del feats
        n_sp = cfg.num_special
        out = {"camera_features": torch.stack([f[:, 0] for f in feats32], dim=1)}
        sec = self.aggregator._section
        if "camera" in heads:
            with sec("camera_head"):
                poses = self.camera_head(feats32[-1][:, 0], camera_iterations)
            out["pose_enc"], out["pose_enc_list"] = poses[-1], torch.stack(poses, dim=1)
        if "depth" in heads:
            with sec("depth_head"):
                out["depth"], out["depth_conf"] = self.depth_head(feats32, (H, W), n_sp)
        if "point" in heads:
            with sec("point_head"):
                out["world_points"], out["world_points_conf"] = self.point_head(feats32, (H, W), n_sp)
        if "track" in heads and query_points is not None:
            with sec("track_head"):
                preds, vis, conf = self.track_head(feats32, (H, W), n_sp, query_points.to(images.device))
            out.update(track=preds[-1], track_iters=torch.stack(preds), track_vis=vis, track_conf=conf)
        return out

    def forward(self, images: torch.Tensor, query_points: Optional[torch.Tensor] = None,
                camera_iterations: int = 4) -> dict:
        """One bidirectional pass over all frames (frame 0 is the reference), every head."""
        return self.forward_chunk(images, first_frame=True, heads=ALL_HEADS, camera_iterations=camera_iterations,
                                  query_points=query_points)


# tiny: the same architecture scaled down for tests of the chunked session and windowed mode
TINY = dict(img_size=112, embed_dim=64, depth=4, num_heads=4, patch_embed_depth=2, patch_embed_heads=4,
            intermediate_layers=(0, 1, 2, 3), camera_depth=2, camera_heads=4, dpt_features=32,
            dpt_out_channels=(16, 32, 64, 64), track_features=16, track_hidden=32, track_heads=4,
            track_depth=2, track_corr_levels=3, track_virtual=8)
MODELS = {"vggt-1b": {}, "vggt-tiny": TINY}


def build_vggt(name: str = "vggt-1b", **overrides) -> VGGT:
    from ..api import EngineError
    if name not in MODELS:
        raise EngineError(f"unknown VGGT model {name!r}; available: {', '.join(MODELS)}")
    return build_preset(name, MODELS, VGGTConfig, VGGT, overrides)

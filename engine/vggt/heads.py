"""VGGT's dense heads beyond depth: the point head and the track head's feature extractor.

Both are the one DPT of engine/models/dpt_head.py (same module names as the released checkpoint):
- `PointHead`: output_dim 4 -> world points `sign(x) * expm1(|x|)` (3 channels) and confidence
  `1 + exp(x)`; everything else as the depth head.
- `TrackFeatures`: `feature_only` DPT of the track head: `output_conv1` keeps `features` channels,
  no `output_conv2`, output at half the input resolution (`int(H / 2)` x `int(W / 2)`, bilinear,
  align_corners), then the UV position embedding as in the depth head. `pos_embed=True` is the
  upstream default at the commit of the fixtures (shared/fixtures/README.md §5; iteration 1 of
  the tracks matches to 8e-6 px with it and is off by 0.05 px without); some later forks pass False.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.dpt_head import DPTHead


class PointHead(DPTHead):
    def __init__(self, dim_in: int, patch_size: int = 14, features: int = 256,
                 out_channels=(256, 512, 1024, 1024)):
        super().__init__(dim_in, patch_size, features, out_channels, output_dim=4)

    def activate(self, out: torch.Tensor):
        xyz = out[:, :3].permute(0, 2, 3, 1)                       # [S, H, W, 3]
        return torch.sign(xyz) * torch.expm1(xyz.abs()), 1.0 + out[:, 3].exp()


class TrackFeatures(DPTHead):
    def __init__(self, dim_in: int, patch_size: int = 14, features: int = 128,
                 out_channels=(256, 512, 1024, 1024), down_ratio: int = 2, pos_embed: bool = True):
        super().__init__(dim_in, patch_size, features, out_channels)
        self.down_ratio = down_ratio
        self.pos_embed = pos_embed
        self.scratch.output_conv1 = nn.Conv2d(features, features, 3, padding=1)
        del self.scratch.output_conv2

    def forward(self, features, image_hw, patch_start, chunk: int = 8) -> torch.Tensor:
        """4 x [S, T, dim_in] -> feature maps [S, features, H/2, W/2]."""
        S = features[0].shape[0]
        return torch.cat([self._forward(tuple(f[i:i + chunk] for f in features), image_hw, patch_start)
                          for i in range(0, S, chunk)])

    def _forward(self, features, image_hw, patch_start):
        H, W = image_hw
        ph, pw = H // self.patch_size, W // self.patch_size
        out = self.fuse(features, image_hw, patch_start)
        size = (int(ph * self.patch_size / self.down_ratio), int(pw * self.patch_size / self.down_ratio))
        out = F.interpolate(out, size=size, mode="bilinear", align_corners=True)
        return self._pos(out, W / H) if self.pos_embed else out

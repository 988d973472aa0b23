"""DPT depth head (features 256): four aggregator layers -> depth (exp) and confidence (1 + exp).

Runs in float32 whatever the trunk dtype (as upstream). Frames are processed in chunks of 8, each
frame independently. Module names follow the released checkpoint (`projects`, `resize_layers`,
`scratch.layerN_rn`, `scratch.refinenetN`, `scratch.output_conv1/2`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _uv_sincos_embed(h: int, w: int, channels: int, aspect: float, device) -> torch.Tensor:
    """[channels, h, w] sin/cos embedding of a centred UV grid spanning the image diagonal."""
    diag = (aspect ** 2 + 1.0) ** 0.5
    sx, sy = aspect / diag, 1.0 / diag
    xs = torch.linspace(-sx * (w - 1) / w, sx * (w - 1) / w, steps=w, dtype=torch.float32, device="cpu")
    ys = torch.linspace(-sy * (h - 1) / h, sy * (h - 1) / h, steps=h, dtype=torch.float32, device="cpu")
    uu, vv = torch.meshgrid(xs, ys, indexing="xy")                    # [h, w]
    half = channels // 2
    omega = torch.arange(half // 2, dtype=torch.float64, device="cpu") / (half / 2.0)
    omega = 1.0 / 100.0 ** omega

    def embed(coord):
        ang = coord.reshape(-1).double()[:, None] * omega[None]
        return torch.cat((ang.sin(), ang.cos()), dim=1)

    emb = torch.cat((embed(uu), embed(vv)), dim=-1).float()            # [h*w, C]
    return emb.view(h, w, channels).permute(2, 0, 1).to(device)


class ResidualConvUnit(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        # Upstream applies an in-place ReLU to its input, so the skip path carries relu(x).
        x = F.relu(x)
        return self.conv2(F.relu(self.conv1(x))) + x


class FusionBlock(nn.Module):
    def __init__(self, c: int, has_residual: bool = True):
        super().__init__()
        self.out_conv = nn.Conv2d(c, c, 1)
        if has_residual:
            self.resConfUnit1 = ResidualConvUnit(c)
        self.resConfUnit2 = ResidualConvUnit(c)

    def forward(self, x, skip=None, size=None):
        if skip is not None:
            x = x + self.resConfUnit1(skip)
        x = self.resConfUnit2(x)
        size = size if size is not None else (x.shape[-2] * 2, x.shape[-1] * 2)
        x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=True)
        return self.out_conv(x)


class DPTHead(nn.Module):
    def __init__(self, dim_in: int, patch_size: int = 14, features: int = 256,
                 out_channels=(256, 512, 1024, 1024), output_dim: int = 2):
        super().__init__()
        self.patch_size = patch_size
        self.norm = nn.LayerNorm(dim_in)
        self.projects = nn.ModuleList(nn.Conv2d(dim_in, oc, 1) for oc in out_channels)
        self.resize_layers = nn.ModuleList([
            nn.ConvTranspose2d(out_channels[0], out_channels[0], 4, stride=4),
            nn.ConvTranspose2d(out_channels[1], out_channels[1], 2, stride=2),
            nn.Identity(),
            nn.Conv2d(out_channels[3], out_channels[3], 3, stride=2, padding=1),
        ])
        s = nn.Module()
        for i, oc in enumerate(out_channels, start=1):
            setattr(s, f"layer{i}_rn", nn.Conv2d(oc, features, 3, padding=1, bias=False))
        s.refinenet1 = FusionBlock(features)
        s.refinenet2 = FusionBlock(features)
        s.refinenet3 = FusionBlock(features)
        s.refinenet4 = FusionBlock(features, has_residual=False)
        s.output_conv1 = nn.Conv2d(features, features // 2, 3, padding=1)
        s.output_conv2 = nn.Sequential(nn.Conv2d(features // 2, 32, 3, padding=1), nn.ReLU(),
                                       nn.Conv2d(32, output_dim, 1))
        self.scratch = s
        self._pe_cache: dict = {}

    def _pos(self, x: torch.Tensor, aspect: float) -> torch.Tensor:
        key = (x.shape[1], x.shape[2], x.shape[3], aspect, x.device)
        pe = self._pe_cache.get(key)
        if pe is None:
            pe = self._pe_cache[key] = _uv_sincos_embed(x.shape[2], x.shape[3], x.shape[1], aspect, x.device)
        return x + 0.1 * pe

    def forward(self, features: list[torch.Tensor], image_hw: tuple[int, int], patch_start: int,
                chunk: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """features: 4 x [S, T, dim_in] float32 -> depth [S, H, W], conf [S, H, W]."""
        S = features[0].shape[0]
        outs = [self._forward(tuple(f[i:i + chunk] for f in features), image_hw, patch_start)
                for i in range(0, S, chunk)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    # Subclasses (VGGT's point head and track feature extractor, engine/vggt/heads.py) reuse
    # `fuse` and change the activation or the tail.
    pos_embed = True        # add the UV sin/cos embedding (off in VGGT's track feature extractor)

    def fuse(self, features, image_hw, patch_start) -> torch.Tensor:
        """The multi-scale fusion up to `output_conv1`: [S, C, h, w] at 1/2 patch resolution x 4."""
        H, W = image_hw
        ph, pw = H // self.patch_size, W // self.patch_size
        aspect = W / H
        maps = []
        for i, f in enumerate(features):
            x = self.norm(f[:, patch_start:])
            x = x.permute(0, 2, 1).reshape(x.shape[0], x.shape[-1], ph, pw)
            x = self.projects[i](x)
            if self.pos_embed:
                x = self._pos(x, aspect)
            maps.append(self.resize_layers[i](x))
        s = self.scratch
        l1, l2, l3, l4 = (getattr(s, f"layer{i + 1}_rn")(m) for i, m in enumerate(maps))
        out = s.refinenet4(l4, size=l3.shape[2:])
        out = s.refinenet3(out, l3, size=l2.shape[2:])
        out = s.refinenet2(out, l2, size=l1.shape[2:])
        out = s.refinenet1(out, l1)
        return s.output_conv1(out)

    def activate(self, out: torch.Tensor):
        """Raw output [S, output_dim, H, W] -> (depth exp, confidence 1 + exp)."""
        return out[:, 0].exp(), 1.0 + out[:, 1].exp()

    def _forward(self, features, image_hw, patch_start):
        H, W = image_hw
        ph, pw = H // self.patch_size, W // self.patch_size
        out = self.fuse(features, image_hw, patch_start)
        out = F.interpolate(out, size=(ph * self.patch_size, pw * self.patch_size), mode="bilinear",
                            align_corners=True)
        out = self.scratch.output_conv2(self._pos(out, W / H))
        return self.activate(out)

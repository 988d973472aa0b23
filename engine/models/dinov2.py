"""DINOv2 ViT with register tokens, used as LingBot-Map's patch embedding (ViT-L/14-reg released).

Only the normalised patch tokens leave this module (`x_norm_patchtokens` upstream). The learned
position embedding covers a `pos_grid x pos_grid` grid (+ cls) and is resized bicubically with
antialiasing to the input grid (in float32, cached per grid size and weight version).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import Block


class PatchConv(nn.Module):
    def __init__(self, patch_size: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)          # [B, h*w, C]


class DinoV2(nn.Module):
    def __init__(self, dim: int = 1024, depth: int = 24, num_heads: int = 16, patch_size: int = 14,
                 img_size: int = 518, num_register_tokens: int = 4, mlp_ratio: float = 4.0):
        super().__init__()
        self.patch_size = patch_size
        self.pos_grid = img_size // patch_size
        self.num_register_tokens = num_register_tokens
        self.patch_embed = PatchConv(patch_size, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid ** 2 + 1, dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, dim))     # training only; kept for the key set
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, mlp_ratio, qk_norm=False, norm_eps=1e-6, layer_scale=1.0) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self._pos_cache: dict = {}

    def position_embedding(self, gh: int, gw: int) -> torch.Tensor:
        """[1, 1 + gh*gw, C] position embedding for a gh x gw patch grid."""
        p = self.pos_embed
        key = (gh, gw, p.dtype, p.device, p.data_ptr(), p._version)
        cached = self._pos_cache.get(key)
        if cached is not None:
            return cached
        M = self.pos_grid
        if (gh, gw) == (M, M):
            out = p.detach()
        else:
            pe = p.detach().float()
            grid = pe[:, 1:].reshape(1, M, M, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", antialias=True)
            out = torch.cat((pe[:, :1], grid.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)), dim=1).to(p.dtype)
        self._pos_cache = {key: out}
        return out

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] (already ImageNet-normalised) -> patch tokens [B, H/14 * W/14, C]."""
        B, _, H, W = images.shape
        # the residual stream runs in the norms' dtype (float32 in LingBot-Map's mixed precision)
        x = self.patch_embed(images.to(self.patch_embed.proj.weight.dtype)).to(self.norm.weight.dtype)
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)
        x = x + self.position_embedding(H // self.patch_size, W // self.patch_size)
        x = torch.cat((x[:, :1], self.register_tokens.expand(B, -1, -1), x[:, 1:]), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 1 + self.num_register_tokens:]

"""VGGT's track head: a DPT feature extractor plus an iterative point tracker (CoTracker-style).

Facts of the released model (module names follow its checkpoint, including the `virual_tracks`
spelling):
- features: `TrackFeatures` (128 channels at half the input resolution, with the DPT's UV position
  embedding, engine/vggt/heads.py), then a LayerNorm over channels (`fmap_norm`);
- the tracker works at stride 2: query points (x, y) in input pixels are divided by 2, every
  frame starts at the query position, and frame 0 stays pinned to it;
- correlation pyramid of 7 levels (average pooling by 2), radius 4: per level the dot products of
  the track feature with the level's feature map, / sqrt(C), sampled on a 9 x 9 window around the
  point (bilinear, align_corners, zero padding) -> 7 * 81 = 567 values -> `corr_mlp` -> 128;
- transformer input per (track, frame), 388 values: sin/cos embedding of the flow from frame 0
  (64 + 64, interleaved sin/cos with frequencies `arange(0, 64, 2) * 1000 / 64`), the flow / 518
  twice, the correlation features, the track features; plus the 2D sin/cos embedding (388 channels,
  theta 1e4) of the query position sampled on the feature grid, plus `query_ref_token` (variant 0
  for frame 0, 1 for the others);
- `updateformer`: LayerNorm + Linear to 384, then 6 x (attention over time per track; 64
  learned virtual tracks: virtual <- points cross-attention, virtual self-attention,
  points <- virtual cross-attention, per frame), residual to the input projection, LayerNorm,
  Linear to 2 + 128 (coordinate and feature updates). Its attention blocks normalise the input
  and add the attention output to the *normalised* input (as released);
- track features += `ffeat_updater(GroupNorm(delta))`; coordinates += delta; 4 iterations; the
  output of every iteration is kept (x 2 back to input pixels);
- visibility and confidence: Linear(128, 1) + sigmoid on the final track features.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.layers import Mlp


def sincos_1d(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """[M] positions -> [M, dim]: sin of pos * 1e4^(-2i/dim) then cos (float32)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64, device=pos.device) / (dim / 2.0))
    ang = pos.double()[:, None] * omega[None]
    return torch.cat((ang.sin(), ang.cos()), dim=1).float()


def grid_sincos(dim: int, h: int, w: int, device) -> torch.Tensor:
    """[1, dim, h, w]: first half embeds the column (x), second half the row (y)."""
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    emb = torch.cat((sincos_1d(xs.reshape(-1), dim // 2), sincos_1d(ys.reshape(-1), dim // 2)), dim=1)
    return emb.reshape(h, w, dim).permute(2, 0, 1)[None]


def flow_embedding(xy: torch.Tensor, C: int) -> torch.Tensor:
    """[B, N, 2] -> [B, N, 2C]: per axis interleaved (sin, cos) of x * arange(0, C, 2) * 1000 / C."""
    div = torch.arange(0, C, 2, device=xy.device, dtype=torch.float32) * (1000.0 / C)
    out = []
    for a in range(2):
        ang = xy[..., a:a + 1] * div
        out.append(torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2))
    return torch.cat(out, dim=-1)


def sample_bilinear(fmap: torch.Tensor, xy: torch.Tensor, padding_mode: str) -> torch.Tensor:
    """fmap [B, C, H, W], xy [B, h, w, 2] pixel coords (x, y), align_corners -> [B, C, h, w]."""
    H, W = fmap.shape[-2:]
    scale = torch.tensor([2.0 / max(W - 1, 1), 2.0 / max(H - 1, 1)], device=xy.device, dtype=fmap.dtype)
    return F.grid_sample(fmap, xy.to(fmap.dtype) * scale - 1, align_corners=True, padding_mode=padding_mode)


def sample_points(fmap: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
    """fmap [B, C, H, W], xy [B, N, 2] -> [B, N, C] (border padding)."""
    return sample_bilinear(fmap, xy[:, :, None], "border")[..., 0].transpose(1, 2)


class Correlation:
    """Correlation pyramid of one sequence's feature maps [S, C, H, W] (levels by 2x average pooling)."""

    def __init__(self, fmaps: torch.Tensor, levels: int, radius: int):
        self.pyramid = [fmaps]
        for _ in range(levels - 1):
            self.pyramid.append(F.avg_pool2d(self.pyramid[-1], 2, stride=2))
        r = torch.linspace(-radius, radius, 2 * radius + 1, device=fmaps.device, dtype=fmaps.dtype)
        a, b = torch.meshgrid(r, r, indexing="ij")
        # window offset (dx, dy) = (a, b): the x offset varies along the window's first axis
        self.window = torch.stack((a, b), dim=-1)                     # [2r+1, 2r+1, 2]

    def sample(self, feats: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """feats [S, N, C], coords [S, N, 2] (feature-map pixels) -> [S, N, levels * (2r+1)^2]."""
        S, N, C = feats.shape
        k = self.window.shape[0]
        out = []
        for i, fm in enumerate(self.pyramid):
            h, w = fm.shape[-2:]
            corr = torch.matmul(feats, fm.reshape(S, C, h * w)) / math.sqrt(C)        # [S, N, h*w]
            grid = coords.reshape(S * N, 1, 1, 2) / 2 ** i + self.window[None]
            smp = sample_bilinear(corr.reshape(S * N, 1, h, w), grid, "zeros")      # [S*N, 1, k, k]
            out.append(smp.reshape(S, N, k * k))
        return torch.cat(out, dim=-1)


class AttnBlock(nn.Module):
    """Released quirk: the residual adds to the normalised input."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = self.norm1(x)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class CrossAttnBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, context):
        x = self.norm1(x)
        context = self.norm_context(context)
        x = x + self.cross_attn(x, context, context, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class UpdateFormer(nn.Module):
    def __init__(self, depth: int, input_dim: int, hidden: int, heads: int, output_dim: int,
                 virtual_tracks: int = 64):
        super().__init__()
        self.input_norm = nn.LayerNorm(input_dim)
        self.input_transform = nn.Linear(input_dim, hidden)
        self.output_norm = nn.LayerNorm(hidden)
        self.flow_head = nn.Linear(hidden, output_dim)
        self.virual_tracks = nn.Parameter(torch.zeros(1, virtual_tracks, 1, hidden))
        self.time_blocks = nn.ModuleList(AttnBlock(hidden, heads) for _ in range(depth))
        self.space_virtual_blocks = nn.ModuleList(AttnBlock(hidden, heads) for _ in range(depth))
        self.space_point2virtual_blocks = nn.ModuleList(CrossAttnBlock(hidden, heads) for _ in range(depth))
        self.space_virtual2point_blocks = nn.ModuleList(CrossAttnBlock(hidden, heads) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, S, input_dim] (tracks, frames) -> [N, S, output_dim]."""
        tokens = self.input_transform(self.input_norm(x))
        init = tokens
        N, S, C = tokens.shape
        V = self.virual_tracks.shape[1]
        tokens = torch.cat((tokens, self.virual_tracks[0].expand(V, S, C)), dim=0)      # [N+V, S, C]
        for i in range(len(self.time_blocks)):
            tokens = self.time_blocks[i](tokens)                                       # over time
            space = tokens.transpose(0, 1)                                              # [S, N+V, C]
            points, virtual = space[:, :N], space[:, N:]
            virtual = self.space_virtual2point_blocks[i](virtual, points)
            virtual = self.space_virtual_blocks[i](virtual)
            points = self.space_point2virtual_blocks[i](points, virtual)
            tokens = torch.cat((points, virtual), dim=1).transpose(0, 1)
        return self.flow_head(self.output_norm(tokens[:N] + init))


class Tracker(nn.Module):
    def __init__(self, latent: int = 128, hidden: int = 384, heads: int = 8, depth: int = 6,
                 corr_levels: int = 7, corr_radius: int = 4, stride: int = 2, virtual_tracks: int = 64,
                 max_scale: float = 518.0):
        super().__init__()
        self.latent, self.stride, self.max_scale = latent, stride, max_scale
        self.corr_levels, self.corr_radius = corr_levels, corr_radius
        self.corr_mlp = Mlp(corr_levels * (2 * corr_radius + 1) ** 2, hidden, latent)
        self.transformer_dim = 3 * latent + 4
        self.query_ref_token = nn.Parameter(torch.zeros(1, 2, self.transformer_dim))
        self.updateformer = UpdateFormer(depth, self.transformer_dim, hidden, heads, latent + 2, virtual_tracks)
        self.fmap_norm = nn.LayerNorm(latent)
        self.ffeat_norm = nn.GroupNorm(1, latent)
        self.ffeat_updater = nn.Sequential(nn.Linear(latent, latent), nn.GELU())
        self.vis_predictor = nn.Sequential(nn.Linear(latent, 1))
        self.conf_predictor = nn.Sequential(nn.Linear(latent, 1))

    def forward(self, query_points: torch.Tensor, fmaps: torch.Tensor, iterations: int = 4):
        """query_points [N, 2] (x, y) input pixels on frame 0; fmaps [S, C, h, w] ->
        (list of [S, N, 2] per iteration in input pixels, visibility [S, N], confidence [S, N])."""
        S, C, h, w = fmaps.shape
        N = query_points.shape[0]
        fmaps = self.fmap_norm(fmaps.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        q = query_points.float() / self.stride
        coords = q[None].expand(S, N, 2).clone()
        feats = sample_points(fmaps[:1], q[None])[0]                    # [N, C]
        track = feats[None].expand(S, N, C).clone()                    # [S, N, C]
        corr = Correlation(fmaps, self.corr_levels, self.corr_radius)
        pos = sample_points(grid_sincos(self.transformer_dim, h, w, fmaps.device), q[None])[0]   # [N, D]
        ref = torch.cat((self.query_ref_token[:, 0:1], self.query_ref_token[:, 1:2].expand(-1, S - 1, -1)), dim=1)
        preds = []
        for _ in range(iterations):
            fc = self.corr_mlp(corr.sample(track, coords).transpose(0, 1))                  # [N, S, latent]
            flow = (coords - coords[:1]).transpose(0, 1)                                   # [N, S, 2]
            emb = torch.cat((flow_embedding(flow, self.latent // 2), flow / self.max_scale,
                             flow / self.max_scale), dim=-1)
            x = torch.cat((emb, fc, track.transpose(0, 1)), dim=-1) + pos[:, None] + ref
            delta = self.updateformer(x)                                                   # [N, S, 2 + latent]
            d_feat = delta[..., 2:].reshape(N * S, self.latent)
            track = (self.ffeat_updater(self.ffeat_norm(d_feat)) + track.transpose(0, 1).reshape(N * S, -1))
            track = track.reshape(N, S, self.latent).transpose(0, 1)
            coords = coords + delta[..., :2].transpose(0, 1)
            coords[0] = q                                                                  # frame 0 pinned
            preds.append(coords * self.stride)
        flat = track.reshape(S * N, self.latent)
        vis = torch.sigmoid(self.vis_predictor(flat)).reshape(S, N)
        conf = torch.sigmoid(self.conf_predictor(flat)).reshape(S, N)
        return preds, vis, conf


class TrackHead(nn.Module):
    def __init__(self, dim_in: int, patch_size: int = 14, features: int = 128,
                 out_channels=(256, 512, 1024, 1024), iterations: int = 4, pos_embed: bool = True, **tracker):
        super().__init__()
        from .heads import TrackFeatures
        self.iterations = iterations
        self.feature_extractor = TrackFeatures(dim_in, patch_size, features, tuple(out_channels), pos_embed=pos_embed)
        self.tracker = Tracker(latent=features, **tracker)

    def forward(self, features: list, image_hw: tuple, patch_start: int, query_points: torch.Tensor,
                iterations: int | None = None):
        fmaps = self.feature_extractor(features, image_hw, patch_start)
        return self.tracker(query_points, fmaps, iterations or self.iterations)

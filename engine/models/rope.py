"""Rotary position embeddings of LingBot-Map: one 2D RoPE (frame blocks), one 3D "video" RoPE
(global blocks).

Both return a `Rotation` (cos/sin tables broadcastable to the `[B, N, H, D]` q/k layout used by
`engine.models.layers.Attention`) that is applied to q and k before attention, so keys enter any KV
cache already rotated.

Facts (upstream LingBot-Map / VGGT):
- 2D RoPE: head dim split in two halves (row y, column x); inside each half the classic
  "rotate-half" form with inverse frequencies `1 / freq**(arange(0, d, 2) / d)`, d = D/2, freq 100.
  Special tokens sit at (0, 0), patch (y, x) at (y+1, x+1). Tables in float32.
- 3D RoPE: head dim split (20, 22, 22) for (time, row, column) at D = 64 (otherwise
  h = w = 2*(D//6), t = rest), theta 1e4, rotating *interleaved* pairs (0,1), (2,3), ... Special
  token j of frame f sits at (f, j, j), patch (y, x) at (f, n_special + y, n_special + x). Angles in
  float64, cos/sin rounded once to the compute dtype.

Positions are computed from the formula, never looked up in a fixed-size table: for indices below
the released table size (`max_frame_num` = 1024) the values are bit-identical to the upstream
table, and past it the stream keeps running (see engine/lingbot/session.py, "Position limit").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rotation:
    """A rotary embedding ready to apply: `apply(x)` rotates x of shape [B, N, H, D].

    Both RoPE flavours rotate pairs of features (a, b) -> (a cos - b sin, b cos + a sin); they only
    pair different features. With the pair partner obtained by one `flip` of a view, the rotation
    is `x * cos + partner(x) * sin_signed` -- three kernels whatever the flavour, with full-width
    tables: `cos` [.., D] and `sin` [.., D] carrying -sin on the first and +sin on the second
    member of every pair.
    """

    cos: torch.Tensor          # [B or 1, N, 1, D]
    sin: torch.Tensor          # [B or 1, N, 1, D], signed
    interleaved: bool          # pairs (2i, 2i+1); else rotate-half inside each of `chunks` chunks
    chunks: int = 1

    def partner(self, x: torch.Tensor) -> torch.Tensor:
        D = x.shape[-1]
        if self.interleaved:
            return x.unflatten(-1, (D // 2, 2)).flip(-1).flatten(-2)
        return x.unflatten(-1, (self.chunks, 2, D // (2 * self.chunks))).flip(-2).flatten(-3)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x * self.cos, self.partner(x), self.sin)

    __call__ = apply


def _pair_tables(ang: torch.Tensor, interleaved: bool, chunks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width (cos, signed sin) tables from per-pair angles [..., D/2]."""
    c, s = ang.cos(), ang.sin()
    if interleaved:
        return (torch.stack((c, c), -1).flatten(-2), torch.stack((-s, s), -1).flatten(-2))
    c = c.unflatten(-1, (chunks, -1))
    s = s.unflatten(-1, (chunks, -1))
    return (torch.stack((c, c), -2).flatten(-3), torch.stack((-s, s), -2).flatten(-3))


class Rope2D:
    """2D RoPE of the frame blocks (no parameters)."""

    def __init__(self, head_dim: int, frequency: float = 100.0):
        if head_dim % 4:
            raise ValueError("2D RoPE needs a head dim divisible by 4")
        self.head_dim = head_dim
        self.frequency = frequency
        self._cache: dict = {}

    def positions(self, grid_h: int, grid_w: int, num_special: int) -> torch.Tensor:
        """[N, 2] (row, col) of one frame's tokens: specials at (0,0), patches at (y+1, x+1)."""
        yy, xx = torch.meshgrid(torch.arange(grid_h, device="cpu"), torch.arange(grid_w, device="cpu"), indexing="ij")
        patches = torch.stack((yy.reshape(-1), xx.reshape(-1)), dim=-1) + (1 if num_special else 0)
        return torch.cat((torch.zeros(num_special, 2, dtype=torch.long, device="cpu"), patches), dim=0)

    def rotation(self, grid_h: int, grid_w: int, num_special: int, device, dtype=torch.float32) -> Rotation:
        key = (grid_h, grid_w, num_special, str(device), dtype)
        rot = self._cache.get(key)
        if rot is None:
            d = self.head_dim // 2                                    # per axis
            inv_freq = 1.0 / (self.frequency ** (torch.arange(0, d, 2, device="cpu").float() / d))   # [d/2]
            pos = self.positions(grid_h, grid_w, num_special).float()                 # [N, 2]
            ang = torch.cat((pos[:, :1] * inv_freq, pos[:, 1:] * inv_freq), dim=-1)   # [N, d] = (y, x)
            cos, sin = _pair_tables(ang, interleaved=False, chunks=2)
            rot = Rotation(cos[None, :, None, :].to(device, dtype), sin[None, :, None, :].to(device, dtype),
                           interleaved=False, chunks=2)
            self._cache[key] = rot
        return rot


def video_rope_split(head_dim: int) -> tuple[int, int, int]:
    """(time, row, col) sizes of the head dim: (20, 22, 22) for the released D = 64."""
    if head_dim == 64:
        return (20, 22, 22)
    hw = 2 * (head_dim // 6)
    return (head_dim - 2 * hw, hw, hw)


class VideoRope3D:
    """3D RoPE of the global blocks (no parameters)."""

    def __init__(self, head_dim: int, theta: float = 1e4, split: tuple[int, int, int] | None = None):
        self.split = tuple(split) if split is not None else video_rope_split(head_dim)
        if sum(self.split) != head_dim or any(s % 2 for s in self.split):
            raise ValueError(f"3D RoPE split {self.split} must be even and sum to head dim {head_dim}")
        self.theta = theta
        self.inv_freq = [1.0 / (theta ** (torch.arange(0, s, 2, dtype=torch.float64, device="cpu") / s)) for s in self.split]
        self._spatial: dict = {}

    def _spatial_angles(self, grid_h: int, grid_w: int, num_special: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(spatial angles [N, (h+w)/2], time frequencies [t/2]) on `device`, float64, cached."""
        key = (grid_h, grid_w, num_special, str(device))
        cached = self._spatial.get(key)
        if cached is None:
            ft, fh, fw = self.inv_freq
            idx = torch.arange(num_special, dtype=torch.float64, device="cpu")
            special = torch.cat((idx[:, None] * fh, idx[:, None] * fw), dim=-1)          # (j, j)
            rows = (num_special + torch.arange(grid_h, dtype=torch.float64, device="cpu"))[:, None] * fh
            cols = (num_special + torch.arange(grid_w, dtype=torch.float64, device="cpu"))[:, None] * fw
            patches = torch.cat((rows[:, None, :].expand(grid_h, grid_w, -1),
                                 cols[None, :, :].expand(grid_h, grid_w, -1)), dim=-1).reshape(grid_h * grid_w, -1)
            ang = torch.cat((special, patches), dim=0)                                  # [N, (h+w)/2]
            cached = (ang.to(device), ft.to(device))
            self._spatial[key] = cached
        return cached

    def rotation(self, time_index: torch.Tensor | list[int], grid_h: int, grid_w: int, num_special: int,
                 device, dtype=torch.float32) -> Rotation:
        """Rotation for frames at temporal positions `time_index` ([F] ints, any size).

        The tables are built where they are used: on a GPU as a few small kernels (the spatial
        angles and time frequencies are kept there; no host data at all for consecutive times, the
        streamed case). Built on the host they cost CPU time every step (PyTorch's CPU thread pool
        for a small op), and each step's copy had to avoid a host sync."""
        device = torch.device(device)
        times = [int(i) for i in time_index]
        sp, inv_t = self._spatial_angles(grid_h, grid_w, num_special, device)
        if times and times == list(range(times[0], times[0] + len(times))):
            t = torch.arange(times[0], times[0] + len(times), dtype=torch.float64, device=device)
        else:
            from ..host_copy import upload      # no host sync (engine/host_copy.py)
            t = upload(times, device, torch.float64)
        t_ang = t[:, None] * inv_t                                                       # [F, t/2]
        ang = torch.cat((t_ang[:, None, :].expand(-1, sp.shape[0], -1),
                         sp[None].expand(t_ang.shape[0], -1, -1)), dim=-1)               # [F, N, D/2]
        cos, sin = _pair_tables(ang, interleaved=True)
        return Rotation(cos.to(dtype)[:, :, None, :], sin.to(dtype)[:, :, None, :], interleaved=True)

"""The shared transformer pieces: one attention, one MLP, one LayerScale, one block.

Every transformer in LingBot-Map (DINOv2 patch embed, frame blocks, global blocks, camera trunk)
is a `Block`; they differ only in norm eps, qk-norm, the rotary embedding passed in and the
`attend` function used for the softmax part (plain SDPA over the batch's own tokens by default; the
global blocks and the camera trunk pass a cache-backed one).

Layout: q, k, v are `[B, N, H, D]` views of one fused qkv projection (no copies); qk-norm is a
LayerNorm over D; RoPE rotates q and k before `attend`, so caches store rotated keys.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused

# attend(q, k, v) -> out, all [B, N, H, D] (out may have any strides)
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


_CUDNN_FIRST = None         # SDPA priority list with cuDNN first (built on first use)
cudnn_sdpa_error = None     # why cuDNN-first SDPA was given up (a failed call): PyTorch's order since
_SMS: dict = {}             # CUDA device index -> SM count
CUDNN_Q_TILE = 128          # q rows per work tile of cuDNN's SM90 attention kernels


def cudnn_one_wave(batch: int, q_tokens: int, heads: int, sms: int, tile: int = CUDNN_Q_TILE) -> bool:
    """cuDNN's attention over `batch` x `heads` x ceil(q_tokens / tile) work tiles fits one wave of
    `sms` SMs: a second, nearly empty wave more than doubles the call (docs/benchmarks.md "The wave
    tail": 1,005 against 1,042 queries at 16 heads)."""
    return batch * heads * -(-q_tokens // tile) <= sms


def _cudnn_first(q: torch.Tensor) -> bool:
    """cuDNN's attention kernel first for the blocks' own (unmasked) attention of q [B, N, H, D]
    in 16-bit on CUDA: at LingBot-Map's ~1,000 tokens it beats PyTorch's default flash kernel over
    the patch-embed and frame blocks (docs/benchmarks.md). Only while its work tiles fit one wave of
    the GPU's SMs (`cudnn_one_wave`)."""
    if cudnn_sdpa_error is not None:
        return False
    B, N, H, _ = q.shape
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if dev not in _SMS:
        _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return cudnn_one_wave(B, N, H, _SMS[dev])


def kernel_errors() -> dict:
    """Why a fast kernel path was given up for the process (None where it is in use): the fused
    Triton kernels (`fused.error`) and cuDNN-first attention (`cudnn_sdpa_error`). Session stats."""
    return {"fused": fused.error, "cudnn_first_sdpa": cudnn_sdpa_error}


def sdpa_bnhd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full (unmasked) attention on [B, N, H, D] tensors; returns [B, N, H, D]."""
    global _CUDNN_FIRST, cudnn_sdpa_error
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and _cudnn_first(q):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if _CUDNN_FIRST is None:
            _CUDNN_FIRST = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                            SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        try:
            with sdpa_kernel(_CUDNN_FIRST, set_priority=True):
                return F.scaled_dot_product_attention(qh, kh, vh).transpose(1, 2)
        except RuntimeError as exc:     # a shape cuDNN rejects at run time: PyTorch's order from now on
            if torch.cuda.is_current_stream_capturing():
                raise
            cudnn_sdpa_error = f"{type(exc).__name__}: {exc}"[:300]
    return F.scaled_dot_product_attention(qh, kh, vh).transpose(1, 2)


def global_attend(layer: int, kv) -> AttendFn:
    """The attend function of global (cross-frame) block `layer`, on [S, T, H, D] tensors.
    kv None: one bidirectional batch, all S frames see each other. Else a KV cache with
    write(layer, k, v) / attend(layer, q): the new keys/values are stored, then q attends to all kept."""
    if kv is None:
        def attend(q, k, v):
            S, T, Hh, D = q.shape
            flat = lambda t: t.reshape(1, S * T, Hh, D)
            return sdpa_bnhd(flat(q), flat(k), flat(v)).reshape(S, T, Hh, D)
        return attend

    def attend(q, k, v):
        kv.write(layer, k, v)
        return kv.attend(layer, q)
    return attend


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_value: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, out: Optional[int] = None, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out or dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.gelu_epilogue_usable(x, self.fc1):
            # fc1's bias and GELU in cuBLASLt's matmul epilogue: no separate pass over the
            # 4x-wide hidden tensor (the tanh GELU; see fused.gelu_epilogue_usable)
            h = torch._addmm_activation(self.fc1.bias, x.reshape(-1, x.shape[-1]), self.fc1.weight.t(),
                                        use_gelu=True)
            return self.fc2(h.view(*x.shape[:-1], h.shape[-1]))
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection and optional qk-norm."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = False, bias: bool = True, qk_eps: float = 1e-5):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=qk_eps) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim, eps=qk_eps) if qk_norm else None
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, rope=None, attend: Optional[AttendFn] = None) -> torch.Tensor:
        q, k, v = self.qkv_rotated(x, rope)
        return self.proj(self._merge((attend or sdpa_bnhd)(q, k, v)))

    def qkv_rotated(self, x: torch.Tensor, rope=None):
        """q, k, v [B, N, H, D] (q, k normed and rotated): everything before the softmax part."""
        B, N, C = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)
        if self.q_norm is not None and fused.qk_usable(qkv, self.q_norm, rope):
            qk = fused.qk_norm_rope(qkv, self.q_norm, self.k_norm, rope)         # one kernel
            if qk is not None:
                return (*qk, qkv[:, :, 2])
        q, k, v = qkv.unbind(2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rope(q), rope(k)
        return q, k, v

    @staticmethod
    def _merge(out: torch.Tensor) -> torch.Tensor:
        B, N, Hh, D = out.shape
        return out.reshape(B, N, Hh * D)


class Block(nn.Module):
    """Pre-norm transformer block with LayerScale: x + ls1(attn(norm1 x)), x + ls2(mlp(norm2 x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qk_norm: bool = False,
                 norm_eps: float = 1e-5, layer_scale: float = 0.01):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qk_norm=qk_norm)
        self.ls1 = LayerScale(dim, layer_scale)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, layer_scale)

    def forward(self, x: torch.Tensor, rope=None, attend: Optional[AttendFn] = None) -> torch.Tensor:
        # Mixed precision (see LingBotMap.set_dtype): the residual stream x, the norms and the
        # LayerScales may be float32 while the matmul weights are bf16/fp16 -- upstream's autocast
        # keeps the residual in float32 too; a bf16 residual loses the small per-block updates
        # (docs/model.md "Precision"). The normed input is cast once to the weights' dtype; the
        # residual + LayerScale stay one addcmul each (it promotes the bf16 branch to float32).
        q, k, v = self.attn_pre(x, rope)
        return self.attn_post(x, (attend or sdpa_bnhd)(q, k, v))

    # The two halves around the softmax part, so a caller can run them as fixed-shape CUDA graphs
    # while attention over a growing KV cache runs in between (engine/models/graphs.py).
    # On CUDA the norms, casts and the first residual run as fused Triton kernels
    # (engine/models/fused.py): the same arithmetic in fewer passes.
    def attn_pre(self, x: torch.Tensor, rope=None):
        """norm1, qkv, qk-norm, RoPE -> q, k, v [B, N, H, D]."""
        dt = self.attn.qkv.weight.dtype
        h = fused.layer_norm_cast(x, self.norm1, dt) if fused.usable(x, self) else None
        return self.attn.qkv_rotated(self.norm1(x).to(dt) if h is None else h, rope)

    def attn_post(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Output projection + LayerScale residual, then the MLP residual."""
        dt = self.attn.qkv.weight.dtype
        proj = self.attn.proj(self.attn._merge(attn_out.to(dt)))
        res = fused.residual_layer_norm(x, proj, self.ls1.gamma, self.norm2, dt) if fused.usable(x, self) else None
        if res is None:
            x = torch.addcmul(x, proj, self.ls1.gamma)
            h = self.norm2(x).to(dt)
        else:
            x, h = res
        m = self.mlp(h)
        out = fused.residual(x, m, self.ls2.gamma) if res is not None else None
        return torch.addcmul(x, m, self.ls2.gamma) if out is None else out

"""CPU checks of when the fused block kernels apply (engine/models/fused.py): never on the CPU or
when switched off, and only for the qkv / RoPE layouts the kernel reads. Numerics: test_fused_gpu.py."""
import torch

from engine.models import fused
from engine.models.layers import Block
from engine.models.rope import Rope2D, VideoRope3D


def test_not_used_on_the_cpu_or_when_switched_off(monkeypatch):
    blk = Block(64, 4, qk_norm=True)
    x = torch.randn(1, 10, 64)
    assert not fused.usable(x, blk)
    qkv = torch.randn(1, 10, 3, 4, 16, dtype=torch.bfloat16)
    assert not fused.qk_usable(qkv, blk.attn.q_norm, None)
    monkeypatch.setenv("RECONSTUDIO_FUSED_BLOCKS", "0")
    assert not fused.fused_requested()
    monkeypatch.setenv("RECONSTUDIO_FUSED_BLOCKS", "1")
    assert fused.fused_requested()


def test_layouts_the_qk_kernel_accepts():
    B, gh, gw, H, D = 2, 3, 4, 4, 16
    N = gh * gw + 6
    qkv = torch.randn(B, N, 3 * H * D).view(B, N, 3, H, D)          # the projection's view
    r2 = Rope2D(D).rotation(gh, gw, 6, "cpu")
    r3 = VideoRope3D(D).rotation([5, 6], gh, gw, 6, "cpu")
    assert fused.qk_norm_rope_ok(qkv, r2) and fused.qk_norm_rope_ok(qkv, r3) and fused.qk_norm_rope_ok(qkv, None)
    assert not fused.qk_norm_rope_ok(qkv[:, :-1], r2)                 # tables for other tokens
    assert not fused.qk_norm_rope_ok(qkv.transpose(3, 4), None)       # head dim not innermost
    odd = torch.randn(B, N, 3 * 3 * D).view(B, N, 3, 3, D)            # 3 heads: not a power of two
    assert not fused.qk_norm_rope_ok(odd, None)
    r3b = VideoRope3D(D).rotation([5, 6, 7], gh, gw, 6, "cpu")         # 3 frames of tables for 2
    assert not fused.qk_norm_rope_ok(qkv, r3b)

"""CPU checks of when the fused block kernels apply (engine/models/fused.py): never on the CPU,
and only for the qkv / RoPE layouts the kernel reads. Numerics: test_fused_gpu.py."""
import os

import pytest
import torch

from engine.models import fused
from engine.models.layers import Block
from engine.models.rope import Rope2D, VideoRope3D


def test_not_used_on_the_cpu():
    blk = Block(64, 4, qk_norm=True)
    x = torch.randn(1, 10, 64)
    assert not fused.usable(x, blk)
    qkv = torch.randn(1, 10, 3, 4, 16, dtype=torch.bfloat16)
    assert not fused.qk_usable(qkv, blk.attn.q_norm, None)
    xb = x.to(torch.bfloat16)
    assert not fused.gelu_epilogue_usable(xb, blk.mlp.to(torch.bfloat16).fc1)      # CUDA only
    assert not fused.merge_usable(torch.randn(10, 4, 16), torch.randn(4, 10))


def test_the_gelu_epilogue_takes_dense_weights_only():
    """torchao's quantized weights (weight_dtype int8 / fp8) implement F.linear but not the raw
    matmul ops of the fused epilogue: the MLP must take the plain path for them. The gate reads
    only the input's device and dtype, so a CUDA input is stood in for on the CPU."""
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    cuda_bf16 = type("CudaInput", (), {"is_cuda": True, "dtype": torch.bfloat16})()
    for cfg in (Int8WeightOnlyConfig(), Float8WeightOnlyConfig()):
        blk = Block(64, 4).to(torch.bfloat16)
        assert fused.plain_weight(blk.mlp.fc1.weight)
        assert fused.gelu_epilogue_usable(cuda_bf16, blk.mlp.fc1)          # dense bf16: the epilogue
        quantize_(blk, cfg, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear))
        assert blk.mlp.fc1.weight.dtype == torch.bfloat16                  # still reports bf16 ...
        assert not fused.plain_weight(blk.mlp.fc1.weight)
        assert not fused.gelu_epilogue_usable(cuda_bf16, blk.mlp.fc1)      # ... but is not dense


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


def test_a_failing_kernel_switches_the_kernels_off_and_returns_none(monkeypatch):
    monkeypatch.setattr(fused, "error", None)

    @fused._guarded
    def broken(x):
        raise RuntimeError("no Triton backend for this GPU (stand-in)")
    assert broken(1) is None
    assert "stand-in" in fused.error


interpreted = pytest.mark.skipif(fused.triton is None or os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs Triton with TRITON_INTERPRET=1 (CPU tensors)")


@interpreted
def test_kernels_in_the_triton_interpreter():
    """The kernels' arithmetic on the CPU through Triton's interpreter (not in CI: no Triton there;
    e.g. pip install --target /tmp/t triton; TRITON_INTERPRET=1 PYTHONPATH=/tmp/t:. pytest this)."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(2, 9, 64) * 3 + 1
    torch.testing.assert_close(fused.layer_norm_cast(x, norm, torch.bfloat16).float(), norm(x), atol=4e-2, rtol=1e-2)
    r, g = torch.randn(2, 9, 64).to(torch.bfloat16), torch.rand(64)
    xo, h = fused.residual_layer_norm(x, r, g, norm, torch.bfloat16)
    torch.testing.assert_close(xo, torch.addcmul(x, r, g))
    torch.testing.assert_close(h.float(), norm(xo), atol=4e-2, rtol=1e-2)
    torch.testing.assert_close(fused.residual(x, r, g), torch.addcmul(x, r, g))
    oa, ob = torch.randn(5, 4, 16).to(torch.bfloat16), torch.randn(4, 5, 16).to(torch.bfloat16).transpose(0, 1)
    la, lb = torch.randn(4, 7)[:, :5], torch.randn(4, 5)
    ref = torch.lerp(oa.float(), ob.float(), torch.sigmoid(lb - la).t().unsqueeze(-1))
    torch.testing.assert_close(fused.merge_lse(oa, la, ob, lb).float(), ref, atol=1e-2, rtol=1e-2)
    from engine.models.layers import Attention
    attn = Attention(64, 4, qk_norm=True).to(torch.bfloat16)
    for rope in (Rope2D(16).rotation(3, 4, 6, "cpu", torch.bfloat16),
                 VideoRope3D(16).rotation([3, 4], 3, 4, 6, "cpu", torch.bfloat16), None):
        xx = torch.randn(2, 18, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            qkv = attn.qkv(xx).view(2, 18, 3, 4, 16)
            q, k = fused.qk_norm_rope(qkv, attn.q_norm, attn.k_norm, rope)
            q0, k0 = attn.q_norm(qkv[:, :, 0]), attn.k_norm(qkv[:, :, 1])
            if rope is not None:
                q0, k0 = rope(q0), rope(k0)
        torch.testing.assert_close(q.float(), q0.float(), atol=6e-2, rtol=2e-2)
        torch.testing.assert_close(k.float(), k0.float(), atol=6e-2, rtol=2e-2)


def test_cudnn_first_only_while_its_tiles_fit_one_wave():
    from engine.models import layers
    # the H200's 132 SMs, 16 heads: one frame of 1,005 tokens is 8 x 16 = 128 tiles, one of 1,042
    # (a 640x480 input at 518x392) 144 -- a second wave -- and a batch of 8 frames 1,024
    assert layers.cudnn_one_wave(1, 1005, 16, 132)
    assert not layers.cudnn_one_wave(1, 1042, 16, 132)
    assert not layers.cudnn_one_wave(8, 1005, 16, 132)
    assert layers.cudnn_one_wave(1, 1042, 8, 132)
    # CPU tensors never ask for cuDNN: the plain SDPA result
    q, k, v = (torch.randn(1, 10, 4, 16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    torch.testing.assert_close(layers.sdpa_bnhd(q, k, v), ref.transpose(1, 2))

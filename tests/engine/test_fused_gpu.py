"""GPU checks of the fused Triton kernels of the transformer blocks (engine/models/fused.py) against
the unfused PyTorch ops they replace, to bf16 rounding: LayerNorm + cast, LayerScale residual +
LayerNorm + cast, the last LayerScale residual, the split attention's log-sum-exp merge, the
GELU matmul epilogue, qk-norm + RoPE (the frame blocks' 2D RoPE, the global blocks' 3D RoPE, none),
whole blocks, and a full-size LingBot-Map session against the same session with
the plain ops (`fused.error` set, as after a failed kernel). Skipped without CUDA and Triton. CPU checks: test_fused.py."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.models import fused

pytestmark = pytest.mark.gpu
needs = pytest.mark.skipif(not torch.cuda.is_available() or fused.triton is None, reason="needs CUDA and Triton")


def _close(a, b, tol=2e-2):
    err = (a.float() - b.float()).abs().max().item()
    scale = b.float().abs().max().item()
    assert err <= tol * max(scale, 1.0), (err, scale)


@needs
def test_layer_norm_kernels_equal_pytorch():
    g = torch.Generator(device="cuda").manual_seed(0)
    norm = torch.nn.LayerNorm(1024, eps=1e-6).cuda()
    with torch.no_grad():
        norm.weight.normal_(generator=g)
        norm.bias.normal_(generator=g)
    x = torch.randn(2, 1005, 1024, device="cuda", generator=g) * 3 + 1
    _close(fused.layer_norm_cast(x, norm, torch.bfloat16), norm(x).to(torch.bfloat16))
    r = torch.randn(2, 1005, 1024, device="cuda", generator=g).to(torch.bfloat16)
    gamma = torch.rand(1024, device="cuda", generator=g)
    xo, h = fused.residual_layer_norm(x, r, gamma, norm, torch.bfloat16)
    ref = torch.addcmul(x, r, gamma)
    torch.testing.assert_close(xo, ref, atol=1e-5, rtol=1e-5)        # float32 both ways
    _close(h, norm(ref).to(torch.bfloat16))


@needs
def test_residual_and_merge_kernels_equal_pytorch():
    from engine.kv import cudnn_kernels as cudnn
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(1, 1005, 1024, device="cuda", generator=g)
    r = torch.randn(1, 1005, 1024, device="cuda", generator=g).to(torch.bfloat16)
    gamma = torch.rand(1024, device="cuda", generator=g)
    torch.testing.assert_close(fused.residual(x, r, gamma), torch.addcmul(x, r, gamma), atol=1e-5, rtol=1e-5)
    # two attention partials in the layouts the split hands over: out [n, H, D] (B's a strided
    # view), lse [H, n] views of wider rows
    n, H, D = 1005, 16, 64
    oa = torch.randn(n, H, D, device="cuda", generator=g).to(torch.bfloat16)
    ob = torch.randn(H, n, D, device="cuda", generator=g).to(torch.bfloat16).transpose(0, 1)
    la = torch.randn(H, n + 11, device="cuda", generator=g)[:, :n] * 4
    lb = torch.randn(H, n + 3, device="cuda", generator=g)[:, :n] * 4
    assert fused.merge_usable(oa, la)
    got = cudnn.merge_lse(oa, la, ob, lb)
    w = torch.sigmoid(lb - la).t().unsqueeze(-1)
    ref = torch.lerp(oa.float(), ob.float(), w)
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    _close(got, ref, tol=1e-2)
    # exact union: attention over keys [K_a; K_b] equals the merge of the two partials
    q, k, v = (torch.randn(64, H, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    k2, v2 = (torch.randn(200, H, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    o1, l1 = cudnn.torch_flash_lse(q, k, v)
    o2, l2 = cudnn.torch_flash_lse(q, k2, v2)
    full = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, torch.cat((k, k2)), torch.cat((v, v2)))))
    _close(cudnn.merge_lse(o1, l1, o2, l2), full.transpose(0, 1), tol=2e-2)


@needs
def test_gelu_epilogue_equals_the_two_step_mlp(monkeypatch):
    from engine.models.layers import Mlp
    torch.manual_seed(2)
    mlp = Mlp(1024, 4096).cuda().to(torch.bfloat16)
    x = torch.randn(1, 1005, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert fused.gelu_epilogue_usable(x, mlp.fc1)
        got = mlp(x)
        ref = mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh"))
        exact = mlp.fc2(F.gelu(mlp.fc1(x)))
        x32 = x.float()                                               # float32 keeps the exact GELU
        assert not fused.gelu_epilogue_usable(x32, mlp.float().fc1)
        mlp.to(torch.bfloat16)
    _close(got, ref, tol=1e-2)
    _close(got, exact, tol=2e-2)


@needs
@pytest.mark.parametrize("kind", ["rope2d", "rope3d", "none"])
def test_qk_norm_rope_equals_the_unfused_path(kind, monkeypatch):
    from engine.models.layers import Attention
    from engine.models.rope import Rope2D, VideoRope3D
    torch.manual_seed(1)
    attn = Attention(1024, 16, qk_norm=True).cuda().to(torch.bfloat16)
    with torch.no_grad():
        for m in (attn.q_norm, attn.k_norm):
            m.weight.normal_()
            m.bias.normal_()
    B, gh, gw = 2, 27, 37
    rope = {"rope2d": Rope2D(64).rotation(gh, gw, 6, "cuda", torch.bfloat16),
            "rope3d": VideoRope3D(64).rotation([40, 41], gh, gw, 6, "cuda", torch.bfloat16),
            "none": None}[kind]
    x = torch.randn(B, gh * gw + 6, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        qkv = attn.qkv(x).view(B, -1, 3, 16, 64)
        assert fused.qk_usable(qkv, attn.q_norm, rope)
        q, k, v = attn.qkv_rotated(x, rope)
        monkeypatch.setattr(fused, "error", "reference: the plain ops")    # what a failed kernel leaves
        q0, k0, v0 = attn.qkv_rotated(x, rope)
    assert q.is_contiguous() and k.is_contiguous() and q.dtype == torch.bfloat16
    _close(q, q0)
    _close(k, k0)
    torch.testing.assert_close(v, v0)


@needs
def test_fused_session_equals_the_unfused_session(monkeypatch):
    from engine import SessionConfig, open_session
    from tests.engine.factories import random_model
    from tests.engine.backend_sessions import rel
    model = random_model("lingbot-map", "cuda")
    gen = torch.Generator().manual_seed(3)
    frames = [torch.rand(3, 378, 518, generator=gen) for _ in range(12)]
    out = {}
    for flag in ("1", "0"):
        if flag == "0":      # the plain ops, as after a failed kernel (fused.error)
            monkeypatch.setattr(fused, "error", "reference: the plain ops")
        s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", scale_frames=2,
                                       window=4, keyframe_interval=2, special_cap=8), model=model)
        out[flag] = [r for f in frames for r in s.push(f)] + s.flush()
        s.close()
    pose = rel(np.stack([r.pose_enc for r in out["1"]]), np.stack([r.pose_enc for r in out["0"]]))
    depth = rel(np.stack([r.depth for r in out["1"]]), np.stack([r.depth for r in out["0"]]))
    print(f"fused vs unfused blocks: pose_enc {pose:.2e}, depth {depth:.2e}")
    assert pose < 3e-2 and depth < 3e-2

"""The cuDNN split backend over an fp8 store on the CPU, in both of its modes
(`cudnn_fp8_mode`): "convert" (the run read into 16-bit scratch, key scales folded into q, value
scales applied to the output; the kernels are CPU flash stand-ins for cuDNN) and "compute"
(`CuDNNSplitBackend._attend_split_fp8`), and the fp8 kernel's own arithmetic (`fp8_quantize_q`,
`fp8_output`). In "compute" the fp8 kernel is a stand-in with `CuDNNFP8Kernel`'s call signature that checks what cuDNN would be handed (e4m3
zero-copy views of the pool, the layer's per-head scales, statistics only for the split part, one
output-scale slot per layer and kind) and attends the dequantised keys with CPU flash attention.
Outputs must equal the SDPA backend's over the same fp8 store (which dequantises on gather)
through window filling, eviction, rollbacks, the special ring's growth and wrap, and whole
fixed-length steps. GPU checks of the real kernel: test_cudnn_fp8_gpu.py."""
import pytest
import torch

from engine.kv.backends import SDPABackend
from engine.kv.cudnn import (FP8_E4M3_MAX, CuDNNSplitBackend, cudnn_fp8_mode, fp8_output, fp8_quantize_q,
                             torch_flash_lse)
from tests.engine.kv_pair import H, D, P, cache_pair, drive

PATTERN = "kknkkknkknknnkkkknknkk"      # fills, evicts, rolls back (interval 2), wraps the ring
FP8 = torch.float8_e4m3fn


class FP8StandIn:
    def __init__(self, cache):
        self.pool = cache.pool
        self.calls = []                  # (slot, stats, K/V tokens)

    def __call__(self, q, k8, v8, ks, vs, slot=0, stats=False):
        pool = self.pool
        layer, kind = slot
        assert k8.dtype == v8.dtype == FP8 and k8.shape == v8.shape and k8.stride() == (H * D, D, 1)
        base = pool.k.data_ptr()
        assert base <= k8.data_ptr() < base + pool.k.numel() * pool.k.element_size()   # zero copy
        assert ks is pool.scales[layer, 0] or torch.equal(ks, pool.scales[layer, 0])
        assert torch.equal(vs, pool.scales[layer, 1])
        assert stats == (kind == "split")
        self.calls.append((slot, stats, k8.shape[0]))
        k = k8.float() * ks.view(1, -1, 1)
        v = v8.float() * vs.view(1, -1, 1)
        out, lse = torch_flash_lse(q.float(), k, v)
        return (out.to(q.dtype), lse) if stats else out.to(q.dtype)


def _caches(**kw):
    cu, sd = cache_pair(dtype="fp8", attn_dtype="fp32", **kw)
    stand_in = FP8StandIn(cu)
    cu._attn = CuDNNSplitBackend(cu, kernel_fp8=stand_in, fallback=SDPABackend.create(cu))
    return cu, sd, stand_in


def _drive_paths(cu, sd):
    paths = []
    for a, b, step, path in ((*r[:3], r[4]) for r in drive(cu, sd, PATTERN, attended=lambda c: c._attn.path)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        paths.append(path)
        if path == "whole":
            assert step.fixed_length
    # the window fills on the fallback, then splits, then (ring full) whole steps
    assert paths[0] == "fallback" and "split" in paths and paths[-1] == "whole"
    be = cu._attn
    assert be.calls["split"] > 0 and be.calls["whole"] > 0 and be.error is None


def test_fp8_store_read_into_scratch_equals_sdpa_over_the_same_store(monkeypatch):
    monkeypatch.delenv("RECONSTUDIO_CUDNN_FP8", raising=False)
    cu, sd = cache_pair(dtype="fp8", attn_dtype="fp32")
    seen = []

    def kernel_a(q, k, v):           # what cuDNN would get: 16-bit-style scratch, not the e4m3 bytes
        assert k.dtype == v.dtype == cu.attn_dtype and k.data_ptr() == cu._attn._scratch[0].data_ptr()
        seen.append(k.shape[0])
        return torch_flash_lse(q, k, v)
    cu._attn = be = CuDNNSplitBackend(cu, kernel_a=kernel_a, kernel_full=lambda q, k, v: torch_flash_lse(q, k, v)[0],
                                      fallback=SDPABackend.create(cu))
    assert be.fp8_mode == "convert" and be._ok and "fp8 store" in be.kernel
    _drive_paths(cu, sd)
    assert len(set(seen)) == 1                               # part A: one constant shape
    assert be._scratch[0].shape == (cu.pool.num_pages * P, H, D)   # allocated once, whole capacity


def test_fp8_mode_knob(monkeypatch):
    monkeypatch.setenv("RECONSTUDIO_CUDNN_FP8", "bogus")
    with pytest.raises(Exception, match="convert.*compute"):
        cudnn_fp8_mode()
    monkeypatch.setenv("RECONSTUDIO_CUDNN_FP8", "compute")
    assert cudnn_fp8_mode() == "compute"


def test_fp8_compute_split_and_whole_steps_equal_sdpa_over_the_same_store(monkeypatch):
    monkeypatch.setenv("RECONSTUDIO_CUDNN_FP8", "compute")
    cu, sd, stand_in = _caches()
    be = cu._attn
    assert be._ok and "fp8 compute" in be.kernel
    _drive_paths(cu, sd)
    slots = {s for s, _, _ in stand_in.calls}
    assert {k for _, k in slots} == {"split", "whole"} and {lay for lay, _ in slots} == {0, 1}
    # the store is what the SDPA cache holds too: same quantised bytes and scales
    assert torch.equal(cu.pool.scales, sd.pool.scales)


def test_fp8_compute_without_an_fp8_kernel_falls_back_on_the_cpu(monkeypatch):
    monkeypatch.setenv("RECONSTUDIO_CUDNN_FP8", "compute")
    cu, sd = cache_pair(dtype="fp8", attn_dtype="fp32")
    be = CuDNNSplitBackend(cu, fallback=SDPABackend.create(cu))
    assert not be._ok                  # fp32 attention, no stand-in: nothing for cuDNN's fp8 kernel
    cu._attn = be
    for a, b, *_ in drive(cu, sd, "kkkkkkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y)
    assert be.calls["split"] == be.calls["whole"] == 0 and be.calls["fallback"] > 0


def test_q_quantisation_folds_the_key_scales_and_keeps_the_scores():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(40, H, D, generator=g) * 2
    k = torch.randn(30, H, D, generator=g)
    ks = k.abs().amax(dim=(0, 2)) * 8 / FP8_E4M3_MAX
    k8 = (k / ks.view(1, H, 1)).to(FP8)
    q8, dq = fp8_quantize_q(q, ks)
    assert q8.dtype == FP8 and dq.shape == (1, 1, 1, 1)
    assert float(q8.float().abs().max()) == FP8_E4M3_MAX          # the range is used to its end
    # scores the kernel forms (q8 . k8 * dq) against the scores of q and the real keys
    s_kernel = torch.einsum("nhd,shd->hns", q8.float() * dq.view(1, 1, 1), k8.float())
    s_true = torch.einsum("nhd,shd->hns", q, k8.float() * ks.view(1, H, 1))
    err = (s_kernel - s_true).norm() / s_true.norm()
    assert err < 0.04                                            # e4m3: 3 mantissa bits (~2 % RMS)
    assert err > 0                                               # q really went through e4m3


def test_output_rescale_and_the_next_scale_from_amax():
    g = torch.Generator().manual_seed(4)
    real = torch.randn(10, H, D, generator=g)                     # attention over the stored values
    vs = torch.tensor([0.5, 3.0])
    so = torch.full((1, 1, 1, 1), 16.0)
    o8 = (real * 16.0).to(FP8)                                    # what the kernel writes: scaled
    amax_o = real.abs().amax().view(1, 1, 1, 1)                   # the kernel's amax: unscaled
    out, nxt = fp8_output(o8, so, amax_o, vs, torch.float32, headroom=2.0)
    torch.testing.assert_close(out, real * vs.view(1, H, 1), atol=0.1, rtol=0.07)
    torch.testing.assert_close(nxt, (FP8_E4M3_MAX / 2.0) / amax_o)

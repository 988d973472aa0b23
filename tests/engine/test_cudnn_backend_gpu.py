"""GPU checks of the cuDNN backend (PyTorch's real cuDNN SDPA kernel over the fixed capacity with
the bias row) against SDPA on the same steps, to bf16 tolerance: while the window fills, in the
steady state, across keyframe rollbacks and the special ring's wrap; and a
LingBot-Map session on it against an SDPA session. Skipped without CUDA. Steps are queued without
a host sync in between (outputs compared at the end), as a session runs them."""
import pytest
import torch

from engine.kv import PagedKVCache
from engine.kv.cudnn import CuDNNBackend
from tests.engine.backend_sessions import assert_matches_sdpa

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

L, H, D, P, S6 = 2, 16, 64, 130, 6


@needs_cuda
def test_cudnn_fixed_capacity_equals_sdpa_without_syncs():
    kw = dict(scale_frames=2, window=4, special_cap=8, dtype=torch.bfloat16, device="cuda")
    cu = PagedKVCache(L, H, D, P, backend="sdpa", **kw)
    cu._attn = CuDNNBackend(cu, min_fill=0.0)      # the fixed path from the first step
    sdpa = PagedKVCache(L, H, D, P, backend="sdpa", **kw)
    gen = torch.Generator(device="cuda").manual_seed(0)
    outs = {id(c): [] for c in (cu, sdpa)}
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in "kkknkkkkknnkkkkkkk"]:
        k, v, q = (torch.randn(L, nf, S6 + P, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for c in (cu, sdpa):
            c.begin_step(nf, scale=scale, keyframe=key)
            for layer in range(L):
                c.write(layer, k[layer], v[layer])
                outs[id(c)].append(c.attend(layer, q[layer]).clone())
            c.end_step()
    torch.cuda.synchronize()
    be = cu._attn
    assert be.error is None, be.error
    assert be.calls["exact"] == 0 and be.calls["fixed"] == len(outs[id(cu)])
    assert cu.stats()["special_dropped"] > 0
    for a, b in zip(outs[id(cu)], outs[id(sdpa)]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@needs_cuda
def test_cudnn_session_matches_sdpa_session():
    def uses_cudnn(s):
        be = s.kv.attention
        assert be.error is None, be.error
        assert be.calls["fixed"] > 0
    assert_matches_sdpa("cudnn", check=uses_cudnn)

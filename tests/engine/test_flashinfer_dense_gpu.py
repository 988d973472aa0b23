"""GPU checks of FlashInfer's dense (ragged, FA3 on Hopper) path against its paged path and SDPA
on the same steps; skipped without CUDA + flashinfer. Steps are queued without a host sync in
between (outputs compared at the end), as a session that hands results out a step later runs
them, so a plan overwriting the previous plan's host buffer too early would show here."""
import pytest
import torch

from engine.kv import PagedKVCache
from engine.kv.backends import FlashInferBackend, flashinfer_available, flashinfer_kernel

pytestmark = pytest.mark.gpu
needs_fi = pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                              reason="needs CUDA and flashinfer")

L, H, D, P, S6 = 2, 16, 64, 130, 6


@needs_fi
def test_dense_equals_paged_and_sdpa_without_syncs():
    kw = dict(scale_frames=2, window=4, special_cap=16, dtype=torch.bfloat16, device="cuda")
    dense = PagedKVCache(L, H, D, P, backend=FlashInferBackend, **kw)
    dense._attn = FlashInferBackend(dense, dense=True)
    paged = PagedKVCache(L, H, D, P, backend=FlashInferBackend, **kw)
    paged._attn = FlashInferBackend(paged, dense=False)
    sdpa = PagedKVCache(L, H, D, P, backend="sdpa", **kw)
    assert dense._attn.kernel == flashinfer_kernel("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    outs, paths = {id(c): [] for c in (dense, paged, sdpa)}, []
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in "kkknkkkkknkkkk"]:
        k, v, q = (torch.randn(L, nf, S6 + P, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for c in (dense, paged, sdpa):
            c.begin_step(nf, scale=scale, keyframe=key)
            for layer in range(L):
                c.write(layer, k[layer], v[layer])
                outs[id(c)].append(c.attend(layer, q[layer]).clone())
            c.end_step()
        paths.append(dense._attn.path)
    torch.cuda.synchronize()
    assert "dense" in paths and paged._attn.path == "paged"
    for a, b, c in zip(outs[id(dense)], outs[id(paged)], outs[id(sdpa)]):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(a.float(), c.float(), atol=2e-2, rtol=2e-2)

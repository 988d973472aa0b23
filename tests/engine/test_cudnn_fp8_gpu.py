"""GPU check of the split backend over an fp8 store: the run read into 16-bit scratch and
attended by cuDNN / flash, against SDPA over the same fp8 store through filling, eviction,
rollbacks, ring wrap and whole steps (bf16 tolerance). Skipped without CUDA. CPU checks:
test_cudnn_fp8.py."""
import pytest
import torch

from engine.kv import PagedKVCache
from engine.kv.cudnn_split import CuDNNSplitBackend

pytestmark = pytest.mark.gpu
needs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
H, D = 16, 64


@needs
def test_split_over_fp8_store_is_close_to_sdpa_over_it():
    kw = dict(scale_frames=2, window=4, special_cap=8, dtype="fp8", attn_dtype="bf16", device="cuda")
    L, page, S6 = 2, 130, 6
    cu = PagedKVCache(L, H, D, page, special_tokens=S6, backend="sdpa", **kw)
    cu._attn = be = CuDNNSplitBackend(cu)
    sd = PagedKVCache(L, H, D, page, special_tokens=S6, backend="sdpa", **kw)
    gen = torch.Generator(device="cuda").manual_seed(1)
    worst = 0.0
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in "kkknkkkknknkkknknkkkkknk"]:
        k, v, q = (torch.randn(L, nf, S6 + page, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        outs = []
        for c in (cu, sd):
            c.begin_step(nf, scale=scale, keyframe=key)
            outs.append([(c.write(i, k[i], v[i]), c.attend(i, q[i]))[1] for i in range(L)])
            c.end_step()
        for x, y in zip(*outs):
            worst = max(worst, float((x.float() - y.float()).norm() / y.float().norm()))
    assert be.error is None and be.calls["split"] > 0 and be.calls["whole"] > 0, be.path_stats()
    assert be.fp8 and worst < 0.02, worst

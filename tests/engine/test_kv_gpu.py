"""GPU checks of the paged KV cache (run on the H200; skipped without CUDA): FlashInfer and SDPA
agree on the same steps (same page tables), zero-copy equals gather on CUDA, and a bf16 cache
stays bf16 / an fp32 cache stays fp32."""
import pytest
import torch

from engine.kv import KVCacheError, PagedKVCache
from engine.kv.backends import SDPABackend, flashinfer_available

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_fi = pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                              reason="needs CUDA and flashinfer")

L, H, D, P, S6 = 2, 16, 64, 130, 6       # fixture-sized frames (10x13 patches)
T = S6 + P


def _stream(caches, pattern, scale_frames, seed=0):
    """Drive identical steps through every cache; yield the per-layer outputs of each step."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    steps = [(scale_frames, True, True)] + [(1, False, c == "k") for c in pattern]
    for nf, scale, key in steps:
        k = torch.randn(L, nf, T, H, D, generator=gen, device="cuda")
        v = torch.randn(L, nf, T, H, D, generator=gen, device="cuda")
        q = torch.randn(L, nf, T, H, D, generator=gen, device="cuda")
        outs = []
        for c in caches:
            c.begin_step(nf, scale=scale, keyframe=key)
            o = []
            for layer in range(L):
                c.write(layer, k[layer], v[layer])
                o.append(c.attend(layer, q[layer].to(c.attn_dtype)))
            c.end_step()
            outs.append(o)
        yield outs


@needs_fi
@pytest.mark.parametrize("dtype", [torch.bfloat16])   # fp16 would cost another ~100 s JIT build
def test_flashinfer_matches_sdpa_on_the_same_steps(dtype):
    kw = dict(scale_frames=2, window=4, special_cap=8, dtype=dtype, device="cuda")
    fi = PagedKVCache(L, H, D, P, backend="flashinfer", **kw)
    sd = PagedKVCache(L, H, D, P, backend="sdpa", **kw)
    assert fi.backend.name == "flashinfer" and sd.backend.name == "sdpa"
    n = 0
    for outs in _stream([fi, sd], "kknkkknkkkkknkkk", 2):
        for a, b in zip(*outs):
            assert a.dtype == dtype
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
        n += 1
    assert n == 17 and fi.state() == sd.state()


@needs_fi
def test_auto_picks_flashinfer_on_cuda_for_bf16_and_sdpa_for_fp32():
    kw = dict(scale_frames=1, window=2, special_cap=8, device="cuda", backend="auto")
    c = PagedKVCache(1, H, D, P, dtype="bf16", **kw)
    assert c.backend.name == "flashinfer"
    c = PagedKVCache(1, H, D, P, dtype="fp32", **kw)
    assert c.backend.name == "sdpa" and c.k_pool.dtype == torch.float32
    with pytest.raises(KVCacheError, match="bf16 and fp16"):
        PagedKVCache(1, H, D, P, scale_frames=1, window=2, special_cap=8, dtype="fp32",
                     device="cuda", backend="flashinfer")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_zero_copy_equals_gather(dtype):
    c = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=6, dtype=dtype,
                     device="cuda", backend="sdpa")
    for _ in _stream([c], "k" * 12, 2):
        pass
    gen = torch.Generator(device="cuda").manual_seed(1)
    step = c.begin_step(1)
    assert step.contiguous is not None
    gather = SDPABackend(c, zero_copy=False)
    for layer in range(L):
        k = torch.randn(1, T, H, D, generator=gen, device="cuda")
        c.write(layer, k, k)
        q = torch.randn(1, T, H, D, generator=gen, device="cuda").to(dtype)
        a = c.attend(layer, q)[0]
        b = gather.attend(step, q[0], layer)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)
    c.end_step()


@needs_fi
@pytest.mark.parametrize("method", ["token_partition", "random_subset", "token_merge", "block_sparse"])
def test_flashinfer_and_sdpa_agree_on_compressed_windows(method):
    """The kept-token tables (pages of one token) give FlashInfer the same visible set as SDPA."""
    from engine.kv import make_compressor
    kw = dict(scale_frames=2, window=4, special_cap=8, dtype="bf16", device="cuda")
    caches = [PagedKVCache(L, H, D, P, backend=b, compression=make_compressor(method, 0.5, 32, 1), **kw)
              for b in ("flashinfer", "sdpa")]
    for fi, sd in _stream(caches, "kknkkkknkk", scale_frames=2):
        for a, b in zip(fi, sd):
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@needs_fi
@pytest.mark.xfail(reason="flashinfer 0.6.1's bf16-q / e4m3-KV prefill failed to JIT-build on the H200 "
                          "(docs/benchmarks_kv.md); kept to catch the day it builds", strict=False)
def test_flashinfer_fp8_kv_path_agrees_with_the_dequantising_sdpa_path():
    kw = dict(scale_frames=2, window=4, special_cap=8, dtype="fp8", attn_dtype="bf16", device="cuda")
    caches = [PagedKVCache(L, H, D, P, backend=b, **kw) for b in ("flashinfer", "sdpa")]
    for fi, sd in _stream(caches, "kknkkk", scale_frames=2):
        for a, b in zip(fi, sd):
            torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)

"""GPU checks of the paged KV cache (run on the H200; skipped without CUDA): FlashInfer and SDPA
agree on the same steps (same page tables), zero-copy equals gather on CUDA, a bf16 cache stays
bf16 / an fp32 cache stays fp32, and the FlashInfer fp8-KV path (FA2 with bf16 q) agrees with
the dequantising SDPA path, stays within a stated bound of the bf16 store and rolls back exactly."""
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
def test_auto_picks_the_split_on_cuda_for_bf16_and_sdpa_for_fp32():
    from engine.kv.backends import FlashInferBackend
    from engine.kv.cudnn_split import CuDNNSplitBackend
    kw = dict(scale_frames=1, window=2, special_cap=8, device="cuda", backend="auto")
    c = PagedKVCache(1, H, D, P, dtype="bf16", **kw)
    assert isinstance(c._attn, CuDNNSplitBackend) and isinstance(c._attn._fallback, FlashInferBackend)
    c = PagedKVCache(1, H, D, P, dtype="fp32", **kw)
    assert c.backend.name == "sdpa" and c.k_pool.dtype == torch.float32
    with pytest.raises(KVCacheError, match="supports bf16, fp16"):
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


# fp8 store vs the same keys/values stored in bf16, unit-normal q, k, v, fixture-sized frames: the
# CPU dequantising path's worst over 3 seeds x 17 steps x 2 layers was max|d| 0.066, mean|d| 0.0030.
# Bounds: about twice that.
FP8_BOUND = (0.15, 0.01)


@needs_fi
def test_flashinfer_fp8_kv_path_agrees_with_sdpa_and_stays_near_bf16():
    """FlashInfer over the fp8 store == SDPA over the dequantised store (same values), and both
    are within FP8_BOUND of a bf16 store fed the same steps."""
    kw = dict(scale_frames=2, window=4, special_cap=8, device="cuda")
    fi8 = PagedKVCache(L, H, D, P, dtype="fp8", attn_dtype="bf16", backend="flashinfer", **kw)
    sd8 = PagedKVCache(L, H, D, P, dtype="fp8", attn_dtype="bf16", backend="sdpa", **kw)
    fib = PagedKVCache(L, H, D, P, dtype="bf16", backend="flashinfer", **kw)
    assert fi8._attn.kernel == "fa2"
    assert fi8.k_pool.element_size() == 1
    worst_max = worst_mean = 0.0
    for a8, s8, b16 in _stream([fi8, sd8, fib], "kknkkknkkkkknkkk", 2):
        for x, y, z in zip(a8, s8, b16):
            assert x.dtype == torch.bfloat16 and torch.isfinite(x).all()
            # same dequantised values; only bf16 roundings of the folded scales differ
            torch.testing.assert_close(x.float(), y.float(), atol=3e-2, rtol=3e-2)
            d = (x.float() - z.float()).abs()
            worst_max, worst_mean = max(worst_max, d.max().item()), max(worst_mean, d.mean().item())
    print(f"fp8 vs bf16 store: max|d| {worst_max:.4f} mean|d| {worst_mean:.5f}")
    assert worst_max <= FP8_BOUND[0] and worst_mean <= FP8_BOUND[1]
    assert fi8.state() == fib.state()
    assert fi8.stats()["fp8_saturated"] == 0


@needs_fi
def test_flashinfer_fp8_non_keyframes_roll_back_exactly():
    """Non-keyframes over the fp8 store leave tables, committed bytes and scales bit-identical,
    and the next keyframe's output equals (bitwise) that of a twin cache that never saw them."""
    kw = dict(scale_frames=2, window=4, special_cap=8, dtype="fp8", attn_dtype="bf16", device="cuda",
              backend="flashinfer")
    a, b = PagedKVCache(L, H, D, P, **kw), PagedKVCache(L, H, D, P, **kw)
    gen = torch.Generator(device="cuda").manual_seed(3)

    def frames(nf):
        return [torch.randn(L, nf, T, H, D, generator=gen, device="cuda") for _ in range(3)]

    def step(c, kvq, nf, scale=False, key=True):
        k, v, q = kvq
        c.begin_step(nf, scale=scale, keyframe=key)
        outs = []
        for layer in range(L):
            c.write(layer, k[layer], v[layer])
            outs.append(c.attend(layer, q[layer].to(torch.bfloat16)))
        c.end_step()
        return outs

    first = frames(2)
    step(a, first, 2, scale=True)
    step(b, first, 2, scale=True)
    for _ in range(6):                      # fills the window (4) and evicts
        f = frames(1)
        step(a, f, 1)
        step(b, f, 1)
    before = a.state()
    slots = a.committed_slots().to("cuda")
    flat = lambda pool: pool.view(L, -1, H, D)[:, slots].clone()  # noqa: E731
    kb, vb, sc = flat(a.k_pool), flat(a.v_pool), a.pool.scales.clone()
    for _ in range(3):
        out = step(a, frames(1), 1, key=False)
        assert all(torch.isfinite(o).all() for o in out)
    assert a.state() == before
    assert torch.equal(flat(a.k_pool), kb) and torch.equal(flat(a.v_pool), vb)
    assert torch.equal(a.pool.scales, sc)
    f = frames(1)
    for x, y in zip(step(a, f, 1), step(b, f, 1)):
        assert torch.equal(x, y)
    assert a.state() == b.state()


@cuda
def test_auto_picks_the_split_for_an_fp8_store_attended_in_bf16():
    kw = dict(scale_frames=1, window=2, special_cap=8, device="cuda", backend="auto", dtype="fp8")
    c = PagedKVCache(1, H, D, P, attn_dtype="bf16", **kw)
    assert c.backend.name == "cudnn-split" and c._attn.fp8
    assert PagedKVCache(1, H, D, P, attn_dtype="fp32", **kw).backend.name == "sdpa"

"""KV module split, window compression and quantized KV stores (CPU, small sizes):
* the page table is integers only; the camera cache and the special stream share CappedRing;
  StreamCaches steps both caches together;
* every compression method: attention equals a dense reference computed on the kept tokens, a
  non-keyframe rolls back exactly, memory stays bounded, stats show the kept tokens and bytes;
* fp8 / int8 stores: quantize -> dequantize error within the format's bound; attention close to fp32.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.kv import CappedRing, KVCacheError, PagedKVCache, make_compressor
from engine.kv.coordinator import StreamCaches
from engine.kv.pool import FP8_HEADROOM, FP8_MAX

L, H, D, P, S6 = 2, 2, 8, 12, 6
T = S6 + P


def _kv(gen, n):
    return {f: (torch.randn(L, T, H, D, generator=gen), torch.randn(L, T, H, D, generator=gen)) for f in range(n)}


def _dense(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          v.transpose(0, 1)[None])[0].transpose(0, 1)


def _kept(method, k, v, frame, layer, ratio=0.5, seed=3):
    """Independent model of what each method keeps of one window frame's patches k, v [P, H, D]."""
    K = int(round(ratio * P))
    if method == "token_partition":
        score = (k - k.mean(0)).norm(dim=-1).mean(-1)
        idx = torch.sort(torch.topk(score, K).indices).values
        return k[idx], v[idx]
    if method == "random_subset":
        g = torch.Generator().manual_seed(seed * 1_000_003 + frame)
        idx = torch.sort(torch.randperm(P, generator=g)[:K]).values
        return k[idx], v[idx]
    if method == "token_merge":
        groups = [np.nonzero((np.arange(P) * K) // P == i)[0] for i in range(K)]
        return (torch.stack([k[g].mean(0) for g in groups]), torch.stack([v[g].mean(0) for g in groups]))
    return k, v


def test_page_table_is_plain_integers_and_rings_are_shared():
    import engine.kv.page_table as pt
    assert "torch" not in vars(pt)
    from engine.models.camera_head import CameraCache
    cam = CameraCache(1, 1, 1, 4, scale_frames=2, cap=3)
    assert isinstance(cam._ring, CappedRing)
    ring = CappedRing(3, pinned_in_cap=False)
    ring.pin(2)
    assert [ring.commit(1) for _ in range(5)] == [[], [], [], [(5, 2)], [(5, 3)]]
    assert ring.visible == 5 and ring.dropped == 2


def test_stream_caches_step_together_and_undo_a_half_begin():
    cache = PagedKVCache(L, H, D, P, scale_frames=1, window=2, special_cap=4)
    from engine.models.camera_head import CameraCache
    cam = CameraCache(1, 1, 1, 4, scale_frames=1, cap=4)
    both = StreamCaches(cache, cam)
    before = both.state()
    with pytest.raises(ValueError):
        both.begin_step(1, scale=False, keyframe=True)      # camera refuses: no scale phase yet
    assert cache.step is None and both.state()["kv"] == before["kv"]


def _run(cache, kv, frames, scale=False, keyframe=True, ref=None, tol=1e-5):
    cache.begin_step(len(frames), scale=scale, keyframe=keyframe)
    outs = []
    for layer in range(L):
        k = torch.stack([kv[f][0][layer] for f in frames])
        v = torch.stack([kv[f][1][layer] for f in frames])
        cache.write(layer, k, v)
        q = k * 0.7
        out = cache.attend(layer, q)
        if ref is not None:
            rk, rv = ref(layer, frames)
            want = _dense(q.reshape(-1, H, D), rk, rv).reshape(out.shape)
            torch.testing.assert_close(out, want, atol=tol, rtol=tol)
        outs.append(out)
    cache.end_step()
    return outs


@pytest.mark.parametrize("method", ["none", "token_partition", "random_subset", "token_merge"])
def test_compressed_attention_equals_dense_reference_on_kept_tokens(method):
    gen = torch.Generator().manual_seed(1)
    kv = _kv(gen, 20)
    sf, W = 2, 3
    comp = make_compressor(method, keep_ratio=0.5, seed=3)
    cache = PagedKVCache(L, H, D, P, scale_frames=sf, window=W, special_cap=64, compression=comp)
    window, order = [], {}            # committed stream frames; frame -> commit counter

    def ref(layer, new):
        ks, vs = [], []
        for f in list(range(sf)) + window:
            k, v = kv[f][0][layer, S6:], kv[f][1][layer, S6:]
            if f >= sf:
                k, v = _kept(method, k, v, order[f], layer)
            ks.append(k)
            vs.append(v)
        for f in new:
            ks.append(kv[f][0][layer, S6:])
            vs.append(kv[f][1][layer, S6:])
        for f in specials + new:
            ks.append(kv[f][0][layer, :S6])
            vs.append(kv[f][1][layer, :S6])
        return torch.cat(ks), torch.cat(vs)

    _run(cache, kv, list(range(sf)), scale=True)
    committed = sf
    specials = list(range(sf))
    for f in range(sf, 16):
        key = f % 3 != 2
        # visible window: keyframes see W-1 newest + itself; non-keyframes the full window
        vis = window[-(W - 1):] if key else window[-W:]
        saved = list(window)
        window[:] = vis
        _run(cache, kv, [f], keyframe=key, ref=ref)
        window[:] = saved
        if key:
            order[f] = committed
            committed += 1
            specials.append(f)
            window.append(f)
            window[:] = window[-W:]
    st = cache.stats()
    K = int(round(0.5 * P)) if method != "none" else P
    assert st["window_tokens_per_frame"] == K and st["compression"] == method
    assert st["kept_tokens"] == sf * P + W * K + st["special_tokens"]


@pytest.mark.parametrize("method", ["token_partition", "random_subset", "token_merge", "block_sparse"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8", "int8"])
def test_every_method_and_dtype_rolls_back_exactly_with_bounded_memory(method, dtype):
    gen = torch.Generator().manual_seed(2)
    kv = _kv(gen, 40)
    cache = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=7, dtype=dtype,
                         compression=make_compressor(method, keep_ratio=0.25, block_size=4, seed=1))
    _run(cache, kv, [0, 1], scale=True)
    pools = (cache.pool.bytes_allocated, cache.num_pages)
    for f in range(2, 30):
        if f % 4 == 3:                 # a non-keyframe leaves no trace
            st = cache.state()
            slots = cache.committed_slots()
            before = [t.view(-1, H, D)[slots].clone() for t in (cache.k_pool[0].view(-1, H, D),)]
            _run(cache, kv, [f], keyframe=False)
            assert cache.state() == st
            assert torch.equal(cache.k_pool[0].view(-1, H, D)[slots], before[0])
        else:
            _run(cache, kv, [f])
    assert (cache.pool.bytes_allocated, cache.num_pages) == pools            # allocated once
    s = cache.stats()
    assert s["cached_frames"] == 5 and s["special_frames"] == 7
    if method != "block_sparse":
        assert s["window_tokens_per_frame"] == 3 and s["bytes_kept"] < s["bytes_allocated"]
        full = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=7, dtype=dtype)
        assert cache.pool.bytes_allocated < full.pool.bytes_allocated
    m = cache.page_map()
    assert len(m) == cache.num_pages and (m == 2).sum() >= 1


def test_block_sparse_attends_to_the_best_matching_blocks():
    comp = make_compressor("block_sparse", keep_ratio=0.25, block_size=4)
    means = torch.zeros(2, 2, 1, 2)                  # 2 window pages x 2 blocks of a 7-token page
    means[1, 0, 0, 0] = 5.0                          # page 1, block 0 matches the query direction
    q = torch.tensor([[[1.0, 0.0]]]).expand(3, 1, 2)
    chosen = comp.select_blocks(q, means)
    assert chosen.tolist() == [2] and comp.block_tokens(chosen, 7).tolist() == [7, 8, 9, 10]
    assert comp.block_tokens(torch.tensor([3]), 7).tolist() == [11, 12, 13]      # last block is short
    # in the cache: output equals dense attention over scale + the best window blocks (chosen
    # here from means computed independently from the written keys) + own + specials
    B, keep = 5, 0.5
    gen = torch.Generator().manual_seed(4)
    kv = _kv(gen, 12)
    cache = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=64,
                         compression=make_compressor("block_sparse", keep_ratio=keep, block_size=B))
    _run(cache, kv, [0, 1], scale=True)
    for f in range(2, 8):
        _run(cache, kv, [f])
    window = [5, 6, 7]                               # newest first evicted: W - 1 = 2 visible + new
    cache.begin_step(1)
    nb = -(-P // B)
    for layer in range(L):
        k = kv[8][0][layer][None]
        cache.write(layer, k, kv[8][1][layer][None])
        q = k * 0.7
        out = cache.attend(layer, q)
        vis = window[-2:]
        blocks = []                                   # (score, frame, first, last)
        qm = q.reshape(-1, H, D).mean(0)
        for f in vis:
            pk = kv[f][0][layer, S6:]
            for bi in range(nb):
                blk = pk[bi * B:(bi + 1) * B]
                blocks.append(((blk.mean(0) * qm).sum().item(), f, bi * B, min(P, (bi + 1) * B)))
        n_keep = -(-int(keep * 100) * len(blocks) // 100)
        best = sorted(sorted(blocks, reverse=True)[:n_keep], key=lambda t: (vis.index(t[1]), t[2]))
        ks = [kv[f][0][layer, S6:] for f in (0, 1)] + [kv[f][0][layer, S6 + a:S6 + b] for _, f, a, b in best]
        vs = [kv[f][1][layer, S6:] for f in (0, 1)] + [kv[f][1][layer, S6 + a:S6 + b] for _, f, a, b in best]
        ks += [kv[8][0][layer, S6:]] + [kv[f][0][layer, :S6] for f in range(9)]
        vs += [kv[8][1][layer, S6:]] + [kv[f][1][layer, :S6] for f in range(9)]
        want = _dense(q.reshape(-1, H, D), torch.cat(ks), torch.cat(vs)).reshape(out.shape)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        assert cache.step.num_kv_tokens > sum(x.shape[0] for x in ks)          # fewer tokens attended
    cache.end_step()


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_quantize_dequantize_error_within_the_format_bound(dtype):
    gen = torch.Generator().manual_seed(5)
    cache = PagedKVCache(L, H, D, P, scale_frames=1, window=2, special_cap=8, dtype=dtype)
    pool = cache.pool
    x = torch.randn(3, T, H, D, generator=gen) * torch.logspace(-2, 1, D)     # mixed magnitudes
    q, s = pool.quantize(0, 0, x)
    if dtype == "int8":
        deq = q.float() * s[..., None]
        bound = x.abs().amax(-1, keepdim=True) / 127 / 2 + 1e-7         # half a step of the vector's scale
        assert ((deq - x).abs() <= bound).all()
    else:
        sc = pool.scales[0, 0][:, None]
        deq = q.view(torch.float8_e4m3fn).float() * sc
        normal = x.abs() / sc >= 2 ** -6
        rel = ((deq - x).abs() / x.abs())[normal]
        assert rel.max() <= 2 ** -4 + 1e-6                               # e4m3: 3 mantissa bits
        assert ((deq - x).abs()[~normal] <= sc.expand_as(x)[~normal] * 2 ** -10).all()   # subnormal step
        assert torch.allclose(sc[:, 0], x.abs().amax(dim=(0, 1, 3)) * FP8_HEADROOM / FP8_MAX)
    # attention over the quantized store stays close to fp32
    kv = _kv(gen, 6)
    ref = PagedKVCache(L, H, D, P, scale_frames=1, window=2, special_cap=8)
    outs_q = _run(cache, kv, [0], scale=True)
    outs_r = _run(ref, kv, [0], scale=True)
    for f in range(1, 6):
        outs_q = _run(cache, kv, [f])
        outs_r = _run(ref, kv, [f])
    for a, b in zip(outs_q, outs_r):
        assert (a - b).abs().max() < (0.05 if dtype == "fp8" else 0.02)
    assert cache.stats()["dtype"] in ("float8_e4m3fn", "int8")
    if dtype == "fp8":
        sat = cache.stats()["fp8_saturated"]
        assert sat == 0                                       # random data stays within the headroom
        big = torch.full((1, T, H, D), 1e4)
        cache.begin_step(1)
        for layer in range(L):
            cache.write(layer, big, big)
        cache.abort_step()
        assert cache.stats()["fp8_saturated"] == 2 * L * T * H * D
    # one byte per value (+ a 4-byte scale per head vector for int8; head_dim 8 here, 64 in the model)
    assert cache.pool.bytes_allocated <= (0.25 + (1.0 / D if dtype == "int8" else 0.0)) * ref.pool.bytes_allocated + 64


def test_bad_compression_and_dtype_settings_are_clear():
    with pytest.raises(KVCacheError, match="kv_compression"):
        make_compressor("zip")
    with pytest.raises(KVCacheError, match="keep_ratio"):
        make_compressor("random_subset", keep_ratio=0)
    with pytest.raises(KVCacheError, match="CUDA|FlashInfer"):
        PagedKVCache(1, 1, 4, 2, scale_frames=1, window=1, special_cap=2, dtype="int8", backend="flashinfer")


def test_auto_backend_sends_an_fp8_store_attended_in_16_bit_to_the_split(monkeypatch):
    """On CUDA (FlashInfer importable or not), `auto` picks the cuDNN split for an fp8 store
    attended in bf16/fp16 (the run read into 16-bit scratch: fixed shapes, whole-step graphs) and
    SDPA when attention would run in fp32. (Only the choice: the kernels themselves run in
    tests/engine/test_cudnn_fp8_gpu.py.)"""
    from engine.kv import backends, kv_precision, resolve
    from engine.kv.cudnn_split import CuDNNSplitBackend
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (object(), None))
    cuda = torch.device("cuda")
    assert resolve.resolve_backend("auto", cuda, kv_precision("bf16", "fp8")) is CuDNNSplitBackend
    assert resolve.resolve_backend("auto", cuda, kv_precision("fp16", "fp8")) is CuDNNSplitBackend
    assert resolve.resolve_backend("auto", cuda, kv_precision("fp32", "fp8")) is backends.SDPABackend
    # int8 too (per-token scales applied in the scratch); attention in fp32 and the CPU: SDPA
    assert resolve.resolve_backend("auto", cuda, kv_precision("bf16", "int8")) is CuDNNSplitBackend
    assert resolve.resolve_backend("auto", cuda, kv_precision("fp32", "int8")) is backends.SDPABackend
    assert resolve.resolve_backend("auto", torch.device("cpu"), kv_precision("bf16", "fp8")) is backends.SDPABackend


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
@pytest.mark.parametrize("attn", ["bf16", "fp16", "fp32"])
def test_dequantize_equals_the_fp32_formula_bit_for_bit(dtype, attn):
    """pool.dequantize converts then scales in place (no fp32 temporaries); the result must equal
    (fp32(stored) * scale).to(attn dtype) exactly, in every attention dtype."""
    gen = torch.Generator().manual_seed(6)
    cache = PagedKVCache(L, H, D, P, scale_frames=1, window=2, special_cap=8, dtype=dtype, attn_dtype=attn)
    pool = cache.pool
    x = torch.randn(40, H, D, generator=gen) * torch.logspace(-3, 1, D)
    raw, s = pool.quantize(0, 1, x)
    slots = None
    if dtype == "int8":
        slots = torch.arange(40)
        pool.scales[0, 1, :40] = s
        want = raw.to(torch.float32) * s[..., None]
    else:
        want = raw.view(torch.float8_e4m3fn).to(torch.float32) * pool.scales[0, 1][:, None]
    got = pool.dequantize(0, 1, raw, slots)
    assert got.dtype == cache.attn_dtype and torch.equal(got, want.to(cache.attn_dtype))
    assert raw.dtype in (torch.uint8, torch.int8)            # the stored bytes are untouched

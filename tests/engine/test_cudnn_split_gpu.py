"""GPU checks of the cuDNN split backend (`CuDNNSplitBackend`: the steady state's patch-page run
through plain cuDNN with its log-sum-exp, the special tokens through PyTorch flash, merged by
log-sum-exp; FlashInfer for the other steps) against SDPA on the same steps, to bf16 tolerance:
window filling, eviction, keyframe interval 2 rollbacks, the special ring's growth and wrap; no
synchronising PyTorch call inside a step; the fixed part keeps ONE shape per step kind (one cuDNN
graph each), and so does the whole-run call once the ring is full; a LingBot-Map session on it
against an SDPA session.
Skipped without CUDA. CPU checks of the bookkeeping: test_cudnn_split.py."""
import pytest
import torch

from engine.kv import PagedKVCache
from engine.kv.cudnn_split import CuDNNSplitBackend

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

L, H, D, S6 = 2, 16, 64, 6
KW = dict(scale_frames=2, window=4, special_cap=8, dtype=torch.bfloat16, device="cuda")
PATTERN = "kkknkkkknknkkknknkkkkknk"


@needs_cuda
@pytest.mark.parametrize("page,whole", [(130, True), (999, True), (130, False), (1036, True), (1036, False)])
def test_split_equals_sdpa_without_syncs(page, whole):
    cu = PagedKVCache(L, H, D, page, special_tokens=S6, backend="sdpa", **KW)
    cu._attn = be = CuDNNSplitBackend(cu, whole=whole)
    sdpa = PagedKVCache(L, H, D, page, special_tokens=S6, backend="sdpa", **KW)
    gen = torch.Generator(device="cuda").manual_seed(0)
    outs = {id(c): [] for c in (cu, sdpa)}
    splits, strict_next = 0, False
    for i, (nf, scale, key) in enumerate([(2, True, True)] + [(1, False, c == "k") for c in PATTERN]):
        k, v, q = (torch.randn(L, nf, S6 + page, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for c in (cu, sdpa):
            # split steps raise on any synchronising PyTorch call, the plan included once the
            # previous step was split too; not the step that builds a shape's cuDNN graph, nor the
            # fallback's steps (FlashInfer's plan copies its host schedule: its own business)
            try:
                if c is cu and strict_next:
                    torch.cuda.set_sync_debug_mode("error")
                shapes = set(be.a_shapes) | set(be.whole_shapes)
                step = c.begin_step(nf, scale=scale, keyframe=key)
                if c is cu:
                    split = be._split is not None
                    splits += split
                    strict_next = split
                    key_ = (S6 + page, step.num_kv_tokens if split and be._split[4] else
                            be._split[1] if split else None)
                    if split and key_ in shapes:
                        torch.cuda.set_sync_debug_mode("error")
                    else:
                        torch.cuda.set_sync_debug_mode(0)
                for layer in range(L):
                    c.write(layer, k[layer], v[layer])
                    outs[id(c)].append(c.attend(layer, q[layer]).clone())
                c.end_step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert be.error is None, be.error
    # 1,036 patches (a 640x480 input): 1,042 rows = 9 tiles x 16 heads, past one wave of 132
    # SMs: cuDNN takes 1,024 rows, the wave tail the other 18 (chunked_lse)
    tail = not be.fits_one_wave(S6 + page)
    assert (be.wave_tail_steps > 0) == tail and be.wave_declined == 0
    assert cu.stats()["special_dropped"] > 0
    assert splits >= 10 and be.calls["split"] + be.calls["whole"] == L * splits and be.calls["fallback"] > 0
    assert (be.calls["whole"] > 0) == whole
    # keyframe steps: scale + window pages from page 1; non-keyframes: + page 0 -> two shapes
    # (in this pattern the ring is full before a non-keyframe sees a full window)
    kinds = {(S6 + page, (2 + 4) * page), (S6 + page, (2 + 4 + 1) * page)}     # A in tokens
    if whole:
        assert be.a_shapes == {(S6 + page, (2 + 4) * page)}
        # once the special ring is full: one plain cuDNN call over the whole run, one length per kind
        n_kv = (2 + 4) * page + S6 * (KW["special_cap"] + 1)
        assert be.whole_shapes == {(S6 + page, n_kv), (S6 + page, n_kv + page)}
    else:
        assert be.a_shapes == kinds and not be.whole_shapes
    for a, b in zip(outs[id(cu)], outs[id(sdpa)]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@needs_cuda
def test_split_kernels_return_natural_log_sum_exp():
    """Both default kernels' log-sum-exp against a float32 reference, at a long fixed length."""
    from engine.kv.cudnn_kernels import merge_lse, torch_cudnn_lse, torch_flash_lse
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1005, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 9990, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    s = torch.einsum("nhd,shd->hns", q.float(), kv[0].float()) / D ** 0.5
    ref_lse = s.logsumexp(-1)
    ref = torch.einsum("hns,shd->nhd", s.softmax(-1), kv[1].float())
    for fn in (torch_cudnn_lse, torch_flash_lse):
        out, lse = fn(q, kv[0], kv[1])
        assert out.shape == q.shape and lse.shape == (H, 1005) and lse.dtype == torch.float32
        torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    # the merge of two parts == the whole
    oa, la = torch_cudnn_lse(q, kv[0, :8991], kv[1, :8991])
    ob, lb = torch_flash_lse(q, kv[0, 8991:], kv[1, 8991:])
    eager = merge_lse(oa, la, ob, lb)
    torch.testing.assert_close(eager.float(), ref, atol=2e-2, rtol=2e-2)


@needs_cuda
@pytest.mark.parametrize("rows,keys", [(18, 74592), (18, 75628), (200, 9990), (7, 3000)])
def test_chunked_lse_on_cuda_equals_float32_attention(rows, keys):
    """The wave tail's varlen flash call over key chunks, merged: output and log-sum-exp against
    a float32 reference, with the chunk count the H200 would pick."""
    from engine.kv.cudnn_kernels import chunk_bounds, chunked_lse, even_chunks, tail_chunks
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(rows, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, keys, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    s = torch.einsum("nhd,shd->hns", q.float(), kv[0].float()) / D ** 0.5
    ref_lse, ref = s.logsumexp(-1), torch.einsum("hns,shd->nhd", s.softmax(-1), kv[1].float())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chunks = tail_chunks(rows, H, sms, keys)
    for n in sorted({1, chunks}):
        out, lse = chunked_lse(q, kv[0], kv[1], n, chunk_bounds(rows, keys, n, q.device))
        assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (H, rows)
        torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    n = even_chunks(keys, chunks)                       # the cuDNN form: one batched call
    out, lse = chunked_lse(q, kv[0], kv[1], n, kernel="cudnn")
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@needs_cuda
def test_cudnn_session_on_the_split_matches_sdpa_session():
    from tests.engine.backend_sessions import assert_matches_sdpa

    def uses_split(s):
        be = s.kv.attention
        assert isinstance(be, CuDNNSplitBackend)
        assert be.error is None, be.error
        assert be.calls["split"] > 0 and be.calls["fallback"] > 0 and len(be.a_shapes) <= 2
    assert_matches_sdpa("cudnn-split", check=uses_split)


@needs_cuda
def test_auto_makes_the_split_backend():
    from engine.kv.backends import FlashInferBackend, flashinfer_available
    if not flashinfer_available():
        pytest.skip("needs flashinfer")
    cu = PagedKVCache(L, H, D, 130, special_tokens=S6, backend="auto", **KW)
    assert isinstance(cu._attn, CuDNNSplitBackend) and isinstance(cu._attn._fallback, FlashInferBackend)


@needs_cuda
@pytest.mark.parametrize("setting", ["token_partition", "token_merge", "random_subset", "block_sparse", "fp8",
                                     "int8"])
def test_compressed_and_quantized_stores_split_static_without_syncs(setting):
    """Issue 26 item 2: compressed windows (their two token runs), block_sparse (the chosen blocks
    gathered into a fixed-length scratch, blocks of 32 leaving a partial last block of each
    130-token page) and fp8 / int8 stores (read into 16-bit scratch) through the static split
    against SDPA over the same store, to bf16 tolerance; a step whose static key was seen before
    (what a graph replays) makes no synchronising call."""
    from engine.kv import make_compressor
    page = 130
    kw = dict(KW, dtype="bf16")
    if setting in ("fp8", "int8"):
        kw.update(dtype=setting, attn_dtype="bf16")
    comp = (lambda: make_compressor(setting, 0.5, 32, 1)) if setting not in ("fp8", "int8") else (lambda: None)
    cu = PagedKVCache(L, H, D, page, special_tokens=S6, backend="cudnn-split", compression=comp(), **kw)
    sdpa = PagedKVCache(L, H, D, page, special_tokens=S6, backend="sdpa", compression=comp(), **kw)
    be = cu.attention
    assert isinstance(be, CuDNNSplitBackend) and cu.enable_static_steps()
    gen = torch.Generator(device="cuda").manual_seed(0)
    seen, static_steps = set(), 0
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in PATTERN]:
        k, v, q = (torch.randn(L, nf, S6 + page, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        outs = []
        for c in (cu, sdpa):
            c.begin_step(nf, scale=scale, keyframe=key)
            skey = cu.static_key() if c is cu else None
            strict = skey is not None and skey in seen
            if strict:
                torch.cuda.set_sync_debug_mode("error")
            try:
                outs.append([(c.write(i, k[i], v[i]), c.attend(i, q[i]).clone())[1] for i in range(L)])
            finally:
                torch.cuda.set_sync_debug_mode(0)
            if c is cu and skey is not None:
                seen.add(skey)
                static_steps += 1
            c.end_step()
        for a, b in zip(*outs):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)
    assert be.error is None, be.error
    path = "sparse" if setting == "block_sparse" else "split"
    assert static_steps >= 10 and be.calls[path] > 0 and len(seen) <= 4     # kinds: (split|whole|sparse) x keyframe

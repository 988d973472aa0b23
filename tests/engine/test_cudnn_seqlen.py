"""The cuDNN backend's sequence-length form (`CuDNNSeqLenBackend`, cuDNN's padding mask through
the cuDNN frontend) on the CPU, through a stand-in kernel that checks what the frontend graph
would be handed (int32 [1,1,1,1] device lengths, zero-copy views of the pool, an int32 page table
of fixed size) and computes plain SDPA over exactly the keys that description selects: outputs
equal the SDPA backend's while the window fills (paged form), in the steady state (dense form),
across keyframe rollbacks and the special ring's wrap; the number of distinct graph layouts; the
exact fallbacks (token slots, a failing kernel, no frontend) and how `create` picks the form.
GPU checks of the real frontend kernel: test_cudnn_seqlen_gpu.py."""
import pytest
import torch
import torch.nn.functional as F

from engine.kv import PagedKVCache, make_compressor
from engine.kv import cudnn as kcudnn
from engine.kv.cudnn import CuDNNBackend, CuDNNSeqLenBackend
from tests.engine.kv_pair import KW, PATTERN, D, H, L, P, S6, cache_pair, drive_paths, tiny_sessions_against_sdpa

P2 = 4                                    # a power-of-two page: cuDNN's paged form can run


class SeqLenStandIn:
    """What the frontend call receives, checked; the result is SDPA over the keys it selects."""

    def __init__(self, cache):
        self.pool = cache.pool
        self.layouts, self.k_ptrs = set(), set()

    def __call__(self, q, k, v, seq_q, seq_kv, table=None):
        pool = self.pool
        P, H, D = pool.page_size, pool.num_heads, pool.head_dim
        for t in (seq_q, seq_kv):
            assert t.dtype == torch.int32 and tuple(t.shape) == (1, 1, 1, 1) and t.device == q.device
        n, s = int(seq_q.view(-1)[0]), int(seq_kv.view(-1)[0])
        assert q.is_contiguous() and n == q.shape[0] and k.shape == v.shape and k.stride() == v.stride()
        if table is None:                   # dense: a [tokens, H, D] view of one layer's pool
            assert k.shape[1:] == (H, D) and k.stride() == (H * D, D, 1) and s <= k.shape[0]
            keys, vals = k[:s], v[:s]
            self.layouts.add(("dense", tuple(q.shape), tuple(k.shape)))
        else:                               # paged: the layer's whole pool + the page table
            assert k.shape == (pool.num_pages, P, H, D) and k.is_contiguous()
            assert table.dtype == torch.int32 and tuple(table.shape) == (1, 1, pool.num_pages, 1)
            m = -(-s // P)
            pages = table.view(-1)[:m].long()
            assert bool((pages >= 0).all()) and bool((pages < pool.num_pages).all())
            keys, vals = k[pages].reshape(-1, H, D)[:s], v[pages].reshape(-1, H, D)[:s]
            self.layouts.add(("paged", tuple(q.shape), tuple(k.shape)))
        base = pool.k.data_ptr()
        assert base <= k.data_ptr() < base + pool.k.numel() * pool.k.element_size()   # in place
        self.k_ptrs.add(k.data_ptr())
        qh, kh, vh = (x.float().transpose(0, 1)[None] for x in (q, keys, vals))
        return F.scaled_dot_product_attention(qh, kh, vh)[0].transpose(0, 1).to(q.dtype)


def _caches(garbage=True, kernel=None, dtype=torch.float32, min_fill=0.0, page=P, **kw):
    """A cache on the sequence-length form (stand-in kernel) and one on SDPA, same settings.
    `garbage`: the pool holds NaN before the backend is made (uninitialised memory may)."""
    cu, sd = cache_pair(page=page, garbage=garbage, dtype=dtype, **kw)
    stand_in = SeqLenStandIn(cu)
    cu._attn = CuDNNSeqLenBackend(cu, kernel=kernel or stand_in, min_fill=min_fill)
    return cu, sd, stand_in


@pytest.mark.parametrize("page", [P, P2])
def test_seqlen_form_equals_sdpa_through_fill_rollback_and_ring(page):
    cu, sd, stand_in = _caches(page=page)
    be = cu._attn
    assert torch.count_nonzero(cu.pool.k) == 0 and torch.count_nonzero(cu.pool.v) == 0   # NaN zeroed
    assert be.paged == (page == P2) and (be.paged_note is None) == be.paged
    runs = set()
    for a, b, step, path in drive_paths(cu, sd, PATTERN):
        for x, y in zip(a, b):
            assert torch.isfinite(x).all()
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        # a non-contiguous step without the paged form (page size not a power of two) is exact
        assert path == ("fixed" if step.contiguous is not None or be.paged else "exact")
        runs.add(step.contiguous is not None)
    assert runs == {True, False}                 # both kinds of visible set
    assert cu.state() == sd.state() and cu.stats()["special_dropped"] > 0
    steps = len(PATTERN) + 1
    assert be.calls["fixed"] + be.calls["exact"] == L * steps and be.error is None
    assert be.calls["fixed"] == L * (be.forms["dense"] + be.forms["paged"])
    q_lengths = {2 * (S6 + page), S6 + page}     # the scale step, streamed steps
    paged = {lay for lay in stand_in.layouts if lay[0] == "paged"}
    dense = stand_in.layouts - paged
    assert {lay[1][0] for lay in stand_in.layouts} <= q_lengths
    assert len(paged) <= len(q_lengths)          # the paged form: one graph per q length
    # dense: contiguous steps from their first page (1 for keyframes, 0 for non-keyframes);
    # the window-filling steps (special pages apart from the patch pages) paged or exact
    assert be.forms["dense"] > 0 and (be.forms["paged"] > 0) == be.paged
    assert {lay[2][0] for lay in dense} <= {(cu.num_pages - f) * page for f in (0, 1)}
    assert len(dense) <= 2 * len(q_lengths)


def test_plan_writes_lengths_and_page_table_on_the_device():
    cu, _, _ = _caches(garbage=False, page=P2)
    be = cu._attn
    cu.begin_step(2, scale=True)
    for i in range(L):
        cu.write(i, *(torch.randn(2, S6 + P2, H, D) for _ in range(2)))
    cu.end_step()
    step = cu.begin_step(1, keyframe=False)      # page 0 (the step page) + scale pages + specials
    assert int(be._seq_kv) == step.num_kv_tokens and int(be._seq_q) == step.q_tokens == S6 + P2
    assert be._table.view(-1)[:len(step.pages)].tolist() == list(step.pages)
    assert be._step_view == ("paged", None)
    cu.abort_step()
    for c in "kkk":                              # fill the window: one contiguous run
        cu.begin_step(1, keyframe=c == "k")
        cu.end_step()
    step = cu.begin_step(1)
    assert step.contiguous is not None and be._step_view == ("dense", step.contiguous[0])
    assert int(be._seq_kv) == step.num_kv_tokens
    cu.abort_step()


def test_low_fill_takes_the_exact_path_then_the_seqlen_one():
    cu, sd, _ = _caches(min_fill=0.5, page=P2)
    paths = []
    for a, b, step, path in drive_paths(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        assert path == ("fixed" if step.num_kv_tokens >= 0.5 * cu._attn.capacity else "exact")
        paths.append(path)
    assert paths[0] == "exact" and paths[-1] == "fixed"


def test_bf16_store():
    cu, sd, _ = _caches(dtype=torch.bfloat16, page=P2)
    for a, b, *_ in drive_paths(cu, sd, "kkknkk", dtype=torch.bfloat16):
        for x, y in zip(a, b):
            torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=2e-2)
    assert cu._attn.calls["exact"] == 0


@pytest.mark.parametrize("method", ["random_subset", "block_sparse"])
def test_token_slot_steps_are_exact(method):
    comp = dict(keep_ratio=0.4, seed=5) if method == "random_subset" else dict(keep_ratio=0.5, block_size=2)
    cu, sd, stand_in = _caches(compression=make_compressor(method, **comp))
    sd.compression = make_compressor(method, **comp)
    cu.compression = make_compressor(method, **comp)
    for a, b, step, path in drive_paths(cu, sd, "kkkkknkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert cu._attn.calls["exact"] > 0 and cu._attn.error is None


def test_a_failing_kernel_falls_back_to_exact_for_good():
    def broken(*a):
        raise RuntimeError("cudnnGraphNotSupportedError: no engine")
    cu, sd, _ = _caches(kernel=broken, page=P2)
    for a, b, *_ in drive_paths(cu, sd, "kkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    be = cu._attn
    assert "no engine" in be.error and be.path == "exact" and be.calls["fixed"] == 0


def test_without_the_frontend_the_real_kernel_records_why_and_stays_exact(monkeypatch):
    monkeypatch.setattr(kcudnn, "_import_cudnn_frontend", lambda: (None, "ModuleNotFoundError: No module named 'cudnn'"))
    cu, sd, _ = _caches(dtype=torch.bfloat16)
    cu._attn = CuDNNSeqLenBackend(cu)
    assert "cuDNN frontend is not available" in cu._attn.error
    for a, b, *_ in drive_paths(cu, sd, "kk", dtype=torch.bfloat16):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y)
    assert cu._attn.path == "exact" and cu._attn.calls["fixed"] == 0


def test_create_picks_the_form_and_says_why_not():
    bf = dict(KW, dtype=torch.bfloat16)
    cache = PagedKVCache(L, H, D, P, special_tokens=S6, backend="sdpa", **bf)
    be = CuDNNBackend.create(cache)                     # CPU: the bias form, and why
    assert type(be) is CuDNNBackend and be.mode == "bias" and "CUDA" in be.frontend_error
    fp32 = PagedKVCache(L, H, D, P, special_tokens=S6, backend="sdpa", **KW)
    assert "bf16/fp16" in CuDNNBackend.create(fp32).frontend_error
    assert CuDNNSeqLenBackend(cache, kernel=SeqLenStandIn(cache)).min_fill == 0.0
    s = CuDNNSeqLenBackend(cache, kernel=SeqLenStandIn(cache))
    assert s.name == "cudnn" and s.mode == "seqlen"


def test_tiny_session_on_the_seqlen_form_equals_sdpa(monkeypatch):
    """A whole LingBot-Map session (tiny model, CPU, fp32) on the sequence-length form (stand-in
    kernel) gives the SDPA session's results: keyframe interval 2, eviction, ring wrap."""
    be = tiny_sessions_against_sdpa(monkeypatch,
                                    lambda cache: CuDNNSeqLenBackend(cache, kernel=SeqLenStandIn(cache)))
    # 20-token pages (no paged form): the window-filling steps exact, the steady state dense
    assert be.error is None and be.forms["dense"] > 0 and be.forms["paged"] == 0
    assert be.calls["fixed"] > 0 and be.calls["exact"] > 0 and "power of two" in be.paged_note

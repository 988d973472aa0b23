"""Paged KV cache: attention equals dense attention over the independently derived visible set,
upstream window semantics, exact non-keyframe rollback, bounded pages, eviction order, the special
cap policy and dtype preservation. Small sizes, CPU, deterministic."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.api import EngineError
from engine.kv import KVCacheError, PagedKVCache, PAGE_FREE, PAGE_PENDING, PAGE_SCALE, PAGE_SPECIAL, PAGE_WINDOW
from engine.kv.backends import SDPABackend

L, H, D, P, S6 = 2, 2, 8, 4, 6          # layers, heads, head dim, patch tokens (= page size), specials
T = S6 + P


class Reference:
    """Independent model of the visible set (upstream rules, fixtures README section 4, plus the
    documented special-cap ring): keeps every frame's k/v and decides visibility from frame ids."""

    def __init__(self, scale_frames, window, special_cap):
        self.S, self.W, self.C = scale_frames, window, special_cap
        self.kv = {}                # frame -> (k [L,T,H,D], v [L,T,H,D])
        self.scale, self.stream = [], []   # committed frame ids
        self.special = []           # committed frames whose specials are cached, oldest first

    def visible(self, new, scale, keyframe=True):
        """(frames whose patches are visible, frames whose specials are visible). A non-keyframe
        evicts nothing: it sees the full window plus itself (upstream's FlashInfer path)."""
        if scale:
            return self.scale + new, self.special + new
        keep = self.W - len(new) if keyframe else self.W
        recent = self.stream[-keep:] if keep > 0 else []
        return self.scale + recent + new, self.special + new

    def commit(self, new, scale):
        (self.scale if scale else self.stream).extend(new)
        for f in new:
            if len(self.special) >= self.C:          # ring: drop the oldest non-scale frame
                for j, g in enumerate(self.special):
                    if g not in self.scale:
                        del self.special[j]
                        break
            self.special.append(f)

    def attend(self, layer, q, new, scale, keyframe=True):
        pf, sf = self.visible(new, scale, keyframe)
        k = torch.cat([self.kv[f][0][layer, S6:] for f in pf] + [self.kv[f][0][layer, :S6] for f in sf])
        v = torch.cat([self.kv[f][1][layer, S6:] for f in pf] + [self.kv[f][1][layer, :S6] for f in sf])
        qh = q.reshape(-1, H, D).transpose(0, 1)
        out = F.scaled_dot_product_attention(qh, k.transpose(0, 1), v.transpose(0, 1))
        return out.transpose(0, 1).reshape(q.shape)


def run_step(cache, kv_of, frames, scale=False, keyframe=True, q=None):
    """One step through every layer; returns the per-layer outputs."""
    nf = len(frames)
    cache.begin_step(nf, scale=scale, keyframe=keyframe)
    outs = []
    for layer in range(cache.num_layers):
        k = torch.stack([kv_of[f][0][layer] for f in frames])
        v = torch.stack([kv_of[f][1][layer] for f in frames])
        cache.write(layer, k, v)
        outs.append(cache.attend(layer, q[layer] if q is not None else k * 0.5))
    cache.end_step()
    return outs


def make_kv(gen, nframes, dtype=torch.float32):
    return {f: (torch.randn(L, T, H, D, generator=gen, dtype=dtype),
                torch.randn(L, T, H, D, generator=gen, dtype=dtype)) for f in range(nframes)}


@pytest.mark.parametrize("scale_frames,window,cap,pattern", [
    (2, 3, 64, "kkkkkkkkkkkkkk"),          # plain keyframe stream, window eviction
    (2, 4, 64, "kknknnkkknkkkn"),          # non-keyframes in between (keyframe interval)
    (3, 3, 6, "kkkkkkkkkkkkkk"),           # special cap reached: ring of special slots
    (2, 3, 5, "kknkkknkknkkkk"),           # cap + non-keyframes
])
def test_paged_attention_equals_dense_reference(scale_frames, window, cap, pattern):
    gen = torch.Generator().manual_seed(0)
    n = scale_frames + len(pattern)
    kv = make_kv(gen, n)
    cache = PagedKVCache(L, H, D, P, scale_frames=scale_frames, window=window, special_cap=cap)
    ref = Reference(scale_frames, window, cap)
    ref.kv = kv
    steps = [(list(range(scale_frames)), True, True)]
    steps += [([scale_frames + i], False, c == "k") for i, c in enumerate(pattern)]
    for frames, scale, key in steps:
        q = torch.randn(L, len(frames), T, H, D, generator=gen)
        got = run_step(cache, kv, frames, scale=scale, keyframe=key, q=q)
        for layer in range(L):
            want = ref.attend(layer, q[layer], frames, scale, key)
            torch.testing.assert_close(got[layer], want, atol=2e-6, rtol=1e-5)
        if key:
            ref.commit(frames, scale)


def _visible_counts(cache, frames, scale, keyframe, nframes):
    """Counts of visible patch / special tokens per frame, read through attention itself: each
    frame's values are one-hot on its id (patches in dims [0, n), specials in [n, 2n)) and q = 0,
    so the output is the mean of the visible values."""
    cache.begin_step(len(frames), scale=scale, keyframe=keyframe)
    for layer in range(cache.num_layers):
        v = torch.zeros(len(frames), T, cache.num_heads, 2 * nframes + 1)
        for j, f in enumerate(frames):
            v[j, S6:, :, f] = 1.0
            v[j, :S6, :, nframes + f] = 1.0
        cache.write(layer, torch.randn(v.shape), v)
        out = cache.attend(layer, torch.zeros_like(v))
    ntok = cache.stats()["visible_tokens"]
    cache.end_step()
    counts = (out[0, 0, 0] * ntok).round().long().tolist()
    return counts[:nframes], counts[nframes:2 * nframes]


def test_window_semantics_match_upstream_fixture_configuration():
    # fixtures README section 4: scale 2, window 4, 12 frames, every frame a keyframe. Frame i >= 6
    # sees all tokens of frames 0, 1 and i-3..i, and the special tokens of every earlier frame.
    n = 12
    cache = PagedKVCache(1, 1, 2 * n + 1, P, scale_frames=2, window=4, special_cap=1024)
    patches, specials = _visible_counts(cache, [0, 1], True, True, n)
    assert patches == [P, P] + [0] * 10 and specials == [S6, S6] + [0] * 10   # bidirectional pair
    for i in range(2, n):
        patches, specials = _visible_counts(cache, [i], False, True, n)
        want = {0, 1} | set(range(max(2, i - 3), i + 1))
        assert patches == [P if f in want else 0 for f in range(n)], i
        assert specials == [S6 if f <= i else 0 for f in range(n)], i
    # after frame 11: 6 full frames (0, 1, 8..11) and the specials of all 12
    st = cache.stats()
    assert st["cached_frames"] == 6 and st["special_frames"] == 12


def test_non_keyframe_sees_the_full_window_and_leaves_no_trace():
    n = 12
    cache = PagedKVCache(1, 1, 2 * n + 1, P, scale_frames=2, window=3, special_cap=1024)
    _visible_counts(cache, [0, 1], True, True, n)
    for i in range(2, 6):
        _visible_counts(cache, [i], False, True, n)
    before = cache.state()
    a = _visible_counts(cache, [6], False, False, n)        # non-keyframe, window full
    assert cache.state() == before
    b = _visible_counts(cache, [6], False, True, n)         # the same frame as a keyframe
    assert a[0] == [P, P, 0, P, P, P, P, 0, 0, 0, 0, 0]     # no eviction: window 3..5 + itself
    assert b[0] == [P, P, 0, 0, P, P, P, 0, 0, 0, 0, 0]     # keyframe: oldest (3) evicted first
    assert a[1] == b[1]                                     # the same special tokens


def _pool_bytes(cache):
    slots = cache.committed_slots()
    k = cache.k_pool.view(cache.num_layers, -1, H, D)[:, slots].clone()
    v = cache.v_pool.view(cache.num_layers, -1, H, D)[:, slots].clone()
    return slots, k, v


@pytest.mark.parametrize("warm_frames,cap", [(1, 64), (5, 64), (12, 6), (13, 7)])
def test_non_keyframe_rollback_is_exact(warm_frames, cap):
    gen = torch.Generator().manual_seed(1)
    kv = make_kv(gen, 2 + warm_frames + 2)
    a = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=cap)
    b = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=cap)
    for cache in (a, b):
        run_step(cache, kv, [0, 1], scale=True)
        for f in range(2, 2 + warm_frames):
            run_step(cache, kv, [f])
    state = a.state()
    slots, k0, v0 = _pool_bytes(a)
    page_map = a.page_map().copy()
    stats = a.stats()
    nk = 2 + warm_frames
    run_step(a, kv, [nk], keyframe=False)                 # writes, attends, rolls back
    assert a.state() == state
    assert np.array_equal(a.page_map(), page_map)
    assert a.stats()["pages_free"] == stats["pages_free"]
    slots1, k1, v1 = _pool_bytes(a)
    assert torch.equal(slots, slots1) and torch.equal(k0, k1) and torch.equal(v0, v1)
    # the next keyframe behaves bit for bit as if the non-keyframe never happened
    q = torch.randn(L, 1, T, H, D, generator=gen)
    out_a = run_step(a, kv, [nk + 1], q=q)
    out_b = run_step(b, kv, [nk + 1], q=q)
    for x, y in zip(out_a, out_b):
        assert torch.equal(x, y)
    assert a.state() == b.state()


def test_pages_stop_growing_and_memory_is_allocated_once():
    cache = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=8)
    gen = torch.Generator().manual_seed(2)
    kv = make_kv(gen, 40)
    ptr = (cache.k_pool.data_ptr(), cache.v_pool.data_ptr())
    nbytes = cache.stats()["bytes_allocated"]
    run_step(cache, kv, [0, 1], scale=True)
    used = []
    for f in range(2, 40):
        run_step(cache, kv, [f], keyframe=(f % 3 != 0))
        st = cache.stats()
        used.append(st["pages_total"] - st["pages_free"])
        assert st["pages_pending"] == 0
    # window full after 3 streamed frames; special cap (8 frames) full after 6 streamed frames
    assert len(set(used[10:])) == 1
    assert max(used) == used[-1]
    st = cache.stats()
    assert st["cached_frames"] == 5 and st["special_frames"] == 8
    assert (cache.k_pool.data_ptr(), cache.v_pool.data_ptr()) == ptr
    assert st["bytes_allocated"] == nbytes


def test_eviction_is_oldest_first():
    cache = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=64)
    frame_on = {}                                   # page -> frame it holds now
    cache.begin_step(2, scale=True)
    frame_on.update(zip(cache.step.new_pages, [0, 1]))
    scale_pages = list(cache.step.new_pages)
    cache.end_step()
    evicted_frames = []
    for f in range(2, 12):
        before = list(cache.window_pages)
        step = cache.begin_step(1)
        assert step.evicted == before[:len(step.evicted)]         # oldest pages go first
        evicted_frames += [frame_on[p] for p in step.evicted]
        frame_on[step.new_pages[0]] = f
        cache.end_step()
        assert [frame_on[p] for p in cache.window_pages] == list(range(max(2, f - 2), f + 1))
    assert evicted_frames == list(range(2, 9))
    assert cache.stats()["evictions"] == 7
    assert list(cache.scale_pages) == scale_pages                 # scale frames never evicted


def test_special_cap_keeps_scale_specials_and_newest_frames():
    n = 20
    cache = PagedKVCache(1, 1, 2 * n + 1, P, scale_frames=2, window=3, special_cap=7)
    _visible_counts(cache, [0, 1], True, True, n)
    for i in range(2, n - 1):
        _visible_counts(cache, [i], False, True, n)
    # committed specials: the 2 scale frames + the newest 5 streamed frames (cap 7), plus self
    _, specials = _visible_counts(cache, [n - 1], False, False, n)
    want = {0, 1} | set(range(n - 6, n - 1)) | {n - 1}
    assert specials == [S6 if f in want else 0 for f in range(n)]
    st = cache.stats()
    assert st["special_frames"] == 7 and st["special_dropped"] == n - 1 - 7


def test_steady_state_is_zero_copy_and_equals_gather():
    gen = torch.Generator().manual_seed(4)
    kv = make_kv(gen, 30)
    cache = PagedKVCache(L, H, D, P, scale_frames=2, window=3, special_cap=6)
    run_step(cache, kv, [0, 1], scale=True)
    for f in range(2, 29):
        run_step(cache, kv, [f])
    step = cache.begin_step(1)
    assert step.contiguous is not None and step.contiguous[1] == len(step.pages)
    gather = SDPABackend(cache, zero_copy=False)
    q = torch.randn(T, H, D, generator=gen)
    for layer in range(L):
        cache.write(layer, kv[29][0][layer][None], kv[29][1][layer][None])
        zc = cache.attend(layer, q[None])[0]
        ga = gather.attend(step, q, layer)
        torch.testing.assert_close(zc, ga, atol=1e-6, rtol=1e-5)
        kz, _ = cache._attn.visible_kv(step, layer)
        assert kz.data_ptr() == cache.k_pool[layer, step.contiguous[0]].data_ptr()   # a view
    cache.end_step()
    assert cache.stats()["zero_copy"] is True
    # a non-keyframe over the full window takes page 0, just before the keyframes' run, so its
    # visible set (full window + itself) stays one zero-copy run too
    step = cache.begin_step(1, keyframe=False)
    assert step.contiguous is not None and step.masked == 0 and step.new_pages == [0]
    assert set(cache.window_pages) <= set(step.pages)
    cache.abort_step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pool_dtype_is_the_dtype_asked_for(dtype):
    cache = PagedKVCache(L, H, D, P, scale_frames=1, window=2, special_cap=8, dtype=dtype)
    assert cache.k_pool.dtype == dtype and cache.v_pool.dtype == dtype
    gen = torch.Generator().manual_seed(5)
    k = torch.randn(1, T, H, D, generator=gen, dtype=torch.float32)
    cache.begin_step(1, scale=True)
    cache.write(0, k, k)
    stored = cache.k_pool[0, cache.step.new_pages[0]]
    assert torch.equal(stored, k[0, S6:].to(dtype))                 # exact in fp32: no downcast
    out = cache.attend(0, k.to(dtype))
    assert out.dtype == dtype
    cache.end_step()
    assert cache.stats()["dtype"] == str(dtype).replace("torch.", "")


def test_string_dtypes_and_backend_resolution_on_cpu():
    c = PagedKVCache(1, 1, 4, 2, scale_frames=1, window=1, special_cap=2, dtype="bf16", backend="auto")
    assert c.dtype == torch.bfloat16 and c.backend.name == "sdpa"
    with pytest.raises(KVCacheError, match="CUDA"):
        PagedKVCache(1, 1, 4, 2, scale_frames=1, window=1, special_cap=2, backend="flashinfer")
    with pytest.raises(KVCacheError, match="unknown attention backend"):
        PagedKVCache(1, 1, 4, 2, scale_frames=1, window=1, special_cap=2, backend="xformers")
    with pytest.raises(KVCacheError, match="dtype"):
        PagedKVCache(1, 1, 4, 2, scale_frames=1, window=1, special_cap=2, dtype="int4")


def test_page_map_and_stats():
    cache = PagedKVCache(L, H, D, P, scale_frames=2, window=2, special_cap=8)
    gen = torch.Generator().manual_seed(6)
    kv = make_kv(gen, 6)
    assert (cache.page_map() == PAGE_FREE).all()
    run_step(cache, kv, [0, 1], scale=True)
    run_step(cache, kv, [2])
    cache.begin_step(1)
    m = cache.page_map()
    assert m.dtype == np.int8 and len(m) == cache.num_pages
    assert (m == PAGE_SCALE).sum() == 2 and (m == PAGE_WINDOW).sum() == 1
    assert (m == PAGE_PENDING).sum() >= 1 and (m == PAGE_SPECIAL).sum() >= 1
    cache.abort_step()
    st = cache.stats()
    for key in ("pages_total", "pages_free", "pages_scale", "pages_window", "pages_special",
                "cached_frames", "special_frames", "bytes_allocated", "page_size"):
        assert key in st
    assert st["pages_total"] == st["pages_free"] + st["pages_scale"] + st["pages_window"] + st["pages_special"]
    cache.reset()
    assert cache.stats()["pages_free"] == cache.num_pages and cache.frames_committed == 0


def test_bad_input_gives_clear_errors():
    with pytest.raises(EngineError, match="special_cap"):
        PagedKVCache(1, 1, 4, 2, scale_frames=4, window=8, special_cap=10)
    with pytest.raises(KVCacheError, match="window"):
        PagedKVCache(1, 1, 4, 2, window=0)
    cache = PagedKVCache(1, 1, 4, 2, scale_frames=1, window=2, special_cap=4)
    with pytest.raises(KVCacheError, match="begin_step"):
        cache.write(0, torch.zeros(1, 8, 1, 4), torch.zeros(1, 8, 1, 4))
    cache.begin_step(1, scale=True)
    with pytest.raises(KVCacheError, match="shape"):
        cache.write(0, torch.zeros(1, 7, 1, 4), torch.zeros(1, 7, 1, 4))
    with pytest.raises(KVCacheError, match="not written"):
        cache.attend(0, torch.zeros(1, 8, 1, 4))
    with pytest.raises(KVCacheError, match="twice"):
        cache.begin_step(1)
    cache.end_step()
    with pytest.raises(KVCacheError, match="scale_frames"):
        cache.begin_step(1, scale=True)
    with pytest.raises(KVCacheError, match="max_step_frames"):
        cache.begin_step(2)

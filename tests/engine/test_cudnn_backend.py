"""The cuDNN backend's host-side logic on the CPU, through a stand-in kernel that checks what
PyTorch's cuDNN SDPA would be handed (one fixed [capacity] key/value shape and stride for every
layer and step, views of the pool itself, a finite bias in the attention dtype) and computes
plain SDPA with that bias: outputs equal the SDPA backend's while the window fills, in the steady
state, across keyframe rollbacks and the special ring's wrap, for compressed (token-slot) steps;
the exact fallbacks (low fill, a failing kernel, no CUDA). GPU checks of the real kernel:
test_cudnn_backend_gpu.py."""
import pytest
import torch
import torch.nn.functional as F

from engine.kv import KVCacheError, PagedKVCache, available_backends, make_compressor, resolve_backend
from engine.kv.backends import SDPABackend
from engine.kv.cudnn import CUDNN_MASKED, CuDNNBackend
from tests.engine.kv_pair import KW, PATTERN, D, H, L, P, S6, cache_pair, drive_paths, tiny_sessions_against_sdpa



class StandIn:
    """What the cuDNN call receives, checked; the result is SDPA with the same additive bias."""

    def __init__(self, cache):
        self.pool, self.capacity = cache.pool, cache.num_pages * cache.page_size
        self.kv_layouts, self.bias_layouts, self.q_shapes, self.kv_ptrs = set(), set(), set(), set()

    def __call__(self, q, k, v, bias):
        assert k.shape == v.shape == (1, self.pool.num_heads, self.capacity, self.pool.head_dim)
        assert bias.dtype == q.dtype and bias.shape[-1] == self.capacity and bias.dim() == 4
        assert torch.isfinite(bias).all()                   # see CUDNN_MASKED
        self.kv_layouts.add((tuple(k.shape), k.stride(), v.stride()))
        self.bias_layouts.add((tuple(bias.shape), bias.stride()))
        self.q_shapes.add(tuple(q.shape))
        self.kv_ptrs.add((k.data_ptr(), v.data_ptr()))
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float()).to(q.dtype)


def _caches(min_fill=0.0, garbage=True, kernel=None, dtype=torch.float32, **kw):
    """A cache on the cuDNN backend (stand-in kernel) and one on SDPA, same settings. `garbage`:
    the pool holds NaN before the backend is made (uninitialised memory may)."""
    cu, sd = cache_pair(garbage=garbage, dtype=dtype, **kw)
    stand_in = StandIn(cu)
    cu._attn = CuDNNBackend(cu, kernel=kernel or stand_in, min_fill=min_fill)
    return cu, sd, stand_in


def test_fixed_capacity_equals_sdpa_through_fill_rollback_and_ring():
    cu, sd, stand_in = _caches()
    be = cu._attn
    assert torch.count_nonzero(cu.pool.k) == 0              # NaN garbage zeroed at creation
    runs = set()
    for a, b, step, path in drive_paths(cu, sd, PATTERN):
        for x, y in zip(a, b):
            assert torch.isfinite(x).all()
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        assert path == "fixed"
        runs.add(step.contiguous is not None)
    assert runs == {True, False}                            # both kinds of visible set, in place
    assert cu.state() == sd.state() and cu.stats()["special_dropped"] > 0
    assert be.calls == {"fixed": L * (len(PATTERN) + 1), "exact": 0} and be.error is None
    # one cuDNN graph: the same k/v shape and strides and the same bias layout every call; k/v
    # are the pool's own layers (zero copy); q has two lengths (the scale step, streamed steps)
    assert len(stand_in.kv_layouts) == 1 and len(stand_in.bias_layouts) == 1
    assert stand_in.bias_layouts == {((1, 1, 1, be.capacity), (be.capacity,) * 3 + (1,))}
    assert len(stand_in.q_shapes) == 2
    assert stand_in.kv_ptrs == {(cu.pool.k[i].data_ptr(), cu.pool.v[i].data_ptr()) for i in range(L)}


def test_bias_hides_exactly_the_invisible_keys():
    cu, _, _ = _caches(garbage=False)
    be = cu._attn
    cu.begin_step(2, scale=True)
    for i in range(L):
        cu.write(i, *(torch.randn(2, S6 + P, H, D) for _ in range(2)))
    cu.end_step()
    step = cu.begin_step(1, keyframe=False)                 # a non-keyframe: page 0 is its own
    row = be._bias.view(-1)
    visible = torch.zeros(be.capacity, dtype=torch.bool)
    for j, p in enumerate(step.pages):
        n = step.last_page_len if j == len(step.pages) - 1 else P
        visible[p * P:p * P + n] = True
    assert int(visible.sum()) == step.num_kv_tokens
    assert bool((row[visible] == 0).all()) and bool((row[~visible] == CUDNN_MASKED).all())
    cu.abort_step()


def test_low_fill_takes_the_exact_path_then_the_fixed_one():
    cu, sd, _ = _caches(min_fill=0.5)
    paths = []
    for a, b, step, path in drive_paths(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        want = "fixed" if step.num_kv_tokens >= 0.5 * cu._attn.capacity else "exact"
        paths.append(path)
        assert path == want
    assert paths[0] == "exact" and paths[-1] == "fixed"


def test_bias_row_in_bf16():
    cu, sd, stand_in = _caches(dtype=torch.bfloat16)
    for a, b, *_ in drive_paths(cu, sd, "kkknkk", dtype=torch.bfloat16):
        for x, y in zip(a, b):
            torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=2e-2)
    # one [1, 1, 1, capacity] row for every q length (expanded over the queries, never copied)
    assert {s for s, _ in stand_in.bias_layouts} == {(1, 1, 1, cu._attn.capacity)}


@pytest.mark.parametrize("method", ["random_subset", "block_sparse"])
def test_token_slot_steps_are_exact(method):
    comp = dict(keep_ratio=0.4, seed=5) if method == "random_subset" else dict(keep_ratio=0.5, block_size=2)
    cu, sd, stand_in = _caches(compression=make_compressor(method, **comp))
    sd.compression = make_compressor(method, **comp)      # same (seeded) choice of kept tokens
    cu.compression = make_compressor(method, **comp)
    for a, b, step, path in drive_paths(cu, sd, "kkkkknkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        assert path == "fixed"
    assert len(stand_in.kv_layouts) == 1


def test_a_failing_kernel_falls_back_to_exact_for_good():
    def broken(*a):
        raise RuntimeError("No available kernel. Aborting execution.")
    cu, sd, _ = _caches(kernel=broken)
    for a, b, *_ in drive_paths(cu, sd, "kkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    be = cu._attn
    assert "No available kernel" in be.error and be.path == "exact" and be.calls["fixed"] == 0


def test_real_kernel_without_cuda_falls_back_exactly():
    """PyTorch's cuDNN kernel asked for alone on the CPU raises (no silent other kernel); the
    backend records it and attends exactly."""
    cu, sd, _ = _caches(dtype=torch.bfloat16)
    cu._attn = CuDNNBackend(cu, min_fill=0.0)
    for a, b, *_ in drive_paths(cu, sd, "kk", dtype=torch.bfloat16):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y)
    assert cu._attn.error and cu._attn.path == "exact"


def test_fp32_store_is_always_exact_with_the_real_kernel():
    cu = PagedKVCache(L, H, D, P, special_tokens=S6, backend=CuDNNBackend, **KW)
    assert cu._attn._bias is None and not cu._attn._fixed_ok
    assert isinstance(cu._attn._exact, SDPABackend)


def test_selection():
    assert resolve_backend("cudnn", torch.device("cuda"), torch.bfloat16) is CuDNNBackend
    assert resolve_backend("cudnn", "cuda", "fp16") is CuDNNBackend
    with pytest.raises(KVCacheError, match="needs a CUDA device"):
        resolve_backend("cudnn", "cpu", torch.bfloat16)
    with pytest.raises(KVCacheError, match="supports bf16, fp16"):
        resolve_backend("cudnn", "cuda", torch.float32)
    assert resolve_backend("auto", "cuda", torch.bfloat16) is not CuDNNBackend    # auto unchanged
    assert "cudnn" in available_backends("cuda", "bf16")
    assert "cudnn" not in available_backends("cpu") + available_backends("cuda", "fp32")
    with pytest.raises(KVCacheError, match="reads native KV stores, not int8"):
        PagedKVCache(L, H, D, P, special_tokens=S6, dtype="int8", backend=CuDNNBackend, **KW)


def test_session_setting_is_validated_and_clear_on_cpu():
    """backend="cudnn" is a choice of the typed setting; on the CPU opening a session says why not."""
    from engine import EngineError, SessionConfig, open_session
    from engine.api import setting_fields
    from engine.model_zoo import build_model

    assert "cudnn" in dict((f.name, m) for f, m in setting_fields())["backend"]["choices"]
    import numpy as np

    model = build_model("lingbot-map-tiny")
    cfg = dict(engine="lingbot-map", model="lingbot-map-tiny", image_width=70, scale_frames=1)
    with pytest.raises(EngineError, match="auto, sdpa, flashinfer, cudnn, cudnn-split"):
        open_session(SessionConfig(backend="cudn", **cfg), model=model)
    s = open_session(SessionConfig(backend="cudnn", **cfg), model=model)
    with pytest.raises(EngineError, match="cudnn attention backend needs a CUDA device"):
        s.push(np.zeros((60, 80, 3), dtype=np.uint8))        # the KV cache is made on the first step
    s.close()


def test_tiny_session_on_the_fixed_capacity_path_equals_sdpa(monkeypatch):
    """A whole LingBot-Map session (tiny model, CPU, fp32) with the backend's fixed-capacity path
    (stand-in kernel) gives the SDPA session's results: keyframe interval 2, eviction, ring wrap."""
    be = tiny_sessions_against_sdpa(monkeypatch,
                                    lambda cache: CuDNNBackend(cache, kernel=StandIn(cache), min_fill=0.0))
    assert be.error is None and be.calls["fixed"] > 0 and be.calls["exact"] == 0

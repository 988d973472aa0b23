"""The FlashInfer backend's host-side logic, on the CPU through a stand-in `flashinfer` module
whose kernels are plain SDPA over exactly the keys the plan describes: one plan per step (not per
layer), the dense (ragged) path over a zero-copy view when the visible pages are one run, the
paged path otherwise, outputs equal to the SDPA backend either way, the plan guard, and the
kernel-family pick (FA3 on Hopper). GPU checks of the real kernels: test_flashinfer_dense_gpu."""
import types

import pytest
import torch
import torch.nn.functional as F

from engine.kv import PagedKVCache, backends
from engine.kv.backends import FlashInferBackend

L, H, D, P, S6 = 2, 2, 8, 5, 3           # tiny frames: 5 patch tokens + 3 specials


def _sdpa(q, k, v):
    qh, kh, vh = (x.float().transpose(0, 1)[None] for x in (q, k, v))
    return F.scaled_dot_product_attention(qh, kh, vh)[0].transpose(0, 1).to(q.dtype)


class _FakePaged:
    def __init__(self, workspace, layout, backend="auto"):
        assert layout == "NHD"
        self.backend, self.runs = backend, 0

    def plan(self, qo_indptr, kv_indptr, indices, last_page_len, hq, hk, d, page, causal=False,
             q_data_type=None, kv_data_type=None, o_data_type=None):
        assert not causal and hq == hk == H and d == D
        self.indices, self.page, self.last = indices.clone(), page, int(last_page_len[0])

    def run(self, q, kv):
        self.runs += 1
        kp, vp = kv                                       # [pages, page, H, D]
        n = (len(self.indices) - 1) * self.page + self.last
        k = kp[self.indices.long()].reshape(-1, H, D)[:n]
        v = vp[self.indices.long()].reshape(-1, H, D)[:n]
        return _sdpa(q, k, v)


class _FakeRagged:
    def __init__(self, workspace, layout, backend="auto"):
        assert layout == "NHD"
        self.backend, self.views = backend, []

    def plan(self, qo_indptr, kv_indptr, hq, hk, d, causal=False, q_data_type=None, kv_data_type=None,
             o_data_type=None):
        assert not causal and hq == hk == H and d == D
        self.kv_len = int(kv_indptr[-1])

    def run(self, q, k, v):
        assert k.shape == v.shape == (self.kv_len, H, D)
        self.views.append(k)
        return _sdpa(q, k, v)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    mod = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=_FakePaged,
                                BatchPrefillWithRaggedKVCacheWrapper=_FakeRagged)
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (mod, None))
    return mod


def _caches(dense, **kw):
    kw = dict(scale_frames=2, window=3, special_cap=8, dtype=torch.float32, **kw)
    fi = PagedKVCache(L, H, D, P, special_tokens=S6, backend=FlashInferBackend, **kw)
    fi._attn = FlashInferBackend(fi, dense=dense)
    sd = PagedKVCache(L, H, D, P, special_tokens=S6, backend="sdpa", **kw)
    return fi, sd


def _drive(fi, sd, pattern, seed=0):
    """Identical steps through both caches; yields (fi outputs, sdpa outputs, step) per step."""
    g = torch.Generator().manual_seed(seed)
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in pattern]:
        k, v, q = (torch.randn(L, nf, S6 + P, H, D, generator=g) for _ in range(3))
        outs = []
        for c in (fi, sd):
            step = c.begin_step(nf, scale=scale, keyframe=key)
            o = []
            for layer in range(L):
                c.write(layer, k[layer], v[layer])
                o.append(c.attend(layer, q[layer]))
            c.end_step()
            outs.append(o)
        yield outs[0], outs[1], step


@pytest.mark.parametrize("dense", [True, False])
def test_flashinfer_paths_equal_sdpa_and_plan_once_per_step(fake_flashinfer, dense):
    fi, sd = _caches(dense)
    be = fi._attn
    steps = 0
    for a, b, step in _drive(fi, sd, "kknkkknkkk"):
        steps += 1
        assert be.plans == steps                          # one plan per step, all layers share it
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        want = "dense" if dense and step.contiguous is not None else "paged"
        assert be.path == want
    assert fi.state() == sd.state()
    if dense:
        views = be._ragged.views
        assert len(views) >= 2 * L                         # the steady state ran dense
        base = fi.pool.k.untyped_storage().data_ptr()
        assert all(v.untyped_storage().data_ptr() == base for v in views)    # zero copy
    else:
        assert be._ragged is None and be._wrapper.runs == L * steps


def test_dense_falls_back_to_paged_when_the_run_is_broken(fake_flashinfer):
    """A visible set that is not one run of pages (here: forced) goes through the paged kernel."""
    fi, sd = _caches(True)
    orig = fi.table.begin_step

    def broken(*a, **kw):
        step = orig(*a, **kw)
        step.contiguous = None
        return step
    fi.table.begin_step = broken
    for a, b, _ in _drive(fi, sd, "kkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        assert fi._attn.path == "paged"
    assert fi._attn._ragged.views == []


def test_dense_plan_failure_falls_back_to_paged(fake_flashinfer):
    fi, sd = _caches(True)

    def fail(*a, **kw):
        raise RuntimeError("no ragged kernel in this build")
    fi._attn._ragged.plan = fail
    for a, b, _ in _drive(fi, sd, "kkkkk"):    # the run forms once the window is full
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert fi._attn._ragged is None and "no ragged kernel" in fi._attn.dense_error


def test_plan_guard_waits_only_when_the_schedule_changes(fake_flashinfer):
    fi, _ = _caches(True)
    be = fi._attn

    class Event:
        waits = 0

        def synchronize(self):
            Event.waits += 1
    be._plan_event = Event()
    be._plan_key = None
    be._guard_plan(("dense", 10, 100))      # a new schedule: wait for the previous copy
    be._guard_plan(("dense", 10, 100))      # identical bytes: no wait
    be._guard_plan(("dense", 10, 106))
    assert Event.waits == 2


def test_dense_path_can_be_left_out(fake_flashinfer):
    fi = PagedKVCache(L, H, D, P, special_tokens=S6, scale_frames=2, window=3, special_cap=8,
                      backend=FlashInferBackend)
    assert fi._attn._ragged is not None                      # the default: dense where contiguous
    assert FlashInferBackend(fi, dense=False)._ragged is None   # comparisons: the paged kernel only


@pytest.mark.parametrize("cap, cuda, want", [((9, 0), "13.0", "fa3"), ((8, 0), "13.0", "fa2"),
                                             ((9, 0), "12.1", "fa2")])
def test_fa3_is_picked_on_hopper(monkeypatch, fake_flashinfer, cap, cuda, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: cap)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert backends.flashinfer_kernel("cuda") == want
    assert backends.flashinfer_kernel("cpu") == "fa2"
    monkeypatch.setattr(backends, "flashinfer_kernel", lambda dev: want)
    fi = PagedKVCache(L, H, D, P, special_tokens=S6, scale_frames=2, window=3, special_cap=8,
                      backend=FlashInferBackend)
    be = fi._attn
    assert be.kernel == want and be._wrapper.backend == want and be._ragged.backend == want
    # FA3 never uses the float workspace: a small one; FA2 splits and merges in it
    assert be._workspace.numel() == (8 if want == "fa3" else 128) * 2**20
    assert FlashInferBackend(fi, kernel="fa2").kernel == "fa2"      # benchmarks name the family

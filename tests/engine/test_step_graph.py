"""Whole-step CUDA graphs on the CPU: what makes a streamed step capturable, checked without a GPU.

A captured graph replays the kernels -- and the buffers -- of its capture. So a step may run as one
graph only if every index it writes or reads lives in a persistent device buffer updated before
the replay, and its shapes depend only on its kind (`static_key`). Checked here:
- the pool's write indices are the same tensors every step and hold the current step's values;
- the cuDNN split in static mode (part B over the fixed special zone, its length on the device)
  equals SDPA through window filling, eviction, keyframe rollbacks and the special ring's wrap,
  with one B shape and pointer for the whole run and one key per step kind;
- a LingBot-Map session whose graph cache only records the keys and calls the step (what a capture
  runs) equals an SDPA session without graphs, and takes the step path once the window is full.
GPU checks with real capture and replay: test_step_graph_gpu.py."""
import pytest
import torch

from engine.kv.backends import SDPABackend
from engine.kv.cudnn_kernels import masked_lse, torch_flash_lse
from engine.kv.cudnn_split import CuDNNSplitBackend
from tests.engine.kv_pair import H, D, KW, L, P, S6, cache_pair, drive, tiny_sessions_against_sdpa
from tests.engine.test_cudnn_split import PATTERN, FixedStandIn, WholeStandIn


class StaticBStandIn:
    """Part B of a static step: records the view it gets (shape and address), then `masked_lse`."""

    def __init__(self):
        self.views = set()

    def __call__(self, q, k, v, cu_q, cu_k):
        assert cu_q.dtype == cu_k.dtype == torch.int32 and int(cu_q[1]) == q.shape[0]
        self.views.add((tuple(k.shape), k.data_ptr(), v.data_ptr()))
        return masked_lse(q, k, v, cu_q, cu_k)


def test_masked_lse_equals_attention_over_the_visible_prefix():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(7, 3, 16, generator=g) * 2 for _ in range(3))
    cu_q = torch.tensor([0, 7], dtype=torch.int32)
    for n in (1, 5, 11):
        kk, vv = torch.cat([k, torch.randn(11 - 7, 3, 16, generator=g)]), torch.cat([v, torch.randn(4, 3, 16, generator=g)])
        out, lse = masked_lse(q, kk, vv, cu_q, torch.tensor([0, n], dtype=torch.int32))
        ref, ref_lse = torch_flash_lse(q, kk[:n], vv[:n])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
        # slots past the length hold unwritten pool memory: NaN / inf there must not leak in
        kk[n:], vv[n:] = float("nan"), float("inf")
        out2, lse2 = masked_lse(q, kk, vv, cu_q, torch.tensor([0, n], dtype=torch.int32))
        torch.testing.assert_close(out2, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse2, ref_lse, atol=1e-5, rtol=1e-5)


def test_write_indices_are_persistent_buffers_holding_the_current_step():
    cu, _ = cache_pair()
    g = torch.Generator().manual_seed(0)
    seen = {}
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in PATTERN]:
        step = cu.begin_step(nf, scale=scale, keyframe=key)
        for name in ("new_pages_t", "special_flat_t"):
            t = getattr(step, name)
            want = step.new_pages if name == "new_pages_t" else step.special_flat
            assert t.tolist() == list(want)
            assert seen.setdefault((name, t.numel()), t.data_ptr()) == t.data_ptr()
        for i in range(L):
            k, v, q = (torch.randn(nf, S6 + P, H, D, generator=g) for _ in range(3))
            cu.write(i, k, v)
            cu.attend(i, q)
        cu.end_step()
    assert len(seen) == 4                 # scale step (2 frames) and streamed steps: one each


def _static_caches(whole=False):
    cu, sd = cache_pair()
    b = StaticBStandIn()
    kw = dict(kernel_full=WholeStandIn(cu)) if whole else {}
    be = cu._attn = CuDNNSplitBackend(cu, kernel_a=FixedStandIn(cu), kernel_b_static=b,
                                      fallback=SDPABackend.create(cu), **kw)
    assert cu.enable_static_steps() and be.static
    return cu, sd, be, b


@pytest.mark.parametrize("whole", [False, True])
def test_static_split_equals_sdpa_with_one_b_view_and_one_key_per_step_kind(whole):
    cu, sd, be, b = _static_caches(whole)
    keys = {}
    for a, r, step, key, _ in drive(cu, sd, PATTERN + "nkknkk", planned=lambda c: c.static_key()):
        for x, y in zip(a, r):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        split = be._split
        assert (key is None) == (split is None)           # the fallback's steps are not static
        if key is not None:
            kind = ("whole" if split[4] else "split", step.keyframe)
            assert key[0] == kind[0]
            keys.setdefault(kind, set()).add(key)
    assert all(len(v) == 1 for v in keys.values())         # one graph per step kind
    assert {kf for _, kf in keys} == {True, False}
    assert ("whole", True) in keys if whole else not any(k == "whole" for k, _ in keys)
    # part B: always the same fixed view (the special zone to the pool's end), whatever its length
    # (one per layer)
    assert len(b.views) == L
    shapes = {shape for shape, _, _ in b.views}
    assert shapes == {((cu.num_pages - (KW["scale_frames"] + KW["window"] + 1)) * P, H, D)}
    assert be.calls["split"] > 0 and be.error is None


def test_static_key_is_none_without_the_static_mode_and_for_other_backends():
    cu, sd = cache_pair()
    cu._attn = CuDNNSplitBackend(cu, kernel_a=FixedStandIn(cu), fallback=SDPABackend.create(cu))
    assert all(key is None for *_, key, _ in drive(cu, sd, PATTERN, planned=lambda c: c.static_key()))
    x, y = cache_pair()
    assert not x.enable_static_steps()      # SDPA has no static steps
    assert all(key is None for *_, key, _ in drive(x, y, PATTERN, planned=lambda c: c.static_key()))


class RecordingGraphs:
    """A graph cache that runs the function each time (what a capture runs) and records keys."""

    def __init__(self):
        self.keys = []

    def has(self, name):
        return name in self.keys

    def step_graphs(self):
        return len({k for k in self.keys if isinstance(k, tuple) and k and k[0] == "step"})

    def run(self, name, fn, *inputs, error_mode="global"):
        self.keys.append(name)
        if isinstance(name, tuple) and name and name[0] == "step":
            assert error_mode == "thread_local"     # other threads' CUDA calls are allowed
        return fn(*inputs)

    def clear(self):
        pass

    def discard(self, name):
        raise AssertionError("no step left its static path")

    def __len__(self):
        return len(set(self.keys))


def test_session_step_path_equals_sdpa_session(monkeypatch):
    """The tiny model through a split-backend session whose streamed steps take the step-graph
    path (static split, camera head over its fixed-capacity cache, the RoPE tables as inputs)
    against an SDPA session without graphs: equal results (tiny_sessions_against_sdpa); the step
    path ran after the window filled, with one key per step kind, each kind's first step eagerly."""
    graphs, seen = RecordingGraphs(), {}

    def opened(s):
        s.model.aggregator.graphs = graphs
        assert s.model.aggregator.graph_scope == "step"

    be = tiny_sessions_against_sdpa(
        monkeypatch, lambda cache: CuDNNSplitBackend(cache, kernel_a=torch_flash_lse, kernel_b_static=masked_lse,
                                                      kernel_full=lambda q, k, v: torch_flash_lse(q, k, v)[0],
                                                      fallback=SDPABackend.create(cache)),
        frames=30, special_cap=9, seed=5, opened=opened,
        closing=lambda s: seen.update(stats=s.stats(), run=set(s.model._step_keys_run)))
    assert be.error is None and be.calls["split"] > 0 and be.calls["whole"] > 0
    steps = [k for k in graphs.keys if isinstance(k, tuple) and k and k[0] == "step"]
    assert steps and seen["stats"]["step_graph"]["error"] is None
    assert seen["stats"]["step_graph"]["replays"] == len(steps)
    assert seen["stats"]["kernel_errors"] == {"fused": None, "cudnn_first_sdpa": None}
    kinds = {k[1][1:] for k in steps}          # (path, first page, length or A pages)
    assert {k[0] for k in kinds} == {"split", "whole"} and len(kinds) <= 4
    assert set(steps) <= seen["run"]           # each kind's first step ran eagerly
    # parts are not graphed separately inside a step graph (no nested capture)
    assert len(graphs.keys) > len(steps)
    sg = seen["stats"]["step_graph"]
    assert sg["graphs"] == len(set(steps)) and sg["error"] is None
    # a CPU stand-in: off, for the reason fast_path gives (one decision: engine/fast_path.py)
    from engine.fast_path import NOT_CUDA
    assert not sg["on"] and sg["why_not"] == NOT_CUDA == seen["stats"]["fast_path"]["reason"]

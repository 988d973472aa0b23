"""GPU checks of whole-step CUDA graphs (engine/lingbot/model.py `_graphed_step`): a full-size
bf16 LingBot-Map session on the cuDNN split whose streamed steps are captured and replayed as one
graph each equals the same session run eagerly step by step (graph scope "fixed": the parts
graphed, attention eager) through window filling, eviction, keyframe rollbacks and the special
ring's wrap (split and whole steps); the graphs are few (one per step kind) and no capture failed.
Skipped without CUDA. CPU checks of what makes a step capturable: test_step_graph.py."""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _run(model, scope, frames):
    from engine import SessionConfig, open_session
    model.aggregator.graph_scope = scope
    s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", backend="cudnn-split",
                                   scale_frames=2, window=4, keyframe_interval=2, special_cap=8), model=model)
    res = [r for f in frames for r in s.push(f)] + s.flush()
    stats = s.stats()
    keys = [k for k in s.model.aggregator.graphs._graphs if k[0][0] == "step"]
    paths = s.kv.attention.path_stats()
    s.close()
    return res, stats, keys, paths


@needs_cuda
@pytest.mark.parametrize("height", [378, 392])
def test_step_graphs_equal_the_eager_steps(height):
    """height 392 (a 640x480 input): 1,042 rows a frame, past one wave of cuDNN tiles on the H200,
    so the split's steps carry a wave tail (`chunked_lse`) -- graphed too."""
    from tests.engine.factories import random_model
    from tests.engine.backend_sessions import rel
    model = random_model("lingbot-map", "cuda")
    gen = torch.Generator().manual_seed(3)
    frames = [torch.rand(3, height, 518, generator=gen) for _ in range(30)]
    try:
        before = model.step_graph_replays
        eager, _, eager_keys, _ = _run(model, "fixed", frames)
        assert not eager_keys and model.step_graph_replays == before
        graphed, stats, keys, paths = _run(model, "step", frames)
    finally:
        model.aggregator.graph_scope = "step"
    assert stats["step_graph"]["error"] is None, stats["step_graph"]["error"]
    assert paths["error"] is None and paths["calls"]["split"] > 0 and paths["calls"]["whole"] > 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert (paths["wave_tail_steps"] > 0) == (16 * -(-(37 * (height // 14) + 6) // 128) > sms)
    assert paths["wave_declined"] == 0
    assert 2 <= len(keys) <= 4                          # one graph per step kind
    assert stats["step_graph"]["replays"] - before >= 10
    assert len(graphed) == len(eager) == len(frames)
    pose = rel(np.stack([r.pose_enc for r in graphed]), np.stack([r.pose_enc for r in eager]))
    depth = rel(np.stack([r.depth for r in graphed]), np.stack([r.depth for r in eager]))
    print(f"step graphs vs eager steps: pose_enc {pose:.2e}, depth {depth:.2e}, graphs {len(keys)}")
    assert pose < 1e-2 and depth < 1e-2


@needs_cuda
def test_a_graph_cache_captures_again_after_its_last_graph_is_discarded():
    """Once every graph of the shared pool is gone the allocator retires the pool and refuses a
    capture into it (PyTorch's internal assert `use_count > 0`); the cache takes a fresh pool.
    Captures warm up on one stream per device (cuBLAS keeps a workspace per stream)."""
    from engine.models.graphs import GraphCache, _warmup_stream
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, generator=g).cuda()
    cache = GraphCache()
    with torch.no_grad():
        first = cache.run("a", lin, x).clone()
        cache.discard("a")
        assert len(cache) == 0
        again = cache.run("b", lin, x).clone()
        ref = lin(x)
    torch.testing.assert_close(first, ref)
    torch.testing.assert_close(again, ref)
    assert _warmup_stream(x.device) is _warmup_stream(torch.device("cuda", x.device.index))

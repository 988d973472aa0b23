"""End to end on the GPU (run on the H200; skipped without CUDA + flashinfer): the same frames
through a FlashInfer session and an SDPA session of one full-size bf16 model give the same
poses and depth to bf16 tolerance, with eviction and keyframe rollback in play."""
import pytest
import torch

from engine import SessionConfig, open_session
from engine.kv.backends import flashinfer_available
from tests.engine.backend_sessions import assert_matches_sdpa, rel

pytestmark = pytest.mark.gpu
needs_fi = pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                              reason="needs CUDA and flashinfer")


@needs_fi
def test_flashinfer_session_matches_sdpa_session():
    assert_matches_sdpa("flashinfer")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.parametrize("scope", ["fixed", "all"])
def test_cuda_graphs_match_eager(scope):
    """The graphed patch embed / frame blocks / depth head ("fixed", the default) -- and with "all"
    also the global-block halves and the static-shape camera head -- give what eager gives, frame
    after frame (static buffers are refilled every step, nothing of a previous frame leaks)."""
    from tests.engine.factories import random_model

    model = random_model("lingbot-map", "cuda")
    model.aggregator.graph_scope = scope
    gen = torch.Generator().manual_seed(5)
    frames = [torch.rand(3, 378, 518, generator=gen) for _ in range(12)]
    outs = {}
    for graphs in (False, True):
        s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", backend="sdpa",
                                       scale_frames=2, window=4, keyframe_interval=2, special_cap=8,
                                       extra={"cuda_graphs": graphs}), model=model)
        res = []
        for f in frames:
            res += s.push(f)
        res += s.flush()            # on CUDA the last frame's results come with flush (defer_results)
        assert (model.aggregator.graphs is not None and len(model.aggregator.graphs) > 0) == graphs
        outs[graphs] = res
        s.close()
    a, b = outs[True], outs[False]
    assert len(a) == len(b) == len(frames)
    for ra, rb in zip(a, b):
        assert rel(ra.depth, rb.depth) < 1e-2, ra.index
        assert rel(ra.pose_enc, rb.pose_enc) < 5e-2, ra.index
    # consecutive graphed frames differ (outputs are not a stale buffer)
    assert rel(a[-1].depth, a[-2].depth) > 1e-3


@needs_cuda
def test_close_frees_gpu_memory_at_once():
    """close() returns the KV pools, camera cache and CUDA graphs to the allocator at once, with
    Python's cycle collector off: allocated memory goes back to the model's (plus the small caches
    the model keeps across sessions: RoPE tables, resized position embedding, cuBLAS workspace)."""
    import gc
    from tests.engine.factories import random_model

    model = random_model("lingbot-map", "cuda").set_dtype(torch.bfloat16)   # as the sessions use it
    gen = torch.Generator().manual_seed(7)
    frames = [torch.rand(3, 378, 518, generator=gen) for _ in range(8)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    after = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", scale_frames=2,
                                           window=8, keyframe_interval=2, special_cap=16), model=model)
            for f in frames:
                s.push(f)
            pools = s.stats()["kv"]["bytes_allocated"]
            assert torch.cuda.memory_allocated() > base + pools
            s.close()
            del s
            torch.cuda.synchronize()
            after.append(torch.cuda.memory_allocated())
    finally:
        gc.enable()
    print(f"allocated: model {base / 2**30:.3f} GiB, after each close {[round(a / 2**30, 3) for a in after]} GiB, "
          f"pools {pools / 2**30:.2f} GiB")
    assert after[0] - base < pools / 4
    assert max(after) - min(after) <= 16 * 2**20

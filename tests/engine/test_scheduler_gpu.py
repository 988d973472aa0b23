"""The scheduler's throughput options on the GPU (skipped without CUDA): attention on side streams
and pipelined rounds give exactly the results of plain batching (same kernels, same inputs)."""
import numpy as np
import pytest
import torch

from engine import SessionConfig
from engine.scheduler import StreamScheduler

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(model, **opts):
    cfg = SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", backend="sdpa", image_width=70,
                        scale_frames=2, window=3, special_cap=8, camera_iterations=2, keyframe_interval=2)
    sched = StreamScheduler(model, max_batch=3, **opts)
    streams = [sched.open_stream(cfg, name=f"s{i}") for i in range(3)]
    rng = np.random.default_rng(0)
    got = {st.name: [] for st in streams}
    for _ in range(9):
        for st in streams:
            sched.submit(st, rng.integers(0, 256, (60, 80, 3), dtype=np.uint8))
        for st, res in sched.step():
            got[st.name] += res
    for st in streams:
        got[st.name] += sched.close_stream(st)
    assert sched.stats()["largest_batch"] == 3
    return got


def test_side_streams_and_pipeline_equal_plain_batching():
    from engine.model_zoo import build_model
    from engine.models.recipe import fill_recipe
    with torch.device("cuda"):
        model = fill_recipe(build_model("lingbot-map-tiny"))
    ref = _run(model, attention_streams=False, pipeline=False)
    for opts in (dict(attention_streams=True), dict(pipeline=True), dict(attention_streams=True, pipeline=True)):
        got = _run(model, **opts)
        for name, rs in ref.items():
            assert [r.index for r in got[name]] == [r.index for r in rs] and len(rs) == 9
            for a, b in zip(rs, got[name]):
                # expected bit-equal (same kernels, same inputs); a hair of slack for cuBLAS picks
                np.testing.assert_allclose(b.pose_enc, a.pose_enc, rtol=1e-6, atol=1e-7)
                np.testing.assert_allclose(b.depth, a.depth, rtol=1e-6, atol=1e-7)

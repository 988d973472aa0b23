"""Results handed out a step later (LingBotMapSession.defer_results, the default on CUDA; forced
here on the CPU, where the same code path runs synchronously): every frame comes back exactly
once, in order, from the next push or from flush, with the outputs the non-deferred session
gives; the scale phase still returns at once; close() drops what is in flight."""
import numpy as np
import pytest

from engine import SessionConfig, open_session
from engine.model_zoo import build_model
from engine.models.recipe import fill_recipe


@pytest.fixture(scope="module")
def tiny():
    return fill_recipe(build_model("lingbot-map-tiny"))


def _cfg(**kw):
    return SessionConfig(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                         camera_iterations=2, **kw)


def _frames(n):
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(n)]


def _run(model, frames, defer, **kw):
    s = open_session(_cfg(**kw), model=model)
    assert s.defer_results is False            # CPU default
    s.defer_results = defer
    per_push = [s.push(f) for f in frames]
    tail = s.flush()
    stats = s.stats()
    s.close()
    return per_push, tail, stats


@pytest.mark.parametrize("interval", [1, 2])
def test_deferred_results_match_and_come_one_push_later(tiny, interval):
    frames = _frames(9)
    sync, sync_tail, _ = _run(tiny, frames, False, keyframe_interval=interval)
    lag, lag_tail, stats = _run(tiny, frames, True, keyframe_interval=interval)
    assert sync_tail == [] and [len(r) for r in sync] == [0, 2, 1, 1, 1, 1, 1, 1, 1]
    # scale phase at once; then each push returns the previous frame, flush the last one
    assert [len(r) for r in lag] == [0, 2, 0, 1, 1, 1, 1, 1, 1] and len(lag_tail) == 1
    a = [r for rs in sync for r in rs]
    b = [r for rs in lag for r in rs] + lag_tail
    assert [r.index for r in b] == list(range(9)) == [r.index for r in a]
    assert [r.is_keyframe for r in a] == [r.is_keyframe for r in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.depth, y.depth)
        np.testing.assert_array_equal(x.pose_enc, y.pose_enc)
        np.testing.assert_array_equal(x.c2w, y.c2w)
    assert stats["frames"] == 9


def test_flush_without_pending_records_nothing_and_close_drops_in_flight(tiny):
    s = open_session(_cfg(), model=tiny)
    s.defer_results = True
    for f in _frames(3):
        s.push(f)
    assert len(s._host) == 1
    runs = len(s._latency)
    assert len(s.flush()) == 1 and s.flush() == []
    assert len(s._latency) == runs + 1           # the empty flush is not a model run
    s.push(_frames(1)[0])
    s.close()
    assert len(s._host) == 0


@pytest.mark.gpu
def test_cuda_deferred_equals_synchronous_full_size():
    """On the GPU (skipped without CUDA): the default deferred session gives the same results as
    one that syncs every frame (same kernels, same order; only the host waits differ)."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tests.engine.factories import random_model
    model = random_model("lingbot-map", "cuda")
    gen = torch.Generator().manual_seed(9)
    frames = [torch.rand(3, 378, 518, generator=gen) for _ in range(12)]
    out = {}
    for defer in (True, False):
        s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", scale_frames=2,
                                       window=4, keyframe_interval=2, special_cap=8), model=model)
        assert s.defer_results is True
        s.defer_results = defer
        res = []
        for f in frames:
            res += s.push(f)
        res += s.flush()
        out[defer] = res
        s.close()
    a, b = out[True], out[False]
    assert [r.index for r in a] == [r.index for r in b] == list(range(12))
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.depth, y.depth, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(x.pose_enc, y.pose_enc, rtol=1e-5, atol=1e-6)

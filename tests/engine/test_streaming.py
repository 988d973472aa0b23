"""The lingbot-map streaming session on the tiny configuration (engine/lingbot/session.py)."""
import numpy as np
import pytest
import torch

from engine import EngineError, SessionConfig, engine_capabilities, open_session
from engine.model_zoo import build_model
from engine.models.recipe import fill_recipe


@pytest.fixture(scope="module")
def tiny():
    return fill_recipe(build_model("lingbot-map-tiny"))


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(30)]


def _cfg(**kw):
    base = dict(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                keyframe_interval=1, camera_iterations=2)
    base.update(kw)
    return SessionConfig(**base)


def _snapshot(s):
    """Every table, counter and committed byte of both caches, plus the session's own counters."""
    kv = s.kv
    slots = kv.committed_slots()
    L, N, P, H, D = kv.k_pool.shape
    k = kv.k_pool.view(L, N * P, H, D)[:, slots].clone()
    v = kv.v_pool.view(L, N * P, H, D)[:, slots].clone()
    return kv.state(), k, v, s.camera_cache.state(), s._time


def _assert_same(a, b):
    assert a[0] == b[0] and a[4] == b[4]
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    ca, cb = a[3], b[3]
    assert {k: v for k, v in ca.items() if k != "slots"} == {k: v for k, v in cb.items() if k != "slots"}
    assert torch.equal(ca["slots"], cb["slots"])


def test_scale_phase_then_one_result_per_push(tiny, frames):
    s = open_session(_cfg(scale_frames=3), model=tiny)
    assert s.push(frames[0]) == [] and s.push(frames[1]) == []
    assert s.stats()["pending_scale_frames"] == 2
    res = s.push(frames[2], timestamp=1.5)
    assert [r.index for r in res] == [0, 1, 2] and res[2].timestamp == 1.5
    assert res[0].timestamp == 0.0 and res[1].timestamp == pytest.approx(1 / 30)
    for i in range(3, 6):
        (r,) = s.push(frames[i])
        assert r.index == i and r.is_keyframe
        assert r.c2w.shape == (4, 4) and r.c2w.dtype == np.float64 and r.K.shape == (3, 3)
        assert r.depth.shape == (56, 70) == r.conf.shape == r.image.shape[:2] and r.pose_enc.shape == (9,)
        assert np.isfinite(r.depth).all() and (r.conf > 1).all()
        np.testing.assert_allclose(r.c2w[:3, 3], r.pose_enc[:3], rtol=1e-6)
    assert s.flush() == []
    st = s.stats()
    for key in ("frames", "keyframes", "fps", "latency_ms", "latency_p50_ms", "latency_p95_ms",
                "gpu_allocated_bytes", "gpu_reserved_bytes", "segments", "kv", "kv_page_map"):
        assert key in st
    assert st["frames"] == 6 == st["keyframes"] and st["fps"] > 0 and st["kv"]["cached_frames"] == 6
    assert st["kv_page_map"].dtype == np.int8


def test_scale_phase_equals_one_uncached_batch(tiny, frames):
    s = open_session(_cfg(scale_frames=3), model=tiny)
    res = [r for f in frames[:3] for r in s.push(f)]
    from engine.preprocess import preprocess
    imgs = torch.stack([preprocess(f, 70).tensor for f in frames[:3]])
    ref = tiny(imgs, iterations=2)
    np.testing.assert_allclose(np.stack([r.pose_enc for r in res]), ref["pose_enc"].numpy(), atol=1e-5)
    np.testing.assert_allclose(np.stack([r.depth for r in res]), ref["depth"].numpy(), rtol=1e-5)


def test_short_stream_runs_its_scale_phase_at_flush(tiny, frames):
    s = open_session(_cfg(scale_frames=4), model=tiny)
    assert s.push(frames[0]) == [] and s.push(frames[1]) == []
    res = s.flush()
    assert [r.index for r in res] == [0, 1] and all(r.is_keyframe for r in res)
    assert s.flush() == []
    (r,) = s.push(frames[2])                    # the stream may go on after a flush
    assert r.index == 2


def test_keyframe_interval_flags(tiny, frames):
    s = open_session(_cfg(keyframe_interval=3), model=tiny)
    res = [r for f in frames[:10] for r in s.push(f)]
    assert [r.index for r in res if r.is_keyframe] == [0, 1, 2, 5, 8]
    assert s.stats()["keyframes"] == 5 and s.stats()["time_index"] == 5


def test_non_keyframe_leaves_every_cache_exactly_unchanged(tiny, frames):
    s = open_session(_cfg(keyframe_interval=2, window=2, special_cap=4), model=tiny)
    for f in frames[:8]:                        # window full, special ring wrapped
        s.push(f)
    for i in range(8, 14):
        before = _snapshot(s)
        (r,) = s.push(frames[i])
        after = _snapshot(s)
        if r.is_keyframe:
            assert after[4] == before[4] + 1
        else:
            _assert_same(before, after)


def test_non_keyframe_sees_what_a_keyframe_would(tiny, frames):
    """A non-keyframe gets the output it would get as a keyframe (same visible set); only
    what happens to the caches afterwards differs."""
    every = open_session(_cfg(window=2), model=tiny)
    sparse = open_session(_cfg(window=2, keyframe_interval=4), model=tiny)
    a = [r for f in frames[:4] for r in every.push(f)]
    b = [r for f in frames[:4] for r in sparse.push(f)]
    assert [r.is_keyframe for r in b] == [True, True, True, False]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.pose_enc, y.pose_enc, atol=1e-6)
        np.testing.assert_allclose(x.depth, y.depth, rtol=1e-6)
    xa, = every.push(frames[4])
    xb, = sparse.push(frames[4])               # frame 3 is cached in one session only
    assert np.abs(xa.depth - xb.depth).max() > 1e-4


def test_memory_is_bounded(tiny, frames):
    s = open_session(_cfg(scale_frames=1, window=2, special_cap=3), model=tiny)
    sizes = []
    for i in range(40):
        s.push(frames[i % len(frames)])
        st = s.stats()
        kv, cam = st["kv"], st["camera_cache"]
        sizes.append((kv["pages_total"], kv["bytes_allocated"], kv["pages_total"] - kv["pages_free"],
                      kv["cached_frames"], kv["special_frames"], cam["frames"], cam["bytes_allocated"]))
    steady = set(sizes[5:])
    assert len(steady) == 1, steady
    (_, _, _, cached, specials, cam_frames, _), = steady
    assert cached == 1 + 2 and specials == 3 and cam_frames == 1 + 3
    assert s.stats()["time_index"] == 40


def test_position_limit_policy(frames):
    """Past the trained range and past the released RoPE table the stream keeps running, with
    one warning and one info event; positions keep counting (no clamping, no wrap)."""
    m = fill_recipe(build_model("lingbot-map-tiny", max_frame_num=6, trained_views=4))
    s = open_session(_cfg(window=2, special_cap=4), model=m)
    kinds = []
    for i in range(12):
        for r in s.push(frames[i]):
            assert np.isfinite(r.depth).all() and np.isfinite(r.pose_enc).all()
        kinds += [(i, e.kind) for e in s.poll_events()]
    assert kinds == [(3, "warning"), (5, "info")]
    assert s.stats()["time_index"] == 12 and s.poll_events() == []


def test_settings_and_input_errors(tiny, frames):
    for bad in (dict(dtype="int8"), dict(mode="bogus"), dict(special_cap=3), dict(window=0),
                dict(backend="xformers"), dict(image_width=100), dict(device="cuda:7" if torch.cuda.is_available() else "cuda"),
                dict(kv_compression="bogus_method"), dict(kv_dtype="int4")):
        with pytest.raises(EngineError):
            open_session(_cfg(**bad), model=tiny)
    with pytest.raises(EngineError, match="checkpoint"):
        open_session(_cfg(), model=None)
    with pytest.raises(EngineError):
        open_session(_cfg(), model=torch.nn.Linear(2, 2))
    s = open_session(_cfg(scale_frames=1), model=tiny)
    s.push(frames[0])
    with pytest.raises(EngineError, match="size changed"):
        s.push(np.zeros((90, 80, 3), np.uint8))
    with pytest.raises(EngineError):
        s.push(np.zeros((60, 80), np.float64))
    s.close()
    with pytest.raises(EngineError, match="closed"):
        s.push(frames[1])


def test_capabilities_registered():
    caps = engine_capabilities("lingbot-map")
    assert caps["needs_checkpoint"] and "bf16" in caps["dtypes"] and "sdpa" in caps["backends"]
    assert {"scale_frames", "window", "keyframe_interval", "camera_iterations"} <= set(caps["fields"])


@pytest.mark.parametrize("dtype, kv_dtype", [("bf16", "auto"), ("fp16", "fp32")])
def test_reduced_precision_sessions(frames, dtype, kv_dtype):
    ref_model = fill_recipe(build_model("lingbot-map-tiny"))
    low_model = fill_recipe(build_model("lingbot-map-tiny"))
    ref = open_session(_cfg(window=2), model=ref_model)
    low = open_session(_cfg(window=2, dtype=dtype, kv_dtype=kv_dtype), model=low_model)
    a = [r for f in frames[:6] for r in ref.push(f)]
    b = [r for f in frames[:6] for r in low.push(f)]
    assert low_model.aggregator.frame_blocks[0].attn.qkv.weight.dtype != torch.float32
    assert low_model.camera_head.trunk[0].attn.qkv.weight.dtype == torch.float32
    assert low.stats()["kv"]["dtype"] == {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[
        dtype if kv_dtype == "auto" else kv_dtype]
    for x, y in zip(a, b):
        assert np.isfinite(y.depth).all() and np.isfinite(y.pose_enc).all()
        assert np.abs(np.log(y.depth) - np.log(x.depth)).max() < 0.1


def test_session_loads_its_checkpoint(tiny, frames, tmp_path):
    path = tmp_path / "tiny.pt"
    torch.save({"model": tiny.state_dict()}, path)
    s = open_session(_cfg(checkpoint=str(path), extra={"model": "lingbot-map-tiny"}), model=None)
    ref = open_session(_cfg(), model=tiny)
    for f in frames[:4]:
        for a, b in zip(s.push(f), ref.push(f)):
            np.testing.assert_array_equal(a.pose_enc, b.pose_enc)
    bad = tmp_path / "bad.pt"
    torch.save({"something.else": torch.zeros(3)}, bad)
    with pytest.raises(EngineError):
        open_session(_cfg(checkpoint=str(bad), extra={"model": "lingbot-map-tiny"}), model=None)


def test_failed_step_leaves_caches_as_before(frames, monkeypatch):
    m = fill_recipe(build_model("lingbot-map-tiny"))
    s = open_session(_cfg(window=2, special_cap=4), model=m)
    for f in frames[:6]:
        s.push(f)
    before = _snapshot(s)
    real = m.depth_head.forward

    def boom(*a, **k):
        raise torch.OutOfMemoryError("simulated")
    monkeypatch.setattr(m.depth_head, "forward", boom)
    with pytest.raises(EngineError, match="out of CPU memory"):
        s.push(frames[6])
    monkeypatch.setattr(m.depth_head, "forward", real)
    after = _snapshot(s)
    # a keyframe evicts its oldest window page at begin_step (final by design); everything the
    # next frame can see is unchanged
    assert after[4] == before[4] and after[0]["special_len"] == before[0]["special_len"]
    ca, cb = before[3], after[3]
    assert torch.equal(ca["slots"], cb["slots"]) and ca["ring_count"] == cb["ring_count"]
    (r,) = s.push(frames[7])
    assert np.isfinite(r.depth).all()


def test_upcasting_a_rounded_model_warns(frames):
    m = fill_recipe(build_model("lingbot-map-tiny"))
    assert open_session(_cfg(dtype="bf16"), model=m).poll_events() == []
    events = open_session(_cfg(dtype="fp32"), model=m).poll_events()
    assert [e.kind for e in events] == ["warning"] and "bfloat16" in events[0].message


def test_close_frees_the_caches_by_refcount_alone(tiny, frames):
    """No reference cycle keeps a closed session's KV pools or camera cache alive: with the cycle
    collector off they are gone as soon as close() returns (on the GPU: the memory is free)."""
    import gc
    import weakref
    s = open_session(_cfg(keyframe_interval=2), model=tiny)
    for f in frames[:8]:
        s.push(f)
    refs = [weakref.ref(x) for x in (s.kv, s.kv.k_pool, s.kv.v_pool, s.kv.attention, s.camera_cache,
                                     s.camera_cache.kv)]
    gc.collect()
    gc.disable()
    try:
        s.close()
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        gc.enable()


class _DirectGraphs:
    """Stands in for engine.models.graphs.GraphCache on the CPU: runs each graph function
    directly, so the code path the CUDA graphs capture is checked here too."""

    def __init__(self):
        self.names = set()

    def __len__(self):
        return len(self.names)

    def run(self, name, fn, *inputs):
        self.names.add(name if isinstance(name, str) else name[0])
        return fn(*inputs)


def test_graph_code_path_equals_eager(tiny, frames):
    """The global blocks split around attention and the static-shape camera head (full-capacity
    cache + mask, slot index on the device) give what the eager path gives: keyframes and
    non-keyframes, window eviction and the camera-cache ring wrapping (cap 6)."""
    outs = {}
    for graphed in (False, True):
        s = open_session(_cfg(window=3, special_cap=6, keyframe_interval=2), model=tiny)
        if graphed:
            s.model.aggregator.graphs = _DirectGraphs()
            s.model.aggregator.graph_scope = "all"
        try:
            outs[graphed] = [r for f in frames[:20] for r in s.push(f)]
            if graphed:
                names = s.model.aggregator.graphs.names
                assert {"global_pre", "global_post", "camera_head", "frame", "depth_head"} <= names
        finally:
            s.model.aggregator.graph_scope = "fixed"
            s.close()
    assert len(outs[True]) == 20 and not all(r.is_keyframe for r in outs[True])
    for a, b in zip(outs[False], outs[True]):
        np.testing.assert_allclose(b.pose_enc, a.pose_enc, atol=1e-5)
        np.testing.assert_allclose(b.depth, a.depth, rtol=1e-5)

"""The chunked VGGT session on the tiny configuration: streaming contract, KV bookkeeping through
the shared paged cache, one chunk == the offline pass, window semantics, settings."""
import numpy as np
import pytest
import torch

from engine import EngineError, SessionConfig, engine_capabilities, open_session
from tests.engine.test_flashinfer_dense import fake_flashinfer  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def model():
    from engine import build_model
    from engine.models.recipe import fill_recipe
    return fill_recipe(build_model("vggt-tiny"))


@pytest.fixture(scope="module")
def frames():
    g = torch.Generator().manual_seed(1)
    return [torch.rand(3, 56, 70, generator=g) for _ in range(11)]


def _cfg(**kw):
    base = dict(engine="vggt-1b", image_width=70, chunk_size=4, sliding_window_num=2, overlap=1, backend="sdpa")
    return SessionConfig(**{**base, **kw})


def _run(model, frames, **kw):
    s = open_session(_cfg(**kw), model=model)
    per_push = [[r.index for r in s.push(f)] for f in frames]
    tail = s.flush()
    return s, per_push, tail


def test_results_stream_per_chunk(model, frames):
    s, per_push, tail = _run(model, frames)
    # chunk 0 = frames 0-3; chunk k repeats 1 frame and adds 3 new ones; flush runs the rest
    assert per_push == [[], [], [], [0, 1, 2, 3], [], [], [4, 5, 6], [], [], [7, 8, 9], []]
    assert [r.index for r in tail] == [10]
    st = s.stats()
    assert st["chunks"] == 4 and st["frames"] == 11 and st["pending_frames"] == 0
    assert st["last_alignment"]["points"] > 100 and st["last_alignment"]["scale"] > 0
    s.close()
    with pytest.raises(EngineError, match="closed"):
        s.push(frames[0])


def test_kv_pages_stop_growing_and_evict_oldest_chunk_first(model, frames):
    s = open_session(_cfg(chunk_size=4, overlap=1, sliding_window_num=2), model=model)
    used, windows = [], []
    for f in frames[:10]:
        if s.push(f):
            kv = s.stats()["kv"]
            used.append(kv["pages_total"] - kv["pages_free"])
            windows.append(s.kv.window_pages)
    assert used == [4, 8, 8]                       # grows to 2 chunks of 4 frames, then stays
    # chunk 2 evicted chunk 0 (the oldest) and reused its pages; chunk 1's pages stay, oldest first
    assert windows[1][:4] == windows[0] and windows[2] == windows[1][4:] + windows[0]
    assert s.stats()["kv"]["evictions"] == 4
    total = s.stats()["kv"]["pages_total"]
    for f in frames:                               # longer stream: nothing more is allocated
        s.push(f)
    kv = s.stats()["kv"]
    assert kv["pages_total"] == total and kv["pages_total"] - kv["pages_free"] == 8
    fp = s.stats()["fast_path"]          # chunks run eagerly; why, in words (engine/fast_path.py)
    assert fp["graphs"] == "none" and fp["attention"] == kv["backend"] and fp["reason"]


def test_one_chunk_covering_all_frames_is_the_offline_pass(model, frames):
    s, per_push, tail = _run(model, frames, chunk_size=16, overlap=1)
    assert all(p == [] for p in per_push) and [r.index for r in tail] == list(range(11))
    with torch.no_grad():
        off = model(torch.stack(frames))
    np.testing.assert_allclose(np.stack([r.pose_enc for r in tail]), off["pose_enc"].numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.stack([r.depth for r in tail]), off["depth"].numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.stack([r.conf for r in tail]), off["depth_conf"].numpy(), rtol=0, atol=1e-6)
    # VGGT's [R|t] is world-to-camera: c2w is its inverse; frame 0 (the reference) sits at the origin
    from engine.pose import decode_pose
    for r in tail[:3]:
        w2c, _ = decode_pose(r.pose_enc, r.depth.shape, convention="c2w")
        np.testing.assert_allclose(r.c2w @ w2c, np.eye(4), atol=1e-9)


def test_window_of_one_chunk_is_independent_chunks(model, frames):
    """sliding_window_num = 1 (VGGT-Long): chunk 1 = frames 3-6 sees nothing else."""
    s = open_session(_cfg(chunk_size=4, overlap=1, sliding_window_num=1), model=model)
    out = []
    for f in frames[:7]:
        out += s.push(f)
    with torch.no_grad():
        alone = model(torch.stack(frames[3:7]))
    np.testing.assert_allclose(np.stack([r.pose_enc for r in out[4:7]]), alone["pose_enc"][1:].numpy(), atol=1e-6)
    # and the cached previous chunk does change the result when the window holds it
    s2 = open_session(_cfg(chunk_size=4, overlap=1, sliding_window_num=2), model=model)
    out2 = []
    for f in frames[:7]:
        out2 += s2.push(f)
    assert np.abs(np.stack([r.pose_enc for r in out2[4:7]]) - alone["pose_enc"][1:].numpy()).max() > 1e-4


def test_settings_are_checked():
    with pytest.raises(EngineError, match="overlap"):
        open_session(_cfg(chunk_size=4, overlap=4), model=None)
    with pytest.raises(EngineError, match="chunk_size"):
        open_session(_cfg(chunk_size=1, overlap=1), model=None)
    with pytest.raises(EngineError, match="needs weights"):
        open_session(_cfg(), model=None)
    caps = engine_capabilities("vggt-1b")
    for name in ("chunk_size", "sliding_window_num", "overlap", "window_size", "mode"):
        assert name in caps["fields"] and caps["tooltips"].get(name)
    assert caps["modes"] == ["streaming", "windowed"]


def test_wrong_model_is_refused():
    from engine import build_model
    with pytest.raises(EngineError, match="VGGT model"):
        open_session(_cfg(), model=build_model("lingbot-map-tiny"))


def test_upcasting_a_rounded_model_warns():
    """The shared session preamble (engine/session_timing.py _open_model): as for LingBot-Map."""
    from engine import build_model
    m = build_model("vggt-tiny")
    assert open_session(_cfg(dtype="bf16"), model=m).poll_events() == []
    events = open_session(_cfg(dtype="fp32"), model=m).poll_events()
    assert [e.kind for e in events] == ["warning"] and "bfloat16" in events[0].message


def test_kv_pool_is_exactly_the_window(model, frames):
    """No pages for a scale stream or non-keyframe steps: pool = sliding_window_num x chunk_size
    pages, all in use once the window is full, and the steady state attends to one run of pages."""
    s = open_session(_cfg(chunk_size=4, overlap=1, sliding_window_num=2), model=model)
    for f in frames[:10]:
        s.push(f)
    kv = s.stats()["kv"]
    assert kv["pages_total"] == 8 and kv["pages_free"] == 0 and kv["pages_scale"] == 0
    assert sorted(s.kv.window_pages) == list(range(8))
    with pytest.raises(EngineError, match="keyframes_only"):
        s.kv.begin_step(1, keyframe=False)
    step = s.kv.table.begin_step(4, keyframe=True)     # the next chunk: evicts 4, reuses them
    assert step.contiguous == (0, 8)                   # one run: SDPA reads a zero-copy view
    s.kv.table.abort_step()
    s.close()


@pytest.mark.parametrize("dense", [True, False])
def test_vggt_cache_layout_through_flashinfer_equals_sdpa(fake_flashinfer, dense):
    """The chunked session's cache layout (frame pages, no specials, no scale stream, keyframes
    only, C-frame steps) through the FlashInfer backend's host logic (a stand-in module whose
    kernels are SDPA over the planned keys) gives the SDPA backend's outputs, chunk after chunk."""
    from engine.kv import PagedKVCache
    from engine.kv.backends import FlashInferBackend
    from tests.engine.test_flashinfer_dense import D, H, L, P

    C, W = 3, 2
    kw = dict(special_tokens=0, scale_frames=0, window=W * C, special_cap=1, max_step_frames=C,
              keyframes_only=True, dtype=torch.float32)
    fi = PagedKVCache(L, H, D, P, backend=FlashInferBackend, **kw)
    fi._attn = FlashInferBackend(fi, dense=dense)
    sd = PagedKVCache(L, H, D, P, backend="sdpa", **kw)
    g = torch.Generator().manual_seed(0)
    for chunk in range(5):
        k, v, q = (torch.randn(L, C, P, H, D, generator=g) for _ in range(3))
        outs = []
        for c in (fi, sd):
            c.begin_step(C, scale=False, keyframe=True)
            o = []
            for layer in range(L):
                c.write(layer, k[layer], v[layer])
                o.append(c.attend(layer, q[layer]))
            c.end_step()
            outs.append(torch.stack(o))
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        # every chunk's visible pages are one run (the pool is exactly the window)
        assert fi._attn.path == ("dense" if dense else "paged") and sd.stats()["zero_copy"]
    assert fi.stats()["pages_total"] == W * C

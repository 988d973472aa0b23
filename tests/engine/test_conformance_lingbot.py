"""Conformance of the LingBot-Map session with the upstream implementation (shared/fixtures).

Full-size architecture, recipe weights (README §2), the stored input tensors pushed through a
real session (fp32, CPU, sdpa, scale 2, window 4 so eviction happens, keyframe interval 1):
pose_enc, depth and depth_conf of every frame must match within 1e-4 absolute. Slow (about two
minutes on 2 CPU threads, ~5 GB RAM) but never skipped.
"""
import numpy as np
import pytest
import torch

from engine import FrameResult, SessionConfig, open_session

pytestmark = pytest.mark.slow
ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    from engine.model_zoo import build_model
    from engine.models.recipe import fill_recipe
    torch.set_num_threads(2)
    m = fill_recipe(build_model("lingbot-map"))
    yield m
    del m


def _fixture(name):
    from tests.conftest import FIXTURES
    path = FIXTURES / name
    if not path.is_file():
        pytest.fail(f"missing fixture {path} (set RECONSTUDIO_SHARED)")
    return np.load(path)


def _run_session(model, fx) -> list[FrameResult]:
    cfg = SessionConfig(engine="lingbot-map", device="cpu", dtype="fp32", backend="sdpa",
                        image_width=int(fx["image_size"]), scale_frames=int(fx["num_scale_frames"]),
                        window=int(fx["kv_cache_sliding_window"]),
                        keyframe_interval=int(fx["keyframe_interval"]),
                        camera_iterations=int(fx["camera_num_iterations"]))
    session = open_session(cfg, model=model)
    results = []
    for img in torch.from_numpy(fx["images"]):
        got = session.push(img)
        results += got
    results += session.flush()
    stats = session.stats()
    session.close()
    return results, stats


@pytest.mark.parametrize("name", ["lingbot_map_stream_it4.npz", "lingbot_map_stream_it1.npz"])
def test_session_matches_upstream(model, name):
    fx = _fixture(name)
    results, stats = _run_session(model, fx)
    S = fx["images"].shape[0]
    assert [r.index for r in results] == list(range(S))
    assert all(r.is_keyframe for r in results)
    pose = np.stack([r.pose_enc for r in results])
    depth = np.stack([r.depth for r in results])
    conf = np.stack([r.conf for r in results])
    for label, got, ref in (("pose_enc", pose, fx["pose_enc"]), ("depth", depth, fx["depth"]),
                            ("depth_conf", conf, fx["depth_conf"])):
        err = np.abs(got - ref).reshape(S, -1).max(axis=1)
        assert got.shape == ref.shape, label
        assert err.max() <= ATOL, f"{label}: max |diff| per frame {np.array2string(err, precision=2)}"
    # the run really evicted: 2 scale + 4 window frames cached, specials of all 12 frames kept
    kv = stats["kv"]
    assert kv["cached_frames"] == 6 and kv["special_frames"] == S and kv["evictions"] == S - 6
    assert stats["camera_cache"]["frames"] == S


def test_scale_phase_debug_arrays(model):
    """Localises a mismatch: DINOv2 tokens of frame 0 and the aggregator camera tokens of the
    2-frame scale phase (one bidirectional batch, no cache)."""
    fx = _fixture("lingbot_map_stream_it4.npz")
    imgs = torch.from_numpy(fx["images"][:2])
    agg = model.aggregator
    with torch.no_grad():
        tokens = agg.patch_embed((imgs - agg._mean) / agg._std)
        out = model(imgs, iterations=4)
    assert np.abs(tokens[0].numpy() - fx["patch_embed_tokens_frame0"]).max() <= ATOL
    assert np.abs(out["camera_features"].numpy() - fx["agg_camera_token"][:2]).max() <= ATOL
    assert np.abs(out["pose_enc_list"].numpy() - fx["pose_enc_list"][:2]).max() <= ATOL


def test_keyframe_interval_2_matches_upstream(model):
    """Keyframe interval 2 (README section 9: upstream's FlashInfer-path cache, fp32 gather mode):
    a non-keyframe does not evict -- once the window is full it sees the 4 window keyframes plus
    itself (frames 9, 11, 13, 15) -- and is rolled back; keyframes evict, then attend."""
    fx = _fixture("lingbot_map_stream_kf2.npz")
    results, stats = _run_session(model, fx)
    S = fx["images"].shape[0]
    assert [r.index for r in results] == list(range(S))
    assert [int(r.is_keyframe) for r in results] == fx["is_keyframe"].tolist()
    for label, key in (("pose_enc", "pose_enc"), ("depth", "depth"), ("depth_conf", "conf")):
        got = np.stack([getattr(r, key) for r in results])
        ref = fx[label]
        err = np.abs(got - ref).reshape(S, -1).max(axis=1)
        assert got.shape == ref.shape, label
        assert err.max() <= ATOL, f"{label}: max |diff| per frame {np.array2string(err, precision=2)}"
    # after frame 15: 2 scale + 4 window pages (keyframes 8-14), specials of the 9 cached frames
    kv = stats["kv"]
    assert kv["cached_frames"] == 6 and kv["special_frames"] == 9
    assert stats["time_index"] == int(fx["time_index"][-1])

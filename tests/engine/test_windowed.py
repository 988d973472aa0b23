"""Windowed mode (engine/windowed.py) for both neural engines and the Sim(3) stitching shared with
the chunked VGGT session: segments and re-alignment events, exports placed by the events,
alignment accuracy on real frames and under outliers."""
import numpy as np
import pytest
import torch

from engine import EngineError, SessionConfig, build_model, open_session
from engine.align import (apply_to_c2w, overlap_correspondences, overlap_similarity, sim3_inverse, sim3_matrix,
                          so3_exp, umeyama)
from engine.geometry import apply_realignments
from engine.models.recipe import fill_recipe
from engine.pose import encode_pose, intrinsics_from_fov
from tests.engine.accuracy import check

H, W = 56, 70


@pytest.fixture(scope="module")
def lingbot():
    return fill_recipe(build_model("lingbot-map-tiny"))


def _frames(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, H, W, generator=g) for _ in range(n)]


def _sim(seed, scale_range=(0.5, 2.0)):
    r = np.random.default_rng(seed)
    return sim3_matrix(r.uniform(*scale_range), so3_exp(r.normal(size=3) * 0.5), r.normal(size=3))


# --- a known scene: the "model" reports it in a different, random similarity frame per chunk ----

K_TRUE = intrinsics_from_fov(0.9, 1.1, H, W)


def _true_c2w(i):
    T = np.eye(4)
    T[:3, :3] = so3_exp(np.array([0.0, 0.03 * i, 0.01 * i]))
    T[:3, 3] = [0.1 * i, 0.02 * np.sin(i), 0.05 * i]
    return T


def _true_depth(c2w):
    """Depth of the plane z = 4 (world) seen by camera c2w (integer pixel centres, engine.geometry)."""
    v, u = np.mgrid[0:H, 0:W]
    d = np.stack(((u - K_TRUE[0, 2]) / K_TRUE[0, 0], (v - K_TRUE[1, 2]) / K_TRUE[1, 1],
                  np.ones((H, W))), -1) @ c2w[:3, :3].T
    return ((4.0 - c2w[2, 3]) / d[..., 2]).astype(np.float32)


def _geometric_model(seed_offset=0):
    """vggt-tiny whose forward_chunk reports the known scene (frame index coded in pixel 0) in the
    frame G_k^-1 of a random similarity G_k chosen by the chunk's first frame."""
    m = build_model("vggt-tiny")

    def forward_chunk(images, **kw):
        idx = [int(round(float(x) * 1000)) for x in images[:, 0, 0, 0]]
        G = _sim(1000 + idx[0] + seed_offset)
        s = np.cbrt(np.linalg.det(G[:3, :3]))
        pe, dep = [], []
        for i in idx:
            c2w = _true_c2w(i)
            pe.append(encode_pose(apply_to_c2w(sim3_inverse(G), c2w), K_TRUE, (H, W), convention="w2c"))
            dep.append(_true_depth(c2w) / s)
        n = len(idx)
        t = lambda a: torch.from_numpy(np.asarray(a, np.float32))
        return {"pose_enc": t(pe), "pose_enc_list": t(pe)[:, None], "depth": t(dep),
                "depth_conf": torch.full((n, H, W), 3.0), "camera_features": torch.zeros(n, 4, 1)}

    m.forward_chunk = forward_chunk
    return m


def _coded_frames(n):
    out = []
    for i in range(n):
        f = torch.full((3, H, W), 0.5)
        f[0, 0, 0] = i / 1000.0
        out.append(f)
    return out


def _world(first_chunk_index=0):
    """The frame every stitched result is expressed in: the first chunk's G^-1."""
    return sim3_inverse(_sim(1000 + first_chunk_index))


def test_chunked_vggt_stitching_recovers_the_scene():
    cfg = SessionConfig(engine="vggt-1b", image_width=W, chunk_size=5, overlap=2, sliding_window_num=2,
                        backend="sdpa")
    s = open_session(cfg, model=_geometric_model())
    res = []
    for f in _coded_frames(14):
        res += s.push(f)
    res += s.flush()
    assert [r.index for r in res] == list(range(14))
    G0 = _world()
    scale0 = np.cbrt(np.linalg.det(G0[:3, :3]))
    for r in res:
        want = apply_to_c2w(G0, _true_c2w(r.index))
        np.testing.assert_allclose(r.c2w, want, atol=1e-4 * max(1.0, np.abs(want).max()))
        np.testing.assert_allclose(r.depth, _true_depth(_true_c2w(r.index)) * scale0, rtol=1e-4)


def test_vggt_windowed_segments_and_aligned_exports():
    cfg = SessionConfig(engine="vggt-1b", mode="windowed", window_size=8, overlap=3, image_width=W,
                        chunk_size=4, sliding_window_num=2, backend="sdpa")
    s = open_session(cfg, model=_geometric_model())
    res = []
    for f in _coded_frames(20):
        res += s.push(f)
    res += s.flush()
    events = s.poll_events()
    assert [r.index for r in res] == list(range(20))
    assert [r.segment for r in res] == [0] * 8 + [1] * 5 + [2] * 5 + [3] * 2
    assert [e.segment for e in events if e.kind == "realign"] == [1, 2, 3]
    assert [e.segment for e in events if e.kind == "segment"] == [1, 2, 3]
    # a window's raw results are in its own frame; the events place them (as the store/exports do)
    G0 = _world()
    raw_err = max(np.abs(r.c2w - apply_to_c2w(G0, _true_c2w(r.index))).max() for r in res if r.segment)
    assert raw_err > 1e-2
    for r in apply_realignments(res, events):
        want = apply_to_c2w(G0, _true_c2w(r.index))
        np.testing.assert_allclose(r.c2w, want, atol=1e-4 * max(1.0, np.abs(want).max()))
    assert s.stats()["segments"] == 4


def test_lingbot_windowed_segments_events_and_restart(lingbot):
    cfg = SessionConfig(engine="lingbot-map", mode="windowed", window_size=6, overlap=2, image_width=W,
                        scale_frames=2, window=3, special_cap=16, backend="sdpa")
    s = open_session(cfg, model=lingbot)
    first_inner = s.inner
    res = []
    for f in _frames(14):
        res += s.push(f)
    res += s.flush()
    assert [r.index for r in res] == list(range(14))
    assert [r.segment for r in res] == [0] * 6 + [1] * 4 + [2] * 4
    ev = s.poll_events()
    realign = [e for e in ev if e.kind == "realign"]
    assert [e.segment for e in realign] == [1, 2]
    for e in realign:
        assert e.transform.shape == (4, 4) and np.linalg.det(e.transform[:3, :3]) > 0
    # each restart closed the previous window's session (its KV cache is gone) and shares the model
    assert first_inner.kv is None and s.inner is not first_inner and s.inner.model is lingbot
    assert s.stats()["kv"]["cached_frames"] <= 2 + 3
    fp = s.stats()["fast_path"]          # the inner session's, plus why restarts cost (engine/fast_path.py)
    assert fp["attention"] == "sdpa" and "restarts every 6 frames" in fp["reason"]
    assert s.stats()["step_graph"]["why_not"] == fp["reason"]      # one decision (engine/fast_path.py)


def test_lingbot_windowed_through_the_reader_thread_equals_pushing_raw_frames(lingbot):
    """The run driver's reader thread prepares frames with the windowed session's prepare_frame
    (its inner sessions' preprocessing); results equal pushing the raw uint8 frames."""
    from engine.run_driver import CollectSink, RunDriver, SequenceSource
    cfg = SessionConfig(engine="lingbot-map", mode="windowed", window_size=6, overlap=2, image_width=W,
                        scale_frames=2, window=3, special_cap=16, backend="sdpa")
    rng = np.random.default_rng(4)
    frames = [rng.integers(0, 256, (48, 60, 3), dtype=np.uint8) for _ in range(11)]
    out = []
    for depth in (0, 3):
        s = open_session(cfg, model=lingbot)
        sink = CollectSink()
        RunDriver(SequenceSource(frames), s, [sink], prefetch=depth).run()
        s.close()
        out.append(sink.results)
    assert [r.index for r in out[0]] == [r.index for r in out[1]] == list(range(11))
    for a, b in zip(*out):
        assert a.segment == b.segment
        np.testing.assert_array_equal(a.pose_enc, b.pose_enc)
        np.testing.assert_array_equal(a.depth, b.depth)


def test_windowed_settings_checked(lingbot):
    with pytest.raises(EngineError, match="overlap"):
        open_session(SessionConfig(engine="lingbot-map", mode="windowed", window_size=4, overlap=4), model=lingbot)
    with pytest.raises(EngineError, match="window_size"):
        open_session(SessionConfig(engine="lingbot-map", mode="windowed", window_size=1, overlap=1), model=lingbot)


# --- Sim(3) stitching accuracy ---------------------------------------------------------------

def _real_views():
    """(c2w, K, depth, conf) of the 6 real frames of the VGGT fixture (its depth and poses)."""
    from engine.pose import decode_pose
    from tests.conftest import FIXTURES
    fx = np.load(FIXTURES / "vggt_offline.npz")
    views = []
    for i in range(6):
        pe = fx["pose_enc"][i].astype(np.float64)
        pe[7:] = np.maximum(pe[7:], 0.6)          # recipe weights give fov 0 on some frames
        c2w, K = decode_pose(pe, fx["depth"][i].shape, convention="w2c")
        views.append((c2w, K, fx["depth"][i], fx["depth_conf"][i]))
    return views


def _moved(views, S):
    s = np.cbrt(np.linalg.det(S[:3, :3]))
    return [(apply_to_c2w(S, c2w), K, (d * s).astype(np.float32), c) for c2w, K, d, c in views]


def _rel_err(S_est, S_true):
    return np.abs(S_est - S_true).max() / np.abs(S_true).max()


def test_overlap_similarity_recovers_a_known_similarity_on_real_frames():
    views = _real_views()[:3]
    for seed in range(3):
        S = _sim(seed)
        est, info = overlap_similarity(_moved(views, S), views)
        check((f"seed {seed} rel. error", _rel_err(est, S), "<", 1e-3))


def test_irls_beats_umeyama_under_outliers():
    views = _real_views()[:3]
    S = _sim(7)
    moved = _moved(views, S)
    rng = np.random.default_rng(0)
    corrupted = []
    for c2w, K, d, c in views:                     # 20 % of the pixels get a wrong depth
        d = d.copy()
        bad = rng.random(d.shape) < 0.2
        d[bad] *= rng.uniform(1.5, 4.0, size=bad.sum()).astype(np.float32)
        corrupted.append((c2w, K, d, c))
    est, info = overlap_similarity(moved, corrupted)
    src, dst, w = overlap_correspondences(moved, corrupted)
    s, R, t = umeyama(src, dst, w)
    plain = sim3_matrix(s, R, t)
    check(("IRLS rel. error", _rel_err(est, S), "<", 1e-3), ("Umeyama / IRLS error", _rel_err(plain, S) / _rel_err(est, S), ">", 10))


def test_cli_windowed_run_exports_the_aligned_trajectory(lingbot, tmp_path):
    """`reconstudio run --mode windowed`: the TUM export holds the poses placed by the realign
    events (what the viewer shows), not the windows' raw poses."""
    import subprocess
    import sys

    from PIL import Image

    from engine import load_checkpoint
    from engine.io.export import read_tum
    rng = np.random.default_rng(0)
    folder = tmp_path / "frames"
    folder.mkdir()
    imgs = [(rng.random((H, W, 3)) * 255).astype(np.uint8) for _ in range(14)]
    for i, img in enumerate(imgs):
        Image.fromarray(img).save(folder / f"{i:04d}.png")
    ck = tmp_path / "tiny.pt"
    torch.save({"model": lingbot.state_dict()}, ck)
    knobs = dict(mode="windowed", window_size=6, overlap=2, image_width=W, scale_frames=2, window=3,
                 special_cap=16, backend="sdpa")
    args = [sys.executable, "-m", "app.cli", "run", str(folder), "--engine", "lingbot-map", "--model",
            "lingbot-map-tiny", "--checkpoint", str(ck), "--trajectory", str(tmp_path / "traj.txt"),
            "--session-dir", str(tmp_path / "session")]
    for k, v in knobs.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    _, exported = read_tum(tmp_path / "traj.txt")
    model = build_model("lingbot-map-tiny")
    load_checkpoint(model, ck)
    s = open_session(SessionConfig(engine="lingbot-map", **knobs), model=model)
    out = [r for img in imgs for r in s.push(img)] + s.flush()
    aligned = np.stack([r.c2w for r in sorted(apply_realignments(out, s.poll_events()), key=lambda r: r.index)])
    raw = np.stack([r.c2w for r in out])
    np.testing.assert_allclose(exported, aligned, atol=1e-6)
    assert np.abs(exported - raw).max() > 1e-2          # the later windows really were moved


def test_overlapping_windows_of_a_real_sequence_with_ground_truth():
    """7-Scenes frames 16-19 (Kinect depth, KinectFusion poses) seen by two windows: one in the
    ground-truth frame, the other in a known similarity frame, each with its own 0.5 % depth noise
    (about the Kinect's at 2 m). The IRLS alignment recovers the similarity to 1e-3 relative
    (observed 3-6e-4 over seeds; at 1 % noise 0.8-1.5e-3: errors in both point sets bias the scale)."""
    from PIL import Image

    from engine.io.export import read_tum
    from tests.conftest import DATA
    seq = DATA / "7scenes_redkitchen_150_199"
    if not seq.is_dir():
        pytest.fail(f"missing {seq} (set RECONSTUDIO_SHARED)")
    _, gt = read_tum(seq / "groundtruth.txt")
    K = np.array([[585.0, 0, 320], [0, 585.0, 240], [0, 0, 1]])        # the depth camera
    rng = np.random.default_rng(3)
    S_true = _sim(11)
    s_true = np.cbrt(np.linalg.det(S_true[:3, :3]))
    prev, new = [], []
    for i in range(16, 20):
        depth = np.asarray(Image.open(seq / "depth" / f"{150 + i:06d}.png"), dtype=np.float32) / 1000.0
        conf = np.where(depth > 0, 3.0, 1.0).astype(np.float32)
        noisy = lambda d: (d * (1 + 0.005 * rng.standard_normal(d.shape))).astype(np.float32)
        prev.append((gt[i], K, noisy(depth), conf))
        new.append((apply_to_c2w(sim3_inverse(S_true), gt[i]), K, noisy(depth) / np.float32(s_true), conf))
    est, info = overlap_similarity(prev, new)
    check(("rel. error", _rel_err(est, S_true), "<", 1e-3))

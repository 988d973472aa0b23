"""Back-projection, re-alignment and the PLY / NPZ / TUM exporters (round trips, atomic writes)."""
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from engine.api import EngineError, EngineEvent, FrameResult
from engine.geometry import apply_realignments, apply_similarity, backproject, collect_points
from engine.io.atomic import atomic_open
from engine.io.export import (ExportError, export_npz, export_ply, export_session, export_tum,
                              read_tum)

K = np.array([[100.0, 0, 31.5], [0, 110.0, 23.5], [0, 0, 1]])


def _pose(rng):
    c2w = np.eye(4)
    c2w[:3, :3] = Rotation.from_rotvec(rng.normal(size=3)).as_matrix()
    c2w[:3, 3] = rng.normal(size=3)
    return c2w


def _results(n=4, h=48, w=64, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append(FrameResult(
            index=i, timestamp=0.5 * i + 0.25, is_keyframe=(i % 2 == 0), c2w=_pose(rng), K=K.copy(),
            image=rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
            depth=rng.uniform(0.5, 4.0, (h, w)).astype(np.float32),
            conf=rng.uniform(1.0, 3.0, (h, w)).astype(np.float32), segment=i // 2))
    return out


# --- geometry -----------------------------------------------------------------------------------

def test_backproject_reprojects_to_its_pixels():
    rng = np.random.default_rng(1)
    depth = rng.uniform(1, 5, (48, 64)).astype(np.float32)
    c2w = _pose(rng)
    pts, mask = backproject(depth, K, c2w)
    assert pts.shape == (48 * 64, 3) and pts.dtype == np.float32 and mask.all()
    w2c = np.linalg.inv(c2w)
    cam = pts.astype(np.float64) @ w2c[:3, :3].T + w2c[:3, 3]
    np.testing.assert_allclose(cam[:, 2], depth.ravel(), rtol=1e-5)
    uv = cam @ K.T
    uv = uv[:, :2] / uv[:, 2:]
    vs, us = np.nonzero(mask)
    np.testing.assert_allclose(uv, np.stack([us, vs], 1), atol=1e-3)


def test_backproject_stride_conf_and_invalid_depth():
    depth = np.full((10, 12), 2.0, np.float32)
    depth[0, 0] = 0.0            # no depth
    depth[2, 2] = np.nan
    conf = np.ones_like(depth)
    conf[4, 4] = 0.1
    pts, mask = backproject(depth, K, np.eye(4), stride=2, conf=conf, conf_threshold=0.5)
    # stride 2 → 5 x 6 grid = 30 pixels, minus the 3 bad ones, all on the grid
    assert len(pts) == 27 and mask.sum() == 27
    assert not mask[1::2].any() and not mask[:, 1::2].any()
    assert not mask[0, 0] and not mask[2, 2] and not mask[4, 4]
    assert backproject(depth, K, np.eye(4), stride=1)[0].shape == (118, 3)


def test_collect_points_colours_follow_the_mask():
    rs = _results(2)
    pts, cols, conf = collect_points(rs, conf_threshold=2.0, stride=3)
    p0, m0 = backproject(rs[0].depth, K, rs[0].c2w, 3, rs[0].conf, 2.0)
    p1, m1 = backproject(rs[1].depth, K, rs[1].c2w, 3, rs[1].conf, 2.0)
    assert len(pts) == len(p0) + len(p1) < 2 * 16 * 22
    np.testing.assert_array_equal(cols, np.concatenate([rs[0].image[m0], rs[1].image[m1]]))
    np.testing.assert_array_equal(conf, np.concatenate([rs[0].conf[m0], rs[1].conf[m1]]))
    assert conf.min() >= 2.0 and cols.dtype == np.uint8 and conf.dtype == np.float32


def test_similarity_moves_points_exactly():
    r = _results(1)[0]
    T = np.eye(4)
    T[:3, :3] = 1.7 * Rotation.from_rotvec([0.1, -0.4, 0.3]).as_matrix()
    T[:3, 3] = [1, -2, 0.5]
    before, _ = backproject(r.depth, r.K, r.c2w)
    moved = apply_similarity(r, T)
    after, _ = backproject(moved.depth, moved.K, moved.c2w)
    expect = before.astype(np.float64) @ T[:3, :3].T + T[:3, 3]
    np.testing.assert_allclose(after, expect, rtol=1e-5, atol=1e-5)
    R = moved.c2w[:3, :3]
    np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-9)      # pose stays rigid


def test_realign_applies_latest_transform_to_its_segment_only():
    rs = _results(4)            # segments 0, 0, 1, 1
    T1 = np.diag([2.0, 2.0, 2.0, 1.0])
    T2 = np.eye(4)
    T2[:3, 3] = [5, 0, 0]
    ev = [EngineEvent("info", message="x"), EngineEvent("realign", 1, T1), EngineEvent("realign", 1, T2)]
    out = apply_realignments(rs, ev)
    for a, b in zip(rs[:2], out[:2]):
        assert a is b
    for a, b in zip(rs[2:], out[2:]):
        np.testing.assert_allclose(b.c2w[:3, 3], a.c2w[:3, 3] + [5, 0, 0])
        np.testing.assert_array_equal(b.depth, a.depth)


# --- exporters ----------------------------------------------------------------------------------

def test_ply_round_trip(tmp_path):
    from plyfile import PlyData
    pts, cols, conf = collect_points(_results(3), 1.5, 2)
    path = tmp_path / "cloud.ply"
    assert export_ply(path, pts, cols, conf) == len(pts)
    ply = PlyData.read(str(path))
    assert ply.text is False and ply.byte_order == "<"
    v = ply["vertex"].data
    assert [p.name for p in ply["vertex"].properties] == ["x", "y", "z", "red", "green", "blue", "confidence"]
    np.testing.assert_array_equal(np.stack([v["x"], v["y"], v["z"]], 1), pts)
    np.testing.assert_array_equal(np.stack([v["red"], v["green"], v["blue"]], 1), cols)
    np.testing.assert_array_equal(v["confidence"], conf)
    assert v["x"].dtype == np.float32 and v["red"].dtype == np.uint8


def test_ply_rejects_mismatched_arrays(tmp_path):
    with pytest.raises(ExportError, match="3 points but 2 colours"):
        export_ply(tmp_path / "x.ply", np.zeros((3, 3)), np.zeros((2, 3)))
    assert not (tmp_path / "x.ply").exists()


def test_npz_shapes_and_dtypes(tmp_path):
    rs = _results(4)
    pts, cols, _ = collect_points(rs, 0.0, 4)
    export_npz(tmp_path / "run.npz", rs, pts, cols)
    z = np.load(tmp_path / "run.npz", allow_pickle=False)
    expect = {"c2w": ((4, 4, 4), np.float64), "K": ((4, 3, 3), np.float64), "timestamps": ((4,), np.float64),
              "depth": ((4, 48, 64), np.float32), "conf": ((4, 48, 64), np.float32),
              "points": ((len(pts), 3), np.float32), "colors": ((len(pts), 3), np.uint8),
              "index": ((4,), np.int64), "is_keyframe": ((4,), np.bool_), "segment": ((4,), np.int64),
              "images": ((4, 48, 64, 3), np.uint8)}
    for name, (shape, dtype) in expect.items():
        assert z[name].shape == shape and z[name].dtype == dtype, name
    np.testing.assert_array_equal(z["timestamps"], [0.25, 0.75, 1.25, 1.75])
    np.testing.assert_array_equal(z["is_keyframe"], [True, False, True, False])
    np.testing.assert_array_equal(z["points"], pts)


def test_npz_frames_without_depth_are_zero_filled(tmp_path):
    rs = _results(3)
    rs[1].depth = rs[1].conf = None
    export_npz(tmp_path / "z.npz", rs)
    z = np.load(tmp_path / "z.npz")
    assert z["depth"].shape == (3, 48, 64) and z["conf"].shape == (3, 48, 64)
    np.testing.assert_array_equal(z["has_depth"], [True, False, True])
    assert not z["depth"][1].any() and not z["conf"][1].any()
    np.testing.assert_array_equal(z["depth"][2], rs[2].depth)
    assert z["points"].shape == (0, 3) and z["colors"].dtype == np.uint8


def test_tum_one_line_per_frame_and_round_trip(tmp_path):
    rs = _results(5)
    path = tmp_path / "traj.txt"
    assert export_tum(path, rs) == 5
    lines = path.read_text().splitlines()
    assert len(lines) == 5 and all(len(line.split()) == 8 for line in lines)
    t, c2w = read_tum(path)
    np.testing.assert_allclose(t, [r.timestamp for r in rs], atol=1e-6)
    for r, p in zip(rs, c2w):
        np.testing.assert_allclose(p, r.c2w, atol=1e-7)
    q = np.array([line.split()[4:] for line in lines], float)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-8)


def test_export_session_applies_realign_and_filters(tmp_path):
    rs = _results(4)
    T = np.eye(4)
    T[:3, 3] = [0, 0, 10]
    out = export_session(rs, [EngineEvent("realign", 1, T)], ply=tmp_path / "a.ply",
                         npz=tmp_path / "a.npz", trajectory=tmp_path / "a.txt", conf_threshold=2.0, stride=2)
    z = np.load(tmp_path / "a.npz")
    assert out["frames"] == 4 and out["points"] == len(z["points"])
    np.testing.assert_allclose(z["c2w"][2:, 2, 3], [r.c2w[2, 3] + 10 for r in rs[2:]])
    np.testing.assert_allclose(z["c2w"][:2], [r.c2w for r in rs[:2]])
    _, c2w = read_tum(tmp_path / "a.txt")
    np.testing.assert_allclose(c2w[:, :3, 3], z["c2w"][:, :3, 3], atol=1e-7)
    filtered, _, conf = collect_points(apply_realignments(rs, [EngineEvent("realign", 1, T)]), 2.0, 2)
    np.testing.assert_array_equal(z["points"], filtered)
    assert conf.min() >= 2.0


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(path, "w") as f:
            f.write("half of the new cont")
            raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]     # no temp file left behind


def test_export_to_unwritable_place_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(EngineError, match="Cannot write"):
        export_tum(blocker / "sub" / "t.txt", _results(1))


def test_camera_frustum_corners_project_to_the_image_corners():
    from scipy.spatial.transform import Rotation

    from engine.geometry import camera_frustum

    K = np.array([[500.0, 0, 319.5], [0, 480.0, 239.5], [0, 0, 1]])
    c2w = np.eye(4)
    c2w[:3, :3] = Rotation.from_euler("xyz", [10, -20, 5], degrees=True).as_matrix()
    c2w[:3, 3] = [0.3, -1.0, 2.0]
    fr, look = camera_frustum(K, c2w, 640, 480, near=0.5, look_depth=3.0)
    assert fr.shape == (5, 3) and fr.dtype == np.float32
    np.testing.assert_allclose(fr[0], c2w[:3, 3], atol=1e-6)
    w2c = np.linalg.inv(c2w)
    cam = fr[1:].astype(np.float64) @ w2c[:3, :3].T + w2c[:3, 3]
    np.testing.assert_allclose(cam[:, 2], 0.5, atol=1e-5)                 # on the near plane
    uv = (cam @ K.T)[:, :2] / cam[:, 2:]
    np.testing.assert_allclose(uv, [[0, 0], [639, 0], [639, 479], [0, 479]], atol=1e-3)
    look_cam = w2c[:3, :3] @ look + w2c[:3, 3]
    np.testing.assert_allclose(look_cam, [0, 0, 3.0], atol=1e-6)          # on the optical axis

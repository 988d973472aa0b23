"""Exports for other tools (issue #28): nerfstudio transforms.json (checked against nerfstudio's
documented schema), OBJ with vertex colours, the rerun .rrd (read back with the rerun SDK) and the
video's camera geometry; all through export_results and the CLI. The rendered MP4 (vispy) is
tested in tests/ui/test_video_export.py."""
import json
from pathlib import Path

import numpy as np
import pytest

from engine.api import SessionConfig
from engine.geometry import collect_points
from engine.io.export import export_results
from engine.io.store import SessionStore
from tests.engine.factories import random_results

REPO = Path(__file__).resolve().parents[2]


def _results(n=5, h=48, w=64, seed=0):
    return random_results(n=n, h=h, w=w, seed=seed)


# nerfstudio's documented transforms.json (docs.nerf.studio, "Data conventions"): intrinsics at
# the top when shared, per frame otherwise; frames[] with file_path and a 4x4 camera-to-world
# transform_matrix in OpenGL camera axes; optional ply_file_path
NS_CAMERA_MODELS = {"OPENCV", "OPENCV_FISHEYE", "PINHOLE", "SIMPLE_PINHOLE"}
NS_INTRINSICS = {"fl_x": float, "fl_y": float, "cx": float, "cy": float, "w": int, "h": int}


def _check_nerfstudio_schema(folder: Path) -> dict:
    meta = json.loads((folder / "transforms.json").read_text())
    assert meta["camera_model"] in NS_CAMERA_MODELS
    for key in ("k1", "k2", "p1", "p2"):
        assert isinstance(meta.get(key, 0.0), float)
    assert isinstance(meta["frames"], list) and meta["frames"]
    for fr in meta["frames"]:
        for key, typ in NS_INTRINSICS.items():      # at the top or in the frame
            v = fr.get(key, meta.get(key))
            assert isinstance(v, typ) and not isinstance(v, bool), key
        M = np.asarray(fr["transform_matrix"], np.float64)
        assert M.shape == (4, 4)
        np.testing.assert_allclose(M[3], [0, 0, 0, 1])
        np.testing.assert_allclose(M[:3, :3] @ M[:3, :3].T, np.eye(3), atol=1e-9)
        assert np.linalg.det(M[:3, :3]) == pytest.approx(1.0)
        path = folder / fr["file_path"]               # relative to the data folder
        assert not Path(fr["file_path"]).is_absolute() and path.is_file()
    if "ply_file_path" in meta:
        assert (folder / meta["ply_file_path"]).is_file()
    if "applied_transform" in meta:
        assert np.asarray(meta["applied_transform"]).shape == (3, 4)
    return meta


def test_nerfstudio_transforms_follow_the_schema_and_the_pixels(tmp_path):
    import cv2
    from plyfile import PlyData

    rs = _results()
    out = export_results(rs, {"nerfstudio": tmp_path / "ns"}, conf_threshold=5.0, stride=2)
    meta = _check_nerfstudio_schema(tmp_path / "ns")
    assert len(meta["frames"]) == len(rs)
    assert (meta["w"], meta["h"]) == (64, 48)
    img = cv2.imread(str(tmp_path / "ns" / meta["frames"][0]["file_path"]))
    assert img.shape[:2] == (meta["h"], meta["w"])
    # a pixel's world point, seen through nerfstudio's camera (OpenGL axes, pixel centres at +0.5),
    # lands on that pixel
    W = np.asarray(meta["applied_transform"])[:, :3]
    for r, fr in zip(rs, meta["frames"]):
        if r.depth is None:
            continue
        M = np.asarray(fr["transform_matrix"])
        for v, u in ((5, 7), (30, 50), (47, 0)):
            d = r.depth[v, u]
            ray = np.linalg.inv(r.K) @ np.array([u, v, 1.0])
            X = r.c2w[:3, :3] @ (ray * d) + r.c2w[:3, 3]
            x, y, z = (np.linalg.inv(M) @ np.append(W @ X, 1.0))[:3]
            assert z < 0                                         # in front: looking down -z
            un = meta["fl_x"] * x / -z + meta["cx"]
            vn = meta["fl_y"] * -y / -z + meta["cy"]
            np.testing.assert_allclose([un, vn], [u + 0.5, v + 0.5], atol=1e-6)
    # the points: the export's, in nerfstudio's world
    pts, cols, _ = collect_points(rs, 5.0, 2)
    ply = PlyData.read(str(tmp_path / "ns" / meta["ply_file_path"]))["vertex"]
    assert len(ply) == out["points"] == len(pts)
    xyz = np.column_stack([ply["x"], ply["y"], ply["z"]])
    np.testing.assert_allclose(xyz, pts @ W.T, atol=1e-5)
    np.testing.assert_array_equal(np.column_stack([ply["red"], ply["green"], ply["blue"]]), cols)


def test_obj_vertices_carry_colours(tmp_path):
    rs = _results()
    out = export_results(rs, {"obj": tmp_path / "a.obj"}, conf_threshold=5.0, stride=3)
    rows = [l.split() for l in (tmp_path / "a.obj").read_text().splitlines() if l.startswith("v ")]
    assert len(rows) == out["points"] > 0 and all(len(r) == 7 for r in rows)
    v = np.array([[float(x) for x in r[1:]] for r in rows])
    pts, cols, _ = collect_points(rs, 5.0, 3)
    np.testing.assert_allclose(v[:, :3], pts * [1, -1, -1], rtol=1e-5, atol=1e-5)   # upright: y, z negated
    np.testing.assert_allclose(v[:, 3:], cols / 255.0, atol=6e-5)


def test_rrd_reads_back_with_every_camera(tmp_path):
    from rerun.chunk import RrdReader

    from engine.io.rrd import read_cameras

    rs = _results(n=6)
    out = export_results(rs, {"rrd": tmp_path / "s.rrd"}, conf_threshold=5.0, stride=2)
    cams = read_cameras(tmp_path / "s.rrd")
    assert sorted(cams) == [r.index for r in rs]
    for r in rs:
        t, K = cams[r.index]
        np.testing.assert_allclose(t, r.c2w[:3, 3], atol=1e-9)
        np.testing.assert_allclose(K, r.K, atol=1e-4)
    # images on every frame, depth where the session has it, the points of each frame
    rows = {}
    for chunk in RrdReader(str(tmp_path / "s.rrd")).store().stream().to_chunks():
        if not chunk.is_static:
            b = chunk.to_record_batch()
            rows.setdefault(chunk.entity_path, set()).update(b.column("frame").to_pylist())
    assert rows["/world/camera/image"] == {r.index for r in rs}
    assert rows["/world/camera/depth"] == {r.index for r in rs if r.depth is not None}
    assert rows["/world/points"] == {r.index for r in rs}
    assert out["points"] > 0


def test_video_geometry_maps_pixels_and_orbits_the_scene():
    """The video's camera math, without drawing: a pixel's world point goes to that pixel's NDC
    under clip_matrix (also after fitting K to another frame size), and an orbit looks at the
    cloud from a circle around it."""
    from engine.io.video import clip_matrix, fit_intrinsics, orbit_poses, parse_size

    r = _results(n=1)[0]
    for W, H in ((64, 48), (128, 72)):
        K = fit_intrinsics(r.K, (48, 64), (W, H))
        for u, v in ((0, 0), (63, 47), (20, 30)):
            d = r.depth[v, u]
            X = r.c2w[:3, :3] @ (np.linalg.inv(r.K) @ np.array([u, v, 1.0]) * d) + r.c2w[:3, 3]
            c = clip_matrix(r.c2w, K, W, H, 0.01, 100.0) @ np.append(X, 1.0)
            ndc = c[:3] / c[3]
            # pixel (u, v) at 48 px high is pixel (u s + offset, v s) at H px high
            s = H / 48
            us, vs = (u + 0.5) * s + (W - 64 * s) / 2, (v + 0.5) * s
            np.testing.assert_allclose(ndc[:2], [2 * us / W - 1, 1 - 2 * vs / H], atol=1e-9)
            assert -1 < ndc[2] < 1
    pts = np.random.default_rng(0).normal(size=(500, 3)) + [5, 0, 0]
    poses = orbit_poses(pts, np.zeros((2, 3)), np.array([0, -1.0, 0]), 12)
    centre = pts.mean(0)
    dist = [np.linalg.norm(p[:3, 3] - centre) for p in poses]
    assert max(dist) - min(dist) < 0.2 * np.mean(dist)            # a circle around the cloud
    for p in poses:                                                # looking at it, upright
        look = (centre - p[:3, 3]) / np.linalg.norm(centre - p[:3, 3])
        assert p[:3, 2] @ look > 0.99 and p[:3, 1] @ np.array([0, -1.0, 0]) < 0
    assert parse_size("1281x719") == (1282, 720)
    with pytest.raises(ValueError):
        parse_size("huge")
    with pytest.raises(Exception, match="renderer"):
        export_results(_results(), {"video": "/tmp/never.mp4"})


def test_cli_share_exports_from_a_session_and_bad_flags(tmp_path, capsys):
    from app.cli import main

    rs = _results()
    with SessionStore(tmp_path / "s", SessionConfig(), "synthetic") as store:
        for r in rs:
            store.write(r)
    rc = main(["run", str(tmp_path / "s"), "--nerfstudio", str(tmp_path / "ns"), "--obj", str(tmp_path / "a.obj"),
               "--rrd", str(tmp_path / "a.rrd"), "--quiet"])
    assert rc == 0
    _check_nerfstudio_schema(tmp_path / "ns")
    for name in ("a.obj", "a.rrd"):
        assert (tmp_path / name).stat().st_size > 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "s"), "--video", str(tmp_path / "b.mp4"), "--video-size", "big"]) == 2
    assert "--video-size" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "s"), "--nerfstudio", str(tmp_path / "a.obj")]) == 2   # a file, not a folder
    assert not (tmp_path / "b.mp4").exists()


def test_cli_run_input_writes_the_new_exports(tmp_path):
    from app.cli import main

    clip = REPO / "resources" / "sample" / "icl_livingroom_kt3.mp4"
    rc = main(["run", str(clip), "--engine", "synthetic", "--max-frames", "4", "--session-dir", str(tmp_path / "s"),
               "--nerfstudio", str(tmp_path / "ns"), "--obj", str(tmp_path / "a.obj"), "--quiet"])
    assert rc == 0
    meta = _check_nerfstudio_schema(tmp_path / "ns")
    assert len(meta["frames"]) == 4
    assert (tmp_path / "a.obj").read_text().count("\nv ") > 100


def test_a_dead_video_writers_temp_file_is_removed(tmp_path):
    from engine.io.export import _clean_leftovers

    dead = tmp_path / ".v.mp4.999999999-video.tmp.mp4"      # no such process
    live = tmp_path / f".v.mp4.{__import__('os').getpid()}-video.tmp.mp4"
    other = tmp_path / ".w.mp4.999999999-video.tmp.mp4"
    for p in (dead, live, other):
        p.write_bytes(b"x")
    _clean_leftovers("video", tmp_path / "v.mp4")
    assert not dead.exists() and live.exists() and other.exists()

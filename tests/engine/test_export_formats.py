"""COLMAP and GLB exports and the one export function (engine.io.export.export_results):
the files load in pycolmap / trimesh and say what the results say (poses, pixels, points)."""
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from engine.api import EngineEvent, FrameResult
from engine.geometry import apply_realignments, collect_points
from engine.io.colmap import w2c_qvec_tvec
from engine.io.export import (EXPORT_FORMATS, ExportError, export_results, plan_export, read_tum,
                              stored_stride)
from engine.io.store import SessionStore, load_session
from tests.engine.factories import TEST_K, random_results

pycolmap = pytest.importorskip("pycolmap")
trimesh = pytest.importorskip("trimesh")

REPO = Path(__file__).resolve().parents[2]
K = TEST_K


def _results(n=5, h=48, w=64, seed=0):
    return random_results(n=n, h=h, w=w, seed=seed)


def test_w2c_quaternion_is_colmap_convention():
    c2w = np.eye(4)
    c2w[:3, :3] = Rotation.from_euler("xyz", [10, -20, 30], degrees=True).as_matrix()
    c2w[:3, 3] = [1, 2, 3]
    q, t = w2c_qvec_tvec(c2w)
    R = Rotation.from_quat([q[1], q[2], q[3], q[0]]).as_matrix()      # qw first in COLMAP
    np.testing.assert_allclose(R, c2w[:3, :3].T, atol=1e-12)
    np.testing.assert_allclose(t, -c2w[:3, :3].T @ c2w[:3, 3], atol=1e-12)
    assert q[0] >= 0


def test_colmap_model_loads_in_pycolmap_and_reprojects(tmp_path):
    rs = _results()
    T = np.diag([2.0, 2.0, 2.0, 1.0])
    T[:3, 3] = [0.5, 0, 0]
    events = [EngineEvent("realign", 1, T)]
    out = export_results(rs, {"colmap": tmp_path / "model"}, events, conf_threshold=5.0, stride=2)
    rec = pycolmap.Reconstruction(str(tmp_path / "model" / "sparse" / "0"))
    assert len(rec.images) == len(rs) and rec.num_reg_images() == len(rs)
    assert len(rec.cameras) == 1
    cam = next(iter(rec.cameras.values()))
    assert cam.model_name == "PINHOLE" and (cam.width, cam.height) == (64, 48)
    np.testing.assert_allclose(cam.params, [60.0, 62.0, 32.0, 24.0])   # +0.5: COLMAP pixel centres
    aligned = apply_realignments(rs, events)
    pts, _, _ = collect_points(aligned, 5.0, 2)
    assert out["points"] == len(pts) > 0
    # COLMAP holds the points two or more frames see, every one with its track
    model = out["colmap"]
    assert 0 < len(rec.points3D) == model["points"] < len(pts)
    tracks = [p.track.length() for p in rec.points3D.values()]
    assert min(tracks) >= 2 and sum(tracks) == model["observations"]
    assert np.mean(tracks) == pytest.approx(model["mean_track_length"])
    header = (tmp_path / "model" / "sparse" / "0" / "points3D.txt").read_text().splitlines()[2]
    assert header == f"# Number of points: {model['points']}, mean track length: {np.mean(tracks):.4f}"
    by_name = {im.name: im for im in rec.images.values()}
    ids_by_index = {}
    for r in aligned:
        im = by_name[f"{r.index:06d}.jpg"]
        assert (tmp_path / "model" / "images" / im.name).is_file()
        np.testing.assert_allclose(im.projection_center(), r.c2w[:3, 3], atol=1e-6)
        obs = [p for p in im.points2D if p.has_point3D()]
        ids_by_index[r.index] = {p.point3D_id for p in obs}
        for p2 in obs:                         # each 3D point projects onto its observation
            xyz = rec.points3D[p2.point3D_id].xyz
            np.testing.assert_allclose(im.project_point(xyz), p2.xy, atol=0.01)
            # in front of the camera, where that frame's own depth (if any) puts a surface
            z = (np.linalg.inv(r.c2w) @ np.append(xyz, 1.0))[2]
            assert z > 0
    # a frame without depth still observes the points of its neighbours
    assert len(ids_by_index[3]) > 0
    # an observation in a frame with depth agrees with that depth (within the tolerance)
    from engine.io.tracks import DEPTH_TOLERANCE
    r = aligned[2]
    im = by_name[f"{r.index:06d}.jpg"]
    for p2 in [p for p in im.points2D if p.has_point3D()][:200]:
        xyz = rec.points3D[p2.point3D_id].xyz
        z = (np.linalg.inv(r.c2w) @ np.append(xyz, 1.0))[2]
        u, v = np.floor(p2.xy).astype(int)           # COLMAP pixel (x, y) -> row v, column u
        cell = r.depth[max(0, v - 6):v + 6, max(0, u - 6):u + 6]
        assert z >= cell.min() * (1 - DEPTH_TOLERANCE) - 1e-6


def test_glb_has_cloud_trajectory_and_frustums(tmp_path):
    rs = _results()
    out = export_results(rs, {"glb": tmp_path / "scene.glb"}, stride=4)
    scene = trimesh.load(tmp_path / "scene.glb")
    geoms = scene.geometry
    assert isinstance(geoms["points"], trimesh.PointCloud)
    assert len(geoms["points"].vertices) == out["points"]
    traj = geoms["trajectory"]
    assert len(traj.vertices) == 2 * (len(rs) - 1)      # one line segment per step
    # glTF is y-up: y and z flipped against our OpenCV axes
    centres = np.array([r.c2w[:3, 3] for r in rs]) * [1, -1, -1]
    np.testing.assert_allclose(np.unique(traj.vertices, axis=0), np.unique(centres, axis=0), atol=1e-5)
    assert "frustums_keyframes" in geoms and "frustums" in geoms
    thumbs = sorted(k for k in geoms if k.startswith("thumbnail_"))
    assert len(thumbs) == sum(r.is_keyframe for r in rs) == 3           # one textured quad per keyframe
    q = geoms[thumbs[0]]
    assert len(q.faces) == 2 and q.visual.material.baseColorTexture.size == (64, 48)
    # colours survive
    pts, cols, _ = collect_points(rs, 0.0, 4)
    np.testing.assert_array_equal(np.asarray(geoms["points"].colors)[:, :3], cols)
    out = export_results(rs, {"glb": tmp_path / "bare.glb"}, stride=4, frustums=False)
    assert not any(k.startswith("frustums") for k in trimesh.load(tmp_path / "bare.glb").geometry)


def test_one_function_all_formats_and_options(tmp_path):
    rs = _results()
    outs = {"ply": tmp_path / "a.ply", "npz": tmp_path / "a.npz", "tum": tmp_path / "a.txt",
            "colmap": tmp_path / "c", "glb": tmp_path / "a.glb"}
    # the formats for other tools (nerfstudio, OBJ, RRD, video): tests/engine/test_export_share.py
    assert set(outs) | {"nerfstudio", "obj", "rrd", "video"} == set(EXPORT_FORMATS)
    out = export_results(rs, outs, conf_threshold=3.0, stride=2, until=2)
    assert out["frames"] == 3 and len(out["files"]) == 5
    assert len(read_tum(tmp_path / "a.txt")[0]) == 3
    z = np.load(tmp_path / "a.npz")
    assert list(z["image_size"]) == [48, 64] and len(z["K"]) == 3 and len(z["points"]) == out["points"]
    kf = export_results(rs, {"tum": tmp_path / "k.txt"}, keyframes_only=True)
    assert kf["frames"] == 3 and len(read_tum(tmp_path / "k.txt")[0]) == 3
    with pytest.raises(ExportError, match="unknown export format"):
        export_results(rs, {"fbx": tmp_path / "x.fbx"})
    with pytest.raises(ExportError, match="no frames"):
        export_results(rs, {"ply": tmp_path / "x.ply"}, until=-1)


def test_almost_nothing_is_flagged_before_writing(tmp_path):
    rs = _results()
    plan = plan_export(rs, conf_threshold=9.9, stride=1)
    assert plan["points"] < 0.05 * plan["points_total"] and "keeps only" in plan["warning"]
    assert plan_export(rs, conf_threshold=0.0)["warning"] is None
    assert not (tmp_path / "x.ply").exists()          # planning writes nothing


def test_stride_means_result_pixels_for_smaller_stores():
    rs = _results(h=48, w=64)
    assert stored_stride(rs, 4) == 4                    # stored at result resolution
    assert stored_stride(rs, 4, result_width=128) == 2  # stored at half the result width
    assert stored_stride(rs, 1, result_width=640) == 1


def test_icl_colmap_export_loads_with_every_image_and_point(tmp_path):
    """The sample clip through the geometric engine and the session store, then COLMAP + GLB."""
    from engine.api import SessionConfig, open_session
    from engine.intrinsics import attach_found_intrinsics
    from engine.io.sources import open_source

    clip = REPO / "resources" / "sample" / "icl_livingroom_kt3.mp4"
    src = open_source(str(clip))
    cfg = SessionConfig(engine="geometric")
    attach_found_intrinsics(cfg, str(clip))
    session = open_session(cfg)
    store = SessionStore(tmp_path / "s", cfg, src.name)
    try:
        for _ in range(200):
            f = src.read()
            if f is None:
                break
            for r in session.push(f.image, f.timestamp):
                store.write(r)
        for r in session.flush():
            store.write(r)
    finally:
        session.close()
        store.close()
        src.close()
    loaded = load_session(tmp_path / "s")
    out = export_results(loaded, {"colmap": tmp_path / "m", "glb": tmp_path / "m.glb"}, stride=2)
    rec = pycolmap.Reconstruction(str(tmp_path / "m" / "sparse" / "0"))
    assert rec.num_reg_images() == len(loaded.results) == out["frames"]
    # issue #28's targets: real tracks, and observations in nearly every image (the geometric
    # engine has depth on a few keyframes only: the other frames observe their points)
    assert out["points"] > 10_000 and 0.8 * out["points"] < len(rec.points3D) <= out["points"]
    tracks = np.array([p.track.length() for p in rec.points3D.values()])
    assert tracks.min() >= 2 and tracks.mean() >= 3
    per_image = np.array([im.num_points3D for im in rec.images.values()])
    assert np.mean(per_image >= 100) >= 0.95
    assert sum(r.depth is not None for r in loaded.results) < 0.2 * len(loaded.results)
    rec.update_point_3d_errors()                       # recomputed, not the file's error column
    assert rec.compute_mean_reprojection_error() < 0.01
    # COLMAP's bundle adjuster runs on the model: with the points disturbed it brings the
    # reprojection error back under a pixel (the tracks tie every point to its frames)
    rng = np.random.default_rng(0)
    for p in rec.points3D.values():
        p.xyz = p.xyz + rng.normal(0, 0.01, 3)
    rec.update_point_3d_errors()
    disturbed = rec.compute_mean_reprojection_error()
    opts = pycolmap.BundleAdjustmentOptions()
    opts.ceres.solver_options.max_num_iterations = 20
    opts.print_summary = False
    pycolmap.bundle_adjustment(rec, opts)
    rec.update_point_3d_errors()
    assert disturbed > 3.0 and rec.compute_mean_reprojection_error() <= 1.0
    scene = trimesh.load(tmp_path / "m.glb")
    assert len(scene.geometry["points"].vertices) == out["points"]
    assert len(scene.geometry["trajectory"].vertices) == 2 * (len(loaded.results) - 1)


def test_cli_writes_colmap_and_glb_from_a_saved_session(tmp_path, capsys):
    from app.cli import main
    from engine.api import SessionConfig

    rs = _results()
    with SessionStore(tmp_path / "s", SessionConfig(), "synthetic") as store:
        for r in rs:
            store.write(r)
    rc = main(["run", str(tmp_path / "s"), "--colmap", str(tmp_path / "m"), "--glb", str(tmp_path / "a.glb"),
               "--stride", "2", "--conf-threshold", "9.95"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "warning: the confidence threshold keeps only" in err        # almost nothing, said
    rec = pycolmap.Reconstruction(str(tmp_path / "m" / "sparse" / "0"))
    assert rec.num_reg_images() == len(rs)
    assert "trajectory" in trimesh.load(tmp_path / "a.glb").geometry
    assert main(["run", str(tmp_path / "s"), "--colmap", str(tmp_path / "a.glb")]) == 2   # a file, not a folder
    assert main(["run", str(tmp_path / "s"), "--colmap", str(tmp_path / "m2"), "--max-points", "1000",
                 "--stride", "1"]) == 0
    rec = pycolmap.Reconstruction(str(tmp_path / "m2" / "sparse" / "0"))
    # thinned to 1000 points, of which COLMAP holds those two frames see
    assert 100 <= len(rec.points3D) <= 1000 and rec.num_reg_images() == len(rs)
    assert main(["run", str(tmp_path / "s"), "--ply", str(tmp_path / "x.ply"), "--max-points", "0"]) == 2


def test_colmap_binary_model_equals_the_text_model(tmp_path):
    rs = _results()
    export_results(rs, {"colmap": tmp_path / "m"}, conf_threshold=5.0, stride=3)
    sparse = tmp_path / "m" / "sparse" / "0"
    text_only, bin_only = tmp_path / "t", tmp_path / "b"
    for d, ext in ((text_only, ".txt"), (bin_only, ".bin")):
        d.mkdir()
        for name in ("cameras", "images", "points3D"):
            (d / (name + ext)).write_bytes((sparse / (name + ext)).read_bytes())
    t, b = pycolmap.Reconstruction(str(text_only)), pycolmap.Reconstruction(str(bin_only))
    assert b.num_reg_images() == t.num_reg_images() == len(rs)
    assert len(b.points3D) == len(t.points3D) > 0
    for i, im in t.images.items():
        bi = b.images[i]
        assert bi.name == im.name and bi.camera_id == im.camera_id
        np.testing.assert_allclose(bi.cam_from_world().matrix(), im.cam_from_world().matrix(), atol=1e-9)
        np.testing.assert_allclose([p.xy for p in bi.points2D], [p.xy for p in im.points2D], atol=0.006)
    for pid, p in t.points3D.items():
        q = b.points3D[pid]
        np.testing.assert_allclose(q.xyz, p.xyz, rtol=1e-6, atol=1e-6)
        assert (q.color == p.color).all() and q.track.length() == p.track.length() >= 2
        assert [(e.image_id, e.point2D_idx) for e in q.track.elements] == \
            [(e.image_id, e.point2D_idx) for e in p.track.elements]
    np.testing.assert_allclose(next(iter(b.cameras.values())).params, next(iter(t.cameras.values())).params)

"""Session edits (engine/io/edits.py) applied by the export reader: crops, outlier removal, floor and
metric scale reach every export; the edits file round-trips, is written atomically, a bad one
is a clear message, and a session without edits exports exactly as before."""
import hashlib
import json

import numpy as np
import pytest
from plyfile import PlyData

from engine.api import EngineEvent, FrameResult, SessionConfig
from engine.geometry import backproject
from engine.io.edits import (EDITS_FILE, BoxCrop, EditsError, OutlierRemoval, PolygonCrop, SessionEdits,
                             floor_from_points, load_edits, save_edits, scale_from_points)
from engine.io.export import export_results, read_tum
from engine.io.session_reader import read_session
from engine.io.store import SessionStore

H, W = 40, 48
K = np.array([[50.0, 0, 23.5], [0, 50.0, 19.5], [0, 0, 1]])
RED, GREEN = (255, 0, 0), (0, 255, 0)
FAR = [(3, 4), (30, 10), (12, 40), (35, 33), (20, 21)]     # pixels far behind the wall (outliers)


def _results(n=4, outliers=True):
    """Cameras along x looking along +z at a wall 2 units away (grey), two marker pixels (red at
    (5, 6), green at (33, 40) of frame 0) and, with `outliers`, five pixels per frame far behind
    the wall (at different places in each frame)."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        c2w = np.eye(4)
        c2w[:3, 3] = [0.1 * i, 0.0, 0.0]
        depth = np.full((H, W), 2.0, np.float32)
        img = np.full((H, W, 3), 128, np.uint8)
        if outliers:
            for (v, u) in FAR:
                depth[(v + 3 * i) % H, (u + 5 * i) % W] = rng.uniform(5.0, 8.0)
        if i == 0:
            img[5, 6], img[33, 40] = RED, GREEN
        out.append(FrameResult(index=i, timestamp=0.1 * i, is_keyframe=True, c2w=c2w, K=K.copy(), image=img,
                               depth=depth, conf=np.full((H, W), 5.0, np.float32), segment=0))
    return out


@pytest.fixture
def session(tmp_path):
    folder = tmp_path / "s"
    with SessionStore(folder, SessionConfig(engine="synthetic"), "test", image_codec="raw",
                      depth_dtype="float32") as st:
        for r in _results():
            st.write(r)
    return folder


def _ply(path):
    v = PlyData.read(str(path))["vertex"].data
    return np.stack([v["x"], v["y"], v["z"]], 1).astype(np.float64), np.stack([v["red"], v["green"], v["blue"]], 1)


def _digest(folder):
    """Hash of the session's own files (everything but the edits)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != EDITS_FILE and p.name != "running.lock":
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _marker_points():
    r = _results(outliers=False)[0]
    pts, mask = backproject(r.depth, r.K, r.c2w, 1)
    rows = np.flatnonzero(mask.ravel())
    return pts[np.searchsorted(rows, 5 * W + 6)], pts[np.searchsorted(rows, 33 * W + 40)]


def _all_edits():
    p0, p1 = _marker_points()
    return SessionEdits(
        crops=[BoxCrop.from_bounds([-5, -5, 0], [5, 5, 3]),
               PolygonCrop(view=np.eye(4), polygon=np.array([[0.0, 0], [9, 0], [9, 9]]), size=(640, 480),
                           keep_inside=False)],
        outliers=OutlierRemoval(k=8, std_ratio=2.5, conf_threshold=1.0),
        scale=scale_from_points(p0, p1, 1.0),
        floor=floor_from_points([0, 0, 2], [1, 0, 2], [0, 1, 2], toward=[0, 0, 0]))


def test_round_trip_and_atomic_write(session, monkeypatch):
    before = _digest(session)
    e = _all_edits()
    path = save_edits(session, e)
    assert path == session / EDITS_FILE
    back = load_edits(session)
    assert back.to_dict() == e.to_dict()
    np.testing.assert_allclose(back.similarity(), e.similarity())
    assert not [p for p in session.iterdir() if p.name.endswith(".tmp")]
    # a write that fails midway leaves the previous edits whole
    import engine.io.edits as edits_mod

    def boom(*a, **k):
        raise RuntimeError("killed mid-write")
    monkeypatch.setattr(edits_mod.json, "dump", boom)
    with pytest.raises(RuntimeError):
        save_edits(session, SessionEdits(scale=scale_from_points([0, 0, 0], [1, 0, 0], 3.0)))
    monkeypatch.undo()
    assert load_edits(session).to_dict() == e.to_dict()
    assert not [p for p in session.iterdir() if p.name.endswith(".tmp")]
    assert save_edits(session, SessionEdits()) is None and not (session / EDITS_FILE).exists()   # reset
    assert load_edits(session).empty
    assert _digest(session) == before                # the session's own data never changed


@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else", "version": 1}', "not a ReconStudio edits record"),
    ('{"format": "reconstudio-edits", "version": 99}', "newer ReconStudio"),
    ('{"format": "reconstudio-edits", "version": 1, "crops": [{"kind": "sphere"}]}', "unknown crop kind"),
    ('{"format": "reconstudio-edits", "version": 1, "crops": [{"kind": "box", "center": [0, 0]}]}',
     "box"),
    ('{"format": "reconstudio-edits", "version": 1, "scale": {"points": [[0,0,0],[0,0,0]], "length_m": 1}}',
     "same point"),
    ('{"format": "reconstudio-edits", "version": 1, "outliers": {"k": 0}}', "k must be"),
])
def test_bad_edits_file_is_a_clear_message(session, tmp_path, content, words):
    (session / EDITS_FILE).write_text(content)
    with pytest.raises(EditsError) as exc:
        read_session(session)
    assert words in str(exc.value) and str(session / EDITS_FILE) in str(exc.value)
    out = export_results(read_session(session, edits=None), {"ply": tmp_path / "raw.ply"})   # raw still exports
    assert out["points"] == 4 * H * W


def test_session_without_edits_exports_as_before(session, tmp_path):
    a = export_results(session, {"ply": tmp_path / "a.ply", "tum": tmp_path / "a.txt"}, stride=2)
    b = export_results(_results(), {"ply": tmp_path / "b.ply", "tum": tmp_path / "b.txt"}, stride=2)
    assert a["points"] == b["points"] == 4 * (H // 2) * (W // 2)
    assert (tmp_path / "a.ply").read_bytes() == (tmp_path / "b.ply").read_bytes()
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text()
    assert read_session(session).edits is None


def test_box_and_polygon_crops_reach_every_export(session, tmp_path):
    export_results(session, {"ply": tmp_path / "raw.ply"})
    raw, _ = _ply(tmp_path / "raw.ply")
    box = BoxCrop.from_bounds([-0.5, -0.3, 1.0], [0.4, 0.3, 2.5])
    # a pinhole looking along +z from (0, 0, -1): screen pixel x = 100 x / (z + 1) + 320
    view = np.array([[100.0, 0, 320, 320], [0, 100, 240, 240], [0, 0, 0, 1], [0, 0, 1, 1]])
    poly = PolygonCrop(view=view, polygon=np.array([[300.0, 200], [360, 200], [360, 280], [300, 280]]),
                       size=(640, 480))
    save_edits(session, SessionEdits(crops=[box, poly]))
    out = export_results(session, {"ply": tmp_path / "c.ply", "npz": tmp_path / "c.npz",
                                   "glb": tmp_path / "c.glb"})
    pts, _ = _ply(tmp_path / "c.ply")
    want = raw[box.inside(raw) & poly.inside(raw)]
    assert 50 < len(pts) == len(want) < len(raw) // 2 and out["points"] == len(pts)
    assert np.abs(pts - want).max() < 1e-6
    # the polygon by hand: the points project inside the square
    x = 100 * pts[:, 0] / (pts[:, 2] + 1) + 320
    y = 100 * pts[:, 1] / (pts[:, 2] + 1) + 240
    assert (x > 299).all() and (x < 361).all() and (y > 199).all() and (y < 281).all()
    z = np.load(tmp_path / "c.npz")
    assert len(z["points"]) == len(pts)
    assert (z["depth"] > 0).sum() == len(pts)         # the dropped pixels have no depth in the arrays
    import trimesh
    cloud = [g for g in trimesh.load(tmp_path / "c.glb").geometry.values() if isinstance(g, trimesh.PointCloud)]
    assert sum(len(c.vertices) for c in cloud) == len(pts)


def test_outlier_removal_drops_the_far_points(session, tmp_path):
    save_edits(session, SessionEdits(outliers=OutlierRemoval(k=8, std_ratio=2.0)))
    export_results(session, {"ply": tmp_path / "o.ply"})
    pts, _ = _ply(tmp_path / "o.ply")
    far = pts[:, 2] > 3.0
    assert far.sum() == 0                               # the 20 points behind the wall are gone
    assert len(pts) >= 0.98 * (4 * H * W - 20)          # the wall stays (its edges may thin a little)


def test_scale_and_floor_round_trip(session, tmp_path):
    p0, p1 = _marker_points()
    raw_dist = float(np.linalg.norm(p1 - p0))
    # the wall z = 2 as the "floor" (three points on it), the cameras on the up side
    e = SessionEdits(scale=scale_from_points(p0, p1, 1.0),
                     floor=floor_from_points([0, 0, 2], [1, 0, 2], [0, 1, 2], toward=[0, 0, 0]))
    save_edits(session, e)
    export_results(session, {"ply": tmp_path / "m.ply", "tum": tmp_path / "m.txt"}, stride=1)
    pts, cols = _ply(tmp_path / "m.ply")
    red = pts[(cols == RED).all(1)]
    green = pts[(cols == GREEN).all(1)]
    assert len(red) == len(green) == 1
    assert abs(np.linalg.norm(red[0] - green[0]) - 1.000) < 1e-4      # the known length reads 1 m
    wall = pts[np.abs(pts[:, 1]) < 1e-3]
    assert len(wall) >= 4 * H * W - 20 and np.abs(wall[:, 1]).max() < 1e-4   # the floor is y = 0
    _, c2w = read_tum(tmp_path / "m.txt")
    f = 1.0 / raw_dist
    assert (c2w[:, 1, 3] < -1.9 * f).all()             # cameras 2 units above it, up = -y, in metres
    np.testing.assert_allclose(np.linalg.norm(c2w[3, :3, 3] - c2w[0, :3, 3]), 0.3 * f, rtol=1e-6)


def test_crop_scale_round_trip_with_realignment(tmp_path):
    """Crops and picks are in the re-aligned world (as drawn); the edits apply after it."""
    from scipy.spatial.transform import Rotation
    folder = tmp_path / "r"
    T = np.eye(4)
    T[:3, :3] = 2.0 * Rotation.from_rotvec([0.1, 0.4, -0.2]).as_matrix()
    T[:3, 3] = [1.0, 2.0, 3.0]
    with SessionStore(folder, SessionConfig(engine="synthetic"), "test", image_codec="raw",
                      depth_dtype="float32") as st:
        for r in _results(outliers=False):
            st.write(r)
        st.write_event(EngineEvent("realign", 0, T))
    p0, p1 = (T[:3, :3] @ p + T[:3, 3] for p in _marker_points())
    save_edits(folder, SessionEdits(scale=scale_from_points(p0, p1, 1.0),
                                    crops=[BoxCrop.from_bounds(np.minimum(p0, p1) - 0.01,
                                                               np.maximum(p0, p1) + 0.01)]))
    export_results(folder, {"ply": tmp_path / "r.ply"}, stride=1)
    pts, cols = _ply(tmp_path / "r.ply")
    red, green = pts[(cols == RED).all(1)], pts[(cols == GREEN).all(1)]
    assert abs(np.linalg.norm(red[0] - green[0]) - 1.000) < 1e-4
    assert len(pts) < 4 * H * W


def test_cli_crop_file_and_no_edits(session, tmp_path, capsys):
    from app.cli import main
    save_edits(session, SessionEdits(crops=[BoxCrop.from_bounds([-9, -9, 0], [0.0, 9, 9])]))
    other = tmp_path / "keep_right.json"
    other.write_text(json.dumps(SessionEdits(crops=[BoxCrop.from_bounds([0.0, -9, 0], [9, 9, 9])]).to_dict()))
    runs = {}
    for name, extra in (("own", []), ("file", ["--crop", str(other)]), ("raw", ["--no-edits"])):
        assert main(["run", str(session), "-q", "--stride", "1", "--ply", str(tmp_path / f"{name}.ply")] + extra) == 0
        runs[name] = _ply(tmp_path / f"{name}.ply")[0]
    assert len(runs["raw"]) == 4 * H * W
    assert (runs["own"][:, 0] <= 1e-6).all() and (runs["file"][:, 0] >= -1e-6).all()
    assert len(runs["own"]) + len(runs["file"]) >= len(runs["raw"])
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["run", str(session), "--ply", str(tmp_path / "x.ply"), "--crop", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "not a JSON object" in err and not (tmp_path / "x.ply").exists()
    assert main(["run", str(session), "--ply", str(tmp_path / "x.ply"), "--crop", str(other), "--no-edits"]) == 2


def test_edit_geometry_errors():
    with pytest.raises(EditsError, match="on a line"):
        floor_from_points([0, 0, 0], [1, 1, 1], [2, 2, 2])
    with pytest.raises(EditsError, match="positive"):
        scale_from_points([0, 0, 0], [1, 0, 0], -1)
    f = floor_from_points([0, 5, 0], [1, 5, 0], [0, 5, 1], toward=[0, 0, 0])   # y = 5 plane, cameras above (-y)
    np.testing.assert_allclose(f.transform[:3, :3], np.eye(3), atol=1e-12)
    np.testing.assert_allclose(f.transform[:3, 3], [0, -5, 0], atol=1e-12)
    g = floor_from_points([0, 5, 0], [1, 5, 0], [0, 5, 1], toward=[0, 9, 0])   # cameras below: flipped
    np.testing.assert_allclose(g.transform[:3, :3] @ [0, 1, 0], [0, -1, 0], atol=1e-12)
    b = BoxCrop.from_bounds([0, 0, 0], [1, 2, 3], rotation=floor_from_points(
        [0, 0, 0], [1, 0, 0], [0, 0, 1], toward=[0, 0, 1]).transform[:3, :3].T)
    assert b.inside(b.corners() * 0.999 + b.center * 0.001).all()


def test_each_frame_is_tested_once_per_export(session, tmp_path, monkeypatch):
    """An export reads a frame once per format (and per NPZ member): the outlier test (the costly
    edit) runs once per frame all the same."""
    from engine.io.edits import OutlierModel
    queried = []
    keep = OutlierModel.keep
    monkeypatch.setattr(OutlierModel, "keep", lambda self, p: queried.append(len(p)) or keep(self, p))
    save_edits(session, SessionEdits(outliers=OutlierRemoval(k=8)))
    out = export_results(session, {"ply": tmp_path / "o.ply", "npz": tmp_path / "o.npz", "glb": tmp_path / "o.glb"})
    assert sum(queried) == 4 * H * W and len(queried) == 4
    z = np.load(tmp_path / "o.npz")
    assert len(z["points"]) == out["points"] == (z["depth"] > 0).sum()
    assert 0.98 * (4 * H * W - 20) <= out["points"] <= 4 * H * W - 20       # the 20 far points are gone


def test_outlier_test_matches_the_plain_k_nearest_rule():
    """OutlierModel.keep's 1-NN bound shortcut gives exactly the decision of the plain rule (mean
    distance to the k nearest reference points, a reference point's own k others) on a noisy
    cloud with far points, query points on and off the reference."""
    from scipy.spatial import cKDTree
    from engine.io.edits import OutlierModel
    rng = np.random.default_rng(11)
    wall = np.c_[rng.uniform(-1, 1, (4000, 2)), rng.normal(0, 0.01, 4000)]
    ref = np.r_[wall, rng.uniform(-3, 3, (60, 3))]
    model = OutlierModel(ref, OutlierRemoval(k=10, std_ratio=1.0))
    q = np.r_[ref[::7], np.c_[rng.uniform(-1.2, 1.2, (3000, 2)), rng.normal(0, 0.05, 3000)],
              rng.uniform(-3, 3, (300, 3))]
    d, _ = cKDTree(ref).query(q, 11)
    m = np.where(d[:, 0] == 0, d[:, 1:].mean(axis=1), d[:, :10].mean(axis=1))
    want = m <= model.threshold
    assert 0 < (~want).sum() < len(q) // 2          # both decisions occur
    np.testing.assert_array_equal(model.keep(q), want)

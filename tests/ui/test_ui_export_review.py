"""Exports from the window match the view (absolute confidence threshold, same Subsample),
every format of engine.io.export is offered, and an export that keeps almost nothing asks first."""
import math

import numpy as np
import pytest
from plyfile import PlyData

from tests.ui.conftest import wait_finished

FRAMES = 12


def _run(qtbot, w, shared_data, frames=FRAMES):
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(frames)
    w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] is None and s["results"] == frames
    qtbot.wait(300)                 # a status refresh
    return s


def test_threshold_is_absolute_and_status_counts_what_is_drawn(qtbot, make_window, shared_data):
    w = make_window()
    w.set_conf_threshold(3.0)
    _run(qtbot, w, shared_data)
    assert w.conf_threshold() == pytest.approx(3.0)          # unchanged by the run (no drift)
    conf = w.viewer.conf_values()
    drawn = int((conf >= 3.0).sum())
    assert 0 < drawn < w.viewer.point_count                  # the fake engine's conf spans 1..5
    assert w.drawn_point_count() == drawn
    assert w.st_points.text() == f"{drawn:,} points drawn"
    assert w.conf_control.hist.total == w.viewer.point_count  # the distribution of every point
    assert "% kept" in w.conf_control.kept_label.text()
    w.conf_control.spin.setValue(0.0)                        # 0 = all
    assert w.conf_threshold() == -math.inf
    qtbot.wait(300)
    assert w.st_points.text() == f"{w.viewer.point_count:,} points drawn"
    w.conf_slider.setValue(w.conf_slider.maximum())          # far right: nothing drawn
    qtbot.wait(300)
    assert w.st_points.text() == "0 points drawn"


def test_every_format_from_the_window_matches_the_view(qtbot, make_window, shared_data, tmp_path):
    pycolmap = pytest.importorskip("pycolmap")
    trimesh = pytest.importorskip("trimesh")
    w = make_window()
    w.stride.setValue(2)
    _run(qtbot, w, shared_data)
    w.set_conf_threshold(2.5)
    drawn = w.drawn_point_count()
    out = w.export("ply", str(tmp_path / "a.ply"))
    n_ply = len(PlyData.read(str(tmp_path / "a.ply"))["vertex"])
    assert n_ply == out["points"]
    assert n_ply >= 0.9 * drawn and n_ply <= 1.1 * drawn          # the density the user saw
    assert PlyData.read(str(tmp_path / "a.ply"))["vertex"]["confidence"].min() >= 2.5
    from engine.io.export import EXPORT_FORMATS
    assert set(w.export_actions) == set(EXPORT_FORMATS) | {"orbit"}     # every format, video twice
    assert all(a.isEnabled() for a in w.export_actions.values())
    out = w.export("colmap", str(tmp_path / "m"))
    rec = pycolmap.Reconstruction(str(tmp_path / "m" / "sparse" / "0"))
    # COLMAP holds the points that two or more frames see (tracks), out of the PLY's
    assert rec.num_reg_images() == FRAMES and len(rec.points3D) == out["colmap"]["points"]
    assert 0.9 * n_ply <= len(rec.points3D) <= n_ply
    w.export("glb", str(tmp_path / "a.glb"))
    g = trimesh.load(tmp_path / "a.glb").geometry
    assert len(g["points"].vertices) == n_ply and "trajectory" in g
    assert "Exported" in w.banner.label.text()


def test_export_keeping_almost_nothing_asks_first(qtbot, make_window, shared_data, tmp_path, monkeypatch):
    from PySide6 import QtWidgets
    w = make_window()
    _run(qtbot, w, shared_data, frames=4)
    w.set_conf_threshold(4.9)                   # keeps ~2 % of the fake engine's points (0 is an error)
    asked = []
    answer = [QtWidgets.QMessageBox.StandardButton.No]
    monkeypatch.setattr(QtWidgets.QMessageBox, "question",
                        lambda *a, **k: (asked.append(a[2]), answer[0])[1])
    assert w.export("ply", str(tmp_path / "x.ply")) is None
    assert asked and "keeps only" in asked[0]
    assert not (tmp_path / "x.ply").exists()
    assert "not written" in w.banner.label.text() and w.banner.level == "warning"
    answer[0] = QtWidgets.QMessageBox.StandardButton.Yes
    out = w.export("ply", str(tmp_path / "x.ply"))
    assert (tmp_path / "x.ply").exists() and out["points"] == w.drawn_point_count()
    assert w.banner.level == "warning"          # written, still said to be almost nothing
    n = len(asked)
    w.export("tum", str(tmp_path / "t.txt"))    # a trajectory has no points: no question
    assert len(asked) == n and (tmp_path / "t.txt").exists()
    w.set_conf_threshold(1000.0)                # nothing kept: written anyway? no, an error, said
    assert w.export("ply", str(tmp_path / "none.ply")) is None
    assert not (tmp_path / "none.ply").exists() and "0 points" in w.banner.label.text()


def test_file_export_menu_writes_in_the_background(qtbot, make_window, shared_data, tmp_path, monkeypatch):
    from PySide6 import QtWidgets
    w = make_window()
    _run(qtbot, w, shared_data, frames=6)
    monkeypatch.setattr(QtWidgets.QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path / "m"))
    monkeypatch.setattr(QtWidgets.QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "s.glb"), ""))
    for kind, target in (("colmap", tmp_path / "m" / "sparse" / "0" / "points3D.bin"), ("glb", tmp_path / "s.glb")):
        with qtbot.waitSignal(w.exportFinished, timeout=30_000) as got:
            w.export_actions[kind].trigger()             # File > Export > ...
        assert got.args[0] is not None and got.args[0]["frames"] == 6 and target.exists()


def test_new_formats_and_videos_from_the_menu(qtbot, make_window, shared_data, tmp_path, monkeypatch):
    """File > Export offers nerfstudio, OBJ and the two videos; a video asks its size and rate and
    renders one frame per exported frame (or the orbit) with the window's GL context."""
    import cv2
    from PySide6 import QtWidgets

    from engine.io.video import ORBIT_SECONDS
    w = make_window()
    _run(qtbot, w, shared_data, frames=6)
    monkeypatch.setattr(QtWidgets.QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path / "ns"))
    monkeypatch.setattr(QtWidgets.QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "c.obj"), ""))
    for kind, target in (("nerfstudio", tmp_path / "ns" / "transforms.json"), ("obj", tmp_path / "c.obj")):
        with qtbot.waitSignal(w.exportFinished, timeout=30_000) as got:
            w.export_actions[kind].trigger()
        assert got.args[0] is not None and target.exists()
    monkeypatch.setattr(QtWidgets.QInputDialog, "getItem", lambda *a, **k: ("160x120", True))
    monkeypatch.setattr(QtWidgets.QInputDialog, "getInt", lambda *a, **k: (5, True))
    for kind, name in (("video", "path.mp4"), ("orbit", "orbit.mp4")):
        monkeypatch.setattr(QtWidgets.QFileDialog, "getSaveFileName", lambda *a, n=name, **k: (str(tmp_path / n), ""))
        with qtbot.waitSignal(w.exportFinished, timeout=120_000) as got:
            w.export_actions[kind].trigger()
        assert got.args[0] is not None
        cap = cv2.VideoCapture(str(tmp_path / name))
        want = 6 if kind == "video" else round(ORBIT_SECONDS * 5)
        assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == want
        assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (160, 120)
        ok, f = cap.read()
        assert ok and f.std() > 5                          # the cloud is drawn
    monkeypatch.setattr(QtWidgets.QInputDialog, "getItem", lambda *a, **k: ("wide", True))
    monkeypatch.setattr(QtWidgets.QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "bad.mp4"), ""))
    w.export_actions["video"].trigger()                    # a size that is not WxH: a message, no file
    assert not (tmp_path / "bad.mp4").exists() and "not a size" in w.banner.label.text()

"""A real clip replayed through the GUI with the default geometric engine: the cloud grows, one
frustum and one trajectory vertex per result, the 3D view is not blank; exports round-trip and
the saved session reopens into the viewer."""
import numpy as np
from plyfile import PlyData

from tests.ui.conftest import wait_finished

FRAMES = 120     # the geometric engine needs sideways motion before its first pose and depth


def test_replay_video_with_geometric_engine(qtbot, make_window, shared_data, tmp_path):
    w = make_window(engine="geometric")
    assert w.settings_panel.engine_name() == "geometric"
    assert w.st_scale.isVisible()               # monocular: arbitrary scale note
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "video.mp4"))
    w.max_frames.setValue(FRAMES)
    counts = []
    w.framesShown.connect(lambda n: counts.append(w.viewer.point_count))
    w.start_run()
    s = wait_finished(qtbot, w, timeout=180_000)
    assert s["error"] is None and s["frames"] == FRAMES
    n = s["results"]
    assert n > 0
    assert w.viewer.frame_count == n == w.viewer.frustum_count == w.viewer.trajectory_count
    assert counts == sorted(counts) and counts[-1] > 10_000
    assert w.viewer.point_count == counts[-1]
    img = w.viewer.render_image()
    assert img[..., :3].std() > 10                 # not blank
    assert w.preview.shown_index is not None

    # exports (current threshold + subsampling) round-trip
    w.conf_slider.setValue(0)
    ply, npz, tum = tmp_path / "a.ply", tmp_path / "a.npz", tmp_path / "a.txt"
    out = w.export("ply", str(ply))
    v = PlyData.read(str(ply))["vertex"]
    assert len(v) == out["points"] > 0
    assert {"x", "y", "z", "red", "green", "blue", "confidence"} <= set(v.data.dtype.names)
    w.export("npz", str(npz))
    z = np.load(npz)
    assert z["c2w"].shape == (n, 4, 4) and z["K"].shape == (n, 3, 3) and z["timestamps"].shape == (n,)
    assert z["points"].shape[1] == 3 and z["colors"].dtype == np.uint8
    w.export("tum", str(tum))
    assert len(tum.read_text().splitlines()) == n
    w.set_conf_threshold(5.0)                      # a higher threshold (absolute units) exports fewer points
    assert w.export("ply", str(tmp_path / "b.ply"))["points"] < out["points"]

    # reopen the saved session
    folder = w.session_folder
    w.viewer.clear()
    assert w.open_session_folder(folder)
    assert w.viewer.frame_count == n and w.viewer.point_count > 0


def test_background_export_and_drop(qtbot, make_window, shared_data, tmp_path):
    from PySide6 import QtCore, QtGui
    w = make_window()
    rgb = shared_data / "icl_livingroom_kt3" / "rgb"
    mime = QtCore.QMimeData()
    mime.setUrls([QtCore.QUrl.fromLocalFile(str(rgb))])
    drop = QtGui.QDropEvent(QtCore.QPointF(10, 10), QtCore.Qt.DropAction.CopyAction, mime,
                            QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier)
    w.dropEvent(drop)                               # a dropped folder becomes the input
    assert w.source_panel.spec() == str(rgb) and w.source_panel.current_kind() == "folder"
    w.max_frames.setValue(4)
    w.start_run()
    wait_finished(qtbot, w)
    folder = w.session_folder
    with qtbot.waitSignal(w.exportFinished, timeout=60_000) as got:
        assert w.export("tum", str(tmp_path / "t.txt"), background=True) is None
    assert got.args[0]["frames"] == 4
    assert len((tmp_path / "t.txt").read_text().splitlines()) == 4
    # a dropped session folder is reopened
    w.viewer.clear()
    mime.setUrls([QtCore.QUrl.fromLocalFile(folder)])
    w.dropEvent(QtGui.QDropEvent(QtCore.QPointF(10, 10), QtCore.Qt.DropAction.CopyAction, mime,
                                 QtCore.Qt.MouseButton.LeftButton, QtCore.Qt.KeyboardModifier.NoModifier))
    assert w.viewer.frame_count == 4

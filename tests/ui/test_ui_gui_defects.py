"""The small GUI defects of issue #28 (item 8), each checked on a real window under Xvfb: the
reopened session's depth pane, the 3D view after an input error, the keyframe count while
scrubbing, picking a camera by its frustum or thumbnail, the monitors' legends, and "Current
frame" on a frame without depth."""
import numpy as np
from PySide6 import QtCore, QtGui

from tests.ui.conftest import wait_finished
from ui.review import CAMERA_PICK_PX, project


def _run(qtbot, w, shared_data, frames, **extra):
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(frames)
    c = w.settings_panel.config()
    c.extra = dict(extra)
    w.settings_panel.set_config(c)
    assert w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] is None and s["results"] == frames
    return s


def _has_content(img: QtGui.QImage) -> bool:
    """More than a flat background: several distinct colours in the grabbed pixels."""
    rgb = img.convertToFormat(QtGui.QImage.Format.Format_RGB32)      # kept alive while read
    a = np.frombuffer(rgb.constBits(), np.uint8).reshape(rgb.height(), rgb.width(), 4)[..., :3]
    return len(np.unique(a.reshape(-1, 3), axis=0)) > 8


def test_reopened_session_shows_its_newest_depth_map_at_once(qtbot, make_window, shared_data):
    w = make_window()
    s = _run(qtbot, w, shared_data, frames=8, keyframe_depth=1)   # frame 7: no depth
    w2 = make_window()
    assert w2.open_session_folder(s["session"])
    qtbot.wait(50)
    assert w2.preview.shown_index == 7
    assert w2.preview.depth_shown_index == 6                        # the newest frame with depth
    assert w2.preview.depth.caption.text() == "depth · frame 6"
    assert _has_content(w2.preview.depth.grab().toImage())          # drawn, not the "depth" placeholder


def test_an_input_error_replaces_the_opening_hint(qtbot, make_window, tmp_path):
    w = make_window()
    w.set_input(str(tmp_path / "no_such_video.mp4"))
    assert w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"]
    hint = w.viewer.hint
    assert hint.isVisible() and "Opening the input" not in hint.text()
    assert "error" in hint.text() and "not found" in hint.text().lower()


def test_status_bar_counts_keyframes_up_to_the_scrubbed_frame(qtbot, make_window, shared_data):
    w = make_window()
    _run(qtbot, w, shared_data, frames=12)                          # keyframes: the even frames
    w.update_status()
    assert w.st_frames.text() == "12 frames · 6 keyframes"
    w.review.scrub_to(5)
    w.update_status()
    assert w.st_frames.text() == "6 frames · 3 keyframes"           # frames 0..5: 0, 2, 4
    w.review.scrub_to(8)                                            # forwards: drawn incrementally
    w.update_status()
    assert w.st_frames.text() == "9 frames · 5 keyframes"
    w.review.go_live()
    w.update_status()
    assert w.st_frames.text() == "12 frames · 6 keyframes"


def test_a_reopened_session_counts_its_keyframes(qtbot, make_window, shared_data):
    w = make_window()
    s = _run(qtbot, w, shared_data, frames=7)
    w2 = make_window()
    assert w2.open_session_folder(s["session"])
    w2.update_status()
    assert w2.st_frames.text() == "7 frames · 4 keyframes"


def _quad(v, k):
    """Projected image rectangle (canvas pixels) of camera row k's drawn frustum."""
    m = v.scene
    T = m.frame_transform(int(m.cam_frame[k]))
    corners = np.asarray(m.cam_frustum[k][1:5], np.float64) @ T[:3, :3].T + T[:3, 3]
    xy, w = project(v, corners)
    return xy, w


def _point_on_a_thumbnail(v, keyframes):
    """A canvas point inside a keyframe's drawn image rectangle, farther than CAMERA_PICK_PX from
    every camera centre (where the old centre-only pick found nothing); None if there is none."""
    centres, _ = project(v, v.scene.camera_centers())
    for k in keyframes[::-1]:
        xy, depth = _quad(v, k)
        if (depth <= 0).any():
            continue
        poly = QtGui.QPolygonF([QtCore.QPointF(*p) for p in xy])
        for a, b in ((0.5, 0.5), (0.3, 0.6), (0.7, 0.4), (0.25, 0.25), (0.75, 0.75), (0.5, 0.2), (0.5, 0.8)):
            p = (1 - b) * ((1 - a) * xy[0] + a * xy[1]) + b * ((1 - a) * xy[3] + a * xy[2])
            far = np.hypot(*(centres - p).T).min() > CAMERA_PICK_PX + 2
            inside_canvas = 5 < p[0] < v.canvas.size[0] - 5 and 5 < p[1] < v.canvas.size[1] - 5
            if far and inside_canvas and poly.containsPoint(QtCore.QPointF(*p), QtCore.Qt.FillRule.OddEvenFill):
                return p
    return None


def test_a_camera_is_picked_by_its_frustum_and_its_thumbnail(qtbot, make_window, shared_data):
    w = make_window()
    _run(qtbot, w, shared_data, frames=6)
    v, rv = w.viewer, w.review
    w.follow.setChecked(False)
    kfs = np.flatnonzero(v.scene.cam_keyframe[: v.scene.camera_count])
    m = v.scene
    T = m.frame_transform(int(m.cam_frame[kfs[-1]]))
    rect = np.asarray(m.cam_frustum[kfs[-1]][1:5], np.float64) @ T[:3, :3].T + T[:3, 3]
    hit = None
    for distance in (1.2, 0.8, 0.5, 0.3):                           # close up on the newest thumbnail
        cam = v.view.camera
        cam.center, cam.distance = tuple(rect.mean(axis=0)), distance
        v.auto_fit = False
        v.canvas.update()
        qtbot.wait(50)
        assert rv.update_thumbnails(max_loads=16) >= 1
        hit = _point_on_a_thumbnail(v, kfs)
        if hit is not None:
            break
    assert hit is not None, "no thumbnail point away from every camera centre"
    pos = QtCore.QPoint(int(round(hit[0])), int(round(hit[1])))
    qtbot.mouseClick(v.canvas.native, QtCore.Qt.MouseButton.LeftButton, pos=pos)
    assert rv.clicked_index is not None                             # before: only within 14 px of a centre
    assert w.preview.shown_index == rv.clicked_index and "clicked" in w.preview.rgb.caption.text()
    rows = np.flatnonzero(v.scene.cam_index[: v.scene.camera_count] == rv.clicked_index)
    xy, _ = _quad(v, int(rows[0]))
    poly = QtGui.QPolygonF([QtCore.QPointF(*p) for p in xy])
    assert poly.containsPoint(QtCore.QPointF(pos), QtCore.Qt.FillRule.OddEvenFill)   # the camera clicked
    # empty space picks nothing
    v.reset_view()
    v.canvas.update()
    qtbot.wait(50)
    rv.clicked_index = None
    rv.click((2.0, 2.0))
    assert rv.clicked_index is None


def test_monitor_legends_keep_every_label_inside_their_plot(qtbot, make_window):
    w = make_window()
    m = w.monitors
    m.setFixedHeight(m.minimumHeight())             # the monitors dock as small as the window lets it be
    qtbot.wait(100)
    for t in range(5):
        m.update_stats({"fps": 10.0 + t, "latency_ms": 50.0, "latency_p95_ms": 60.0, "read_ms": 3.0,
                        "sinks_ms": 2.0, "gpu_allocated_bytes": 1 << 30, "gpu_reserved_bytes": 2 << 30})
        m.update_viewer_fps(5.0)
    m.refresh()
    qtbot.wait(100)
    for plot, n in ((m.fps_plot, 2), (m.lat_plot, 4), (m.mem_plot, 3)):
        legend, box = plot.legend, plot.getViewBox().sceneBoundingRect()
        assert len(legend.items) == n
        for _, label in legend.items:
            assert box.contains(label.sceneBoundingRect()), (label.text, box, label.sceneBoundingRect())
        assert all(legend.zValue() > c.zValue() for c in plot.listDataItems())   # over the curves
    m.reset()                                                       # optional entries go, the rest stay in
    m.refresh()
    assert [label.text for _, label in m.lat_plot.legend.items] == ["engine (last)", "engine p95"]


def test_current_frame_on_a_frame_without_depth_shows_the_nearest_earlier_points(qtbot, make_window, shared_data):
    w = make_window()
    _run(qtbot, w, shared_data, frames=8, keyframe_depth=1)
    v, rv = w.viewer, w.review
    w.follow.setChecked(False)
    rv.scrub_to(4, mode="current")                                  # a keyframe: its own points
    own = v.point_count
    assert own > 0 and rv.points_from is None and rv.frame_label.text() == "frame 4 only"
    rv.scrub_to(5, mode="current")                                  # no depth: frame 4's points, said so
    assert v.point_count == own and rv.points_from == 4
    assert rv.frame_label.text() == "frame 5 · points of frame 4" and "no depth" in rv.frame_label.toolTip()
    v.reset_view()
    qtbot.wait(100)
    img = v.render_image()
    assert (np.abs(img[..., :3].astype(int) - img[0, 0, :3].astype(int)).sum(axis=-1) > 30).mean() > 0.002
    rv.go_live()
    assert rv.frame_label.toolTip() == "" and v.frame_count == 8


def test_waiting_hint_says_when_the_focal_length_is_being_measured(make_window, monkeypatch):
    """A geometric run without intrinsics holds its first frames to self-calibrate: the empty view
    says so (and how to skip it) instead of asking for sideways motion."""
    from ui.run_controller import RunController
    w = make_window()
    monkeypatch.setattr(RunController, "running", property(lambda self: True))
    w.runs.last_stats = {"frames_in": 40, "self_calibrating_frames": 40}
    hint = w.runs.waiting_hint()
    assert "focal length is being measured" in hint and "40 held" in hint and "intrinsics" in hint
    w.runs.last_stats = {"frames_in": 40, "self_calibrating_frames": 0}
    assert "sideways camera motion" in w.runs.waiting_hint()


def test_live_depth_previews_are_coloured_off_the_gui_thread(qtbot, make_window, shared_data, monkeypatch):
    """During a run the worker colours the depth map a batch sends (DisplayFrame.depth_rgb): the
    preview pane shows those colours and never colours a depth map itself on the GUI thread;
    the colours are depth_colours' (turbo to the 98th percentile, black without depth)."""
    import threading

    from ui import display, image_preview
    gui = threading.get_ident()
    calls = []
    real = display.depth_colours

    def recording(d):
        calls.append(threading.get_ident())
        return real(d)

    monkeypatch.setattr(image_preview, "depth_colours", recording)
    monkeypatch.setattr("ui.worker.depth_colours", recording)
    w = make_window()
    _run(qtbot, w, shared_data, frames=10)
    assert calls and gui not in calls                      # coloured, and only off the GUI thread
    assert w.preview.depth_shown_index is not None and _has_content(w.preview.depth.grab().toImage())
    d = np.full((4, 5), 2.0, np.float32)
    d[0, 0], d[1, 1] = 0.0, np.nan
    rgb = real(d)
    assert rgb.shape == (4, 5, 3) and rgb.dtype == np.uint8
    assert not rgb[0, 0].any() and not rgb[1, 1].any() and rgb[2, 2].any()
    assert real(np.zeros((3, 3), np.float32)) is None

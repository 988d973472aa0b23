"""Reviewing a run: keyframe-only frustums with the trajectory on top, captioned previews,
monitors showing only what the engine has, feedback while the engine initialises, and a note
when a setting changed during a run applies to the next one."""
import numpy as np

from tests.ui.conftest import wait_finished


def _run(qtbot, w, shared_data, frames=8, **extra):
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(frames)
    if extra:
        c = w.settings_panel.config()
        c.extra = dict(extra)
        w.settings_panel.set_config(c)
    w.start_run()


def test_keyframe_frustums_trajectory_on_top_and_captions(qtbot, make_window, shared_data):
    w = make_window()
    _run(qtbot, w, shared_data)
    s = wait_finished(qtbot, w)
    assert s["results"] == 8
    v = w.viewer
    sync = getattr(v, "sync", lambda: None)      # uploads may wait for the next draw
    sync()
    assert v.frustum_count == 8 and not w.all_frustums.isChecked()
    lines = v.frustums._attrs["a_position"].host[: v.frustums.count].reshape(8, 16, 3)
    kf = np.array([v.scene.cam_keyframe[i] for i in range(8)])
    extent = np.ptp(lines, axis=1).max(axis=1)
    assert (extent[kf] > 0).all() and (extent[~kf] == 0).all()      # non-keyframes collapsed
    w.all_frustums.setChecked(True)
    sync()
    lines = v.frustums._attrs["a_position"].host[: v.frustums.count].reshape(8, 16, 3)
    assert (np.ptp(lines, axis=1).max(axis=1) > 0).all() and v.frustum_count == 8
    assert v.trajectory.order > v.frustums.order                       # drawn last, over the rest
    assert w.preview.shown_index == 7                  # the newest frame, not an older backlog
    assert w.preview.rgb.caption.text().startswith(f"frame {w.preview.shown_index}")
    assert w.preview.depth.caption.text() == f"depth · frame {w.preview.depth_shown_index}"


def test_monitors_hide_what_the_engine_does_not_have(qtbot, make_window):
    w = make_window()
    m = w.monitors
    m.update_stats({"fps": 10.0, "gpu_allocated_bytes": None, "kv_page_map": None})   # a CPU engine
    m.refresh()
    assert not m.kv_pane.isVisible()
    names = [item[1].text for item in m.mem_plot.legend.items]
    assert "process RAM" in names and not any("GPU" in n for n in names)
    m.update_stats({"gpu_allocated_bytes": 1 << 30, "kv_page_map": np.zeros(8, np.int8)})
    m.refresh()
    assert m.kv_pane.isVisible() and "GPU allocated" in [i[1].text for i in m.mem_plot.legend.items]
    m.reset()
    assert not m.kv_pane.isVisible() and not any("GPU" in i[1].text for i in m.mem_plot.legend.items)


def test_initialisation_feedback_and_next_run_note(qtbot, make_window, shared_data):
    w = make_window()
    _run(qtbot, w, shared_data, frames=60, delay_s=0.05, hold=50)
    qtbot.waitUntil(lambda: "Initialising" in w.viewer.hint.text() and w.viewer.hint.isVisible(),
                    timeout=20_000)
    assert "frames read" in w.viewer.hint.text() or "frame read" in w.viewer.hint.text()
    w.stride.setValue(w.stride.value() + 1)
    assert "next run" in w.banner.label.text() and w.banner.level == "info"
    n = len(w.messages)
    w.stride.setValue(w.stride.value() + 1)             # said once per run
    assert len(w.messages) == n
    w.stop_run(wait=True)


def _finished_run(qtbot, w, shared_data, frames=12):
    _run(qtbot, w, shared_data, frames=frames)
    s = wait_finished(qtbot, w)
    assert s["results"] == frames
    return s


def test_timeline_scrub_modes_and_live(qtbot, make_window, shared_data):
    w = make_window()
    _finished_run(qtbot, w, shared_data)
    v, rv = w.viewer, w.review
    full = v.point_count
    per_frame = full // 12
    assert rv.slider.isEnabled() and rv.slider.maximum() == 11 and not rv.reviewing
    rv.scrub_to(5)
    assert rv.reviewing and rv.live.isEnabled()
    assert v.frame_count == 6 and v.point_count == 6 * per_frame and v.trajectory_count == 6
    assert w.preview.shown_index == 5 and "timeline" in w.preview.rgb.caption.text()
    rv.scrub_to(8)                                   # forward: only the new frames are added
    assert v.frame_count == 9 and v.point_count == 9 * per_frame
    rv.scrub_to(8, mode="current")                   # that frame's points, the cameras up to it
    assert v.frame_count == 9 and v.point_count == per_frame
    assert rv.frame_label.text() == "frame 8 only"
    rv.slider.setValue(2)                            # the slider itself (debounced)
    qtbot.waitUntil(lambda: rv.shown_upto == 2, timeout=5000)
    assert v.frame_count == 3 and v.point_count == per_frame
    rv.go_live()
    assert not rv.reviewing and v.frame_count == 12 and v.point_count == full
    assert rv.current_mode() == "accumulated"


def test_timeline_while_the_run_goes_on(qtbot, make_window, shared_data):
    w = make_window()
    _run(qtbot, w, shared_data, frames=30, delay_s=0.05)
    qtbot.waitUntil(lambda: w.viewer.frame_count >= 6, timeout=20_000)
    w.review.scrub_to(3)
    assert w.review.reviewing and w.viewer.frame_count == 4
    s = wait_finished(qtbot, w)
    assert w.viewer.frame_count == 4                 # the run went on into the store only
    w.review.go_live()
    assert w.viewer.frame_count == s["results"] == 30


def test_camera_presets_click_a_camera_and_measure(qtbot, make_window, shared_data):
    from PySide6 import QtCore
    from ui.review import project
    w = make_window()
    _finished_run(qtbot, w, shared_data)
    rv, v = w.review, w.viewer
    rv.set_camera_preset("Top")
    assert v.view.camera.elevation == 90.0 and not w.follow.isChecked() and rv.camera.currentText() == "Top"
    rv.set_camera_preset("Follow")
    assert w.follow.isChecked()
    w.follow.setChecked(False)                       # the checkbox and the preset agree
    assert rv.camera.currentText() == "Free"
    rv.set_camera_preset("Free")
    v.reset_view()
    qtbot.wait(100)
    # a real click on the drawn centre of camera 4 shows that frame
    xy, _ = project(v, v.scene.cam_center[4:5].astype(np.float64))
    pos = QtCore.QPoint(int(round(xy[0, 0])), int(round(xy[0, 1])))
    qtbot.mouseClick(v.canvas.native, QtCore.Qt.MouseButton.LeftButton, pos=pos)
    assert rv.clicked_index is not None
    assert w.preview.shown_index == rv.clicked_index and "clicked" in w.preview.rgb.caption.text()
    assert abs(rv.clicked_index - 4) <= 1            # neighbouring cameras are 0.05 apart
    # measure between two drawn points
    rv.measure.setChecked(True)
    world = v.scene.world_positions()
    a, b = world[np.argmin(world[:, 0])], world[np.argmax(world[:, 0])]     # far apart
    for p in (a, b):
        xy, _ = project(v, p[None].astype(np.float64))
        rv.click(xy[0])
    assert rv.distance is not None and len(rv.measure_points) == 2
    assert abs(rv.distance - np.linalg.norm(b - a)) < 0.1 * np.linalg.norm(b - a)
    np.testing.assert_allclose(rv.distance, np.linalg.norm(rv.measure_points[1] - rv.measure_points[0]))
    for p, target in zip(rv.measure_points, (a, b)):          # each pick lands where clicked
        d = project(v, np.stack([p, target]).astype(np.float64))[0]
        assert np.hypot(*(d[0] - d[1])) <= 8.5
    assert rv.info.text().startswith("distance")
    rv.measure.setChecked(False)
    assert rv.distance is None and not rv.measure_points


def test_keyframe_thumbnails_sit_in_their_frustums(qtbot, make_window, shared_data):
    from ui.review import MAX_THUMBNAILS
    w = make_window()
    _finished_run(qtbot, w, shared_data)
    rv, m = w.review, w.viewer.scene
    n = rv.update_thumbnails(max_loads=100)
    kf = np.flatnonzero(m.cam_keyframe[: m.camera_count])
    assert n == min(len(kf), MAX_THUMBNAILS) == 6
    k = kf[-1]
    node = rv._thumb_nodes[int(m.cam_index[k])]
    h, w_ = rv._thumb_images[int(m.cam_index[k])].shape[:2]
    corners = node.transform.map(np.array([[0, 0, 0], [w_, 0, 0], [0, h, 0]], float))[:, :3]
    np.testing.assert_allclose(corners, m.cam_frustum[k][[1, 2, 4]], atol=1e-5)   # TL, TR, BL
    img = w.viewer.render_image()
    assert img[..., :3].std() > 10
    rv.thumbs.setChecked(False)
    assert not rv._thumb_nodes


def test_export_while_reviewing_holds_the_session_up_to_that_frame(qtbot, make_window, shared_data, tmp_path):
    from engine.io.export import read_tum
    w = make_window()
    _finished_run(qtbot, w, shared_data)
    w.review.scrub_to(4)
    out = w.export("tum", str(tmp_path / "t.txt"))
    assert out["frames"] == 5 and len(read_tum(tmp_path / "t.txt")[0]) == 5
    ply = w.export("ply", str(tmp_path / "a.ply"))
    assert ply["points"] == w.drawn_point_count() == w.viewer.point_count
    w.review.go_live()
    assert w.export("tum", str(tmp_path / "all.txt"))["frames"] == 12


def test_reopened_session_has_a_timeline_and_thumbnails(qtbot, make_window, shared_data):
    w = make_window()
    _finished_run(qtbot, w, shared_data)
    folder = w.session_folder
    w2 = make_window()
    assert w2.open_session_folder(folder)
    assert w2.review.slider.isEnabled() and w2.review.slider.maximum() == 11
    qtbot.waitUntil(lambda: len(w2.review._thumb_nodes) > 0, timeout=10_000)
    w2.review.scrub_to(3, mode="current")
    assert w2.viewer.frame_count == 4


def test_current_frame_mode_from_live_shows_the_newest_frame_only(qtbot, make_window, shared_data):
    w = make_window()
    _finished_run(qtbot, w, shared_data)
    per_frame = w.viewer.point_count // 12
    w.review.mode.setCurrentIndex(1)                  # "Current frame" while following
    assert w.review.reviewing and w.review.shown_upto == 11
    assert w.viewer.point_count == per_frame and w.viewer.frame_count == 12
    w.review.go_live()
    assert w.viewer.point_count == 12 * per_frame and w.review.current_mode() == "accumulated"

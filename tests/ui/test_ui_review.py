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
    assert v.frustum_count == 8 and not w.all_frustums.isChecked()
    lines = v.frustums._attrs["a_position"].host[: v.frustums.count].reshape(8, 16, 3)
    kf = np.array([v.scene.cam_keyframe[i] for i in range(8)])
    extent = np.ptp(lines, axis=1).max(axis=1)
    assert (extent[kf] > 0).all() and (extent[~kf] == 0).all()      # non-keyframes collapsed
    w.all_frustums.setChecked(True)
    lines = v.frustums._attrs["a_position"].host[: v.frustums.count].reshape(8, 16, 3)
    assert (np.ptp(lines, axis=1).max(axis=1) > 0).all() and v.frustum_count == 8
    assert v.trajectory.order > v.frustums.order                       # drawn last, over the rest
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

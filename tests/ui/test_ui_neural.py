"""The LingBot-Map engine through the GUI, with the tiny architecture (recipe weights, CPU):
the scale phase, every result drawn and stored, and the live KV page map from the real cache."""
import numpy as np

from tests.ui.conftest import wait_finished


def test_lingbot_tiny_run_shows_kv_page_map(qtbot, make_window, shared_data):
    from engine import available_engines, unavailable_engines
    assert "lingbot-map" in available_engines(), unavailable_engines()     # torch is a test dependency
    from engine import build_model
    from engine.models.recipe import fill_recipe
    w = make_window(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                    camera_iterations=2, keyframe_interval=1)
    w.model = fill_recipe(build_model("lingbot-map-tiny"))
    assert not w.settings_panel._rows["checkpoint"].isHidden()
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(8)
    w.start_run()
    s = wait_finished(qtbot, w, timeout=120_000)
    assert s["error"] is None and s["results"] == 8
    assert w.viewer.frame_count == 8 == w.viewer.frustum_count and w.viewer.point_count > 0
    w.monitors.refresh()
    codes = w.monitors.page_map_shown
    assert codes is not None
    counts = np.bincount(codes, minlength=5)
    assert counts[1] >= 1 and counts[2] >= 1          # scale and window pages in use
    assert "scale" in w.monitors.kv_title.text()
    assert not w.st_scale.isVisible()                 # no "arbitrary scale" note for this engine

"""Bad inputs give a clear message in the window (non-modal banner), never a crash, and the
app stays usable: a good run afterwards works."""

import pytest

from tests.ui.conftest import wait_finished


def _missing(tmp_path, data):
    return str(tmp_path / "no_such_video.mp4")


def _truncated(tmp_path, data):
    src = (data / "icl_livingroom_kt3" / "video.mp4").read_bytes()
    p = tmp_path / "cut.mp4"
    p.write_bytes(src[: len(src) // 4])
    return str(p)


def _empty(tmp_path, data):
    p = tmp_path / "empty"
    p.mkdir()
    return str(p)


def _not_images(tmp_path, data):
    p = tmp_path / "docs"
    p.mkdir()
    (p / "a.txt").write_text("hello")
    (p / "b.csv").write_text("1,2,3")
    return str(p)


def _no_webcam(tmp_path, data):
    return "webcam:7"


@pytest.mark.parametrize("make_input, words", [
    (_missing, "not found"), (_truncated, "truncated"), (_empty, "no image"),
    (_not_images, "no image"), (_no_webcam, "webcam 7"),
])
def test_bad_input_message_then_usable(qtbot, make_window, shared_data, tmp_path, make_input, words):
    w = make_window()
    w.set_input(make_input(tmp_path, shared_data))
    w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] and s["results"] == 0
    assert w.banner.isVisible() and w.banner.level == "error"
    assert words.lower() in w.banner.label.text().lower()
    assert not w.running and w.last_handle.thread.isFinished()
    # still usable
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(3)
    w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] is None and s["results"] == 3 and w.viewer.frame_count == 3
    assert not w.banner.isVisible()


def test_no_input_and_bad_settings(qtbot, make_window):
    w = make_window()
    w.set_input("")
    assert w.start_run() is False
    assert "choose an input" in w.banner.label.text().lower()
    w.set_input("/tmp")
    w.settings_panel.set_config(w.settings_panel.config().__class__(engine="geometric"))
    w.settings_panel.intrinsics.setText("1 2 three")
    assert w.start_run() is False
    assert "intrinsics" in w.banner.label.text().lower()
    assert not w.running


def test_export_without_session_warns(qtbot, make_window, tmp_path):
    w = make_window()
    assert w.export("ply", str(tmp_path / "x.ply")) is None
    assert "nothing to export" in w.banner.label.text().lower()
    assert w.open_session_folder(str(tmp_path / "nope")) is False
    assert w.banner.level == "error"


def test_neural_engine_without_checkpoint(qtbot, make_window, shared_data):
    w = make_window(engine="lingbot-map")
    assert w.settings_panel.engine_name() == "lingbot-map"
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.start_run()
    s = wait_finished(qtbot, w, timeout=120_000)
    assert s["error"] and "checkpoint" in w.banner.label.text().lower()
    assert not w.running

"""A second source in a second view (ui/second_view.py): both views receive frames, both sessions
store them in their own folders, closing the second view stops only it, and a bad second input
gives a clear message while the first stream keeps running."""
from pathlib import Path

from tests.ui.conftest import wait_finished


def _stored(folder):
    return len(list(Path(folder, "frames").glob("*.npz")))


def _video(shared_data, name="icl_livingroom_kt3"):
    return str(shared_data / name / "video.mp4")


def _start_first(qtbot, w, shared_data):
    w.set_input(_video(shared_data))
    w.loop.setChecked(True)                    # the first stream runs until stopped
    assert w.start_run()
    qtbot.waitUntil(lambda: w.viewer.frame_count >= 3, timeout=30_000)


def test_two_sources_two_views_two_sessions(qtbot, make_window, shared_data):
    w = make_window(extra={"delay_s": 0.01})
    _start_first(qtbot, w, shared_data)
    w.max_frames.setValue(15)                  # the second stream takes the transport's frame limit
    w.loop.setChecked(False)
    assert w.act_second in w.transport.actions() and w.act_second in w.menuBar().actions()[0].menu().actions()
    v = w.open_second_source(_video(shared_data, "7scenes_redkitchen_150_199"))
    assert v is not None and v in w.second_views
    with qtbot.waitSignal(v.runFinished, timeout=60_000) as done:
        pass
    second = done.args[0]
    assert second["error"] is None and second["results"] == 15
    assert v.viewer.frame_count == 15 and _stored(second["session"]) == 15
    assert v.preview.shown_index is not None                # its own input preview
    assert "15 frames" in v.monitor_text() and "engine" in v.monitor_text()
    assert w.running                                         # the first stream was not touched
    n = w.viewer.frame_count
    qtbot.waitUntil(lambda: w.viewer.frame_count > n, timeout=20_000)
    w.stop_run()
    first = wait_finished(qtbot, w)
    assert first["error"] is None and first["results"] == _stored(first["session"]) > 0
    assert Path(first["session"]).resolve() != Path(second["session"]).resolve()
    assert w.viewer.frame_count == first["results"]


def test_closing_second_view_stops_only_it(qtbot, make_window, shared_data):
    w = make_window(extra={"delay_s": 0.01})
    _start_first(qtbot, w, shared_data)
    v = w.open_second_source(_video(shared_data, "7scenes_redkitchen_150_199"))
    qtbot.waitUntil(lambda: v.viewer.frame_count >= 3, timeout=30_000)
    dock = v.parentWidget()
    while dock is not None and not hasattr(dock, "view"):
        dock = dock.parentWidget()
    dock.close()
    assert not v.running and v not in w.second_views
    assert w.running
    n = w.viewer.frame_count
    qtbot.waitUntil(lambda: w.viewer.frame_count > n, timeout=20_000)
    w.stop_run()
    assert wait_finished(qtbot, w)["error"] is None


def test_bad_second_source_keeps_first_running(qtbot, make_window, shared_data, tmp_path):
    w = make_window(extra={"delay_s": 0.01})
    _start_first(qtbot, w, shared_data)
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video at all" * 100)
    for spec, words in ((str(tmp_path / "missing.mp4"), "not found"), (str(bad), "broken.mp4")):
        v = w.open_second_source(spec)
        with qtbot.waitSignal(v.runFinished, timeout=30_000) as done:
            pass
        assert done.args[0]["error"] and words in done.args[0]["error"]
        assert v.error and words in v.viewer.hint.text()
        assert w.messages[-1][0] == "error" and words in w.messages[-1][1] and "Second view" in w.messages[-1][1]
        assert w.running
        n = w.viewer.frame_count
        qtbot.waitUntil(lambda: w.viewer.frame_count > n, timeout=20_000)
    assert w.open_second_source("") is None and w.messages[-1][0] == "warning"
    w.stop_run()
    assert wait_finished(qtbot, w)["error"] is None


def test_window_close_ends_second_stream(qtbot, make_window, shared_data):
    import threading
    w = make_window(extra={"delay_s": 0.01})
    w.set_input(_video(shared_data))
    w.loop.setChecked(True)
    v = w.open_second_source(_video(shared_data, "7scenes_redkitchen_150_199"))   # nothing else runs
    qtbot.waitUntil(lambda: v.viewer.frame_count >= 3, timeout=30_000)
    w.close()
    assert not v.running
    assert not [t for t in threading.enumerate() if t.name.startswith("reconstudio-")]


def test_lingbot_second_view_shares_the_model_and_batches(qtbot, make_window, shared_data):
    """Two LingBot-Map streams (tiny architecture, CPU): one network, their frames batched by the
    scheduler, every result in each view and each session folder."""
    from engine import build_model
    from engine.models.recipe import fill_recipe
    w = make_window(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                    camera_iterations=2, keyframe_interval=1)
    w.model = fill_recipe(build_model("lingbot-map-tiny"))
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(14)
    assert w.start_run()
    v = w.open_second_source(_video(shared_data, "7scenes_redkitchen_150_199"))
    with qtbot.waitSignal(v.runFinished, timeout=120_000) as done:
        pass
    first = wait_finished(qtbot, w, timeout=120_000)
    second = done.args[0]
    for s, view in ((first, w.viewer), (second, v.viewer)):
        assert s["error"] is None and s["results"] == 14 == _stored(s["session"]) == view.frame_count
    hubs = w.runs.stream_hubs
    (hub,) = hubs._hubs.values()
    assert hub.model is w.model and len(hub.sessions) == 2       # one network for both streams
    assert hub.scheduler.stats()["largest_batch"] == 2            # their frames shared forwards
    assert hubs.open_streams() == 0                               # both sessions closed at the end


def test_menu_dialog_opens_the_chosen_source(qtbot, make_window, shared_data, monkeypatch):
    from PySide6 import QtWidgets

    from ui import second_view
    w = make_window(extra={"delay_s": 0.01})
    w.max_frames.setValue(5)

    def accept(dlg):                                  # the user picks a video and presses Open
        dlg.panel.set_input(_video(shared_data, "7scenes_redkitchen_150_199"))
        return QtWidgets.QDialog.DialogCode.Accepted
    monkeypatch.setattr(second_view.SourceDialog, "exec", accept)
    w.act_second.trigger()
    (v,) = w.second_views
    with qtbot.waitSignal(v.runFinished, timeout=60_000) as done:
        pass
    assert done.args[0]["error"] is None and done.args[0]["results"] == 5 == v.viewer.frame_count
    assert not w.running                              # nothing else was started

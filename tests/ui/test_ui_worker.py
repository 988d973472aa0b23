"""Engine worker thread lifecycle through the real window: start, pause, step, resume, stop,
restart, close during a run; every result reaches the store and the viewer; no thread left."""
import json
import threading
import time
from pathlib import Path

from tests.ui.conftest import wait_finished


def _rgb(shared_data):
    return str(shared_data / "icl_livingroom_kt3" / "rgb")


def _stored(folder):
    return len(list(Path(folder, "frames").glob("*.npz")))


def test_step_pause_resume_stop(qtbot, make_window, shared_data):
    w = make_window(extra={"delay_s": 0.01})
    w.set_input(_rgb(shared_data))
    w.step()                                    # from idle: starts paused, one frame
    qtbot.waitUntil(lambda: w.viewer.frame_count == 1, timeout=20_000)
    h = w.runs.handle
    worker = h.worker
    assert worker.paused and w.running
    qtbot.wait(200)
    assert worker.frames_in == 1                # paused: nothing more is read
    w.step()
    qtbot.waitUntil(lambda: w.viewer.frame_count == 2, timeout=20_000)
    assert worker.frames_in == 2
    w.toggle_pause()                            # resume
    assert not worker.paused
    qtbot.waitUntil(lambda: w.viewer.frame_count >= 10, timeout=20_000)
    w.toggle_pause()                            # pause again
    assert worker.paused and w.act_pause.text() == "Resume"
    qtbot.wait(200)
    n = worker.frames_in
    qtbot.wait(200)
    assert worker.frames_in == n
    w.stop_run()
    summary = wait_finished(qtbot, w)
    assert summary["stopped"] and summary["error"] is None
    assert h.thread.isFinished() and not w.running
    assert not [t for t in threading.enumerate() if t.name.startswith("reconstudio-")]
    assert summary["results"] == summary["frames"] == _stored(summary["session"]) == w.viewer.frame_count
    info = json.loads(Path(summary["session"], "config.json").read_text())
    assert info["finished"] and info["engine"] == "ui-test"


def test_run_to_end_and_restart_resets_scene(qtbot, make_window, shared_data):
    w = make_window()
    w.set_input(_rgb(shared_data))
    w.max_frames.setValue(12)
    w.start_run()
    first = wait_finished(qtbot, w)
    assert first["results"] == 12 and w.viewer.frame_count == 12
    w.monitors.refresh()
    assert w.monitors.page_map_shown is not None and len(w.monitors.page_map_shown) == 10
    # the run driver's time per frame outside the engine: waiting for input, handing results on
    mon = w.monitors
    assert mon.wait_input.v and mon.output.v and mon.wait_input.in_legend and mon.output.in_legend
    assert min(mon.wait_input.v) >= 0 and min(mon.output.v) >= 0
    first_handle = w.last_handle
    w.max_frames.setValue(5)                    # new settings, start again: fresh scene
    w.start_run()
    second = wait_finished(qtbot, w)
    assert first_handle.thread.isFinished()
    assert second["results"] == 5 and w.viewer.frame_count == 5 and w.viewer.frustum_count == 5
    assert second["session"] != first["session"]


def test_slow_viewer_drops_display_updates_not_results(qtbot, make_window, shared_data):
    w = make_window()
    w.set_input(_rgb(shared_data))
    w.max_frames.setValue(60)
    batches = []

    def slow_gui(n):                           # a GUI thread that is busy on every batch
        batches.append(n)
        time.sleep(0.05)
    w.framesShown.connect(slow_gui)
    w.start_run()
    summary = wait_finished(qtbot, w)
    assert summary["results"] == 60 == _stored(summary["session"])
    assert w.viewer.frame_count == 60 and w.viewer.frustum_count == 60
    assert len(batches) < 60                   # results were coalesced into fewer updates


def test_close_during_run_ends_thread(qtbot, make_window, shared_data):
    w = make_window(extra={"delay_s": 0.05})
    w.set_input(_rgb(shared_data))
    w.start_run()
    qtbot.waitUntil(lambda: w.viewer.frame_count >= 3, timeout=20_000)
    h = w.runs.handle
    w.close()
    assert h.thread.isFinished()
    assert not [t for t in threading.enumerate() if t.name.startswith("reconstudio-")]
    folder = h.worker.session_folder
    info = json.loads(Path(folder, "config.json").read_text())
    assert info["finished"]                    # the store was closed cleanly
    assert _stored(folder) == h.worker.results_total


def test_realign_event_reaches_viewer(qtbot, make_window, shared_data):
    w = make_window(extra={"realign_at": 3})
    w.set_input(_rgb(shared_data))
    w.max_frames.setValue(6)
    w.start_run()
    wait_finished(qtbot, w)
    assert w.viewer.segments[0][1, 3] == 1.0
    events = Path(w.session_folder, "events.jsonl").read_text().splitlines()
    assert any(json.loads(e)["kind"] == "realign" for e in events)


def test_seek_then_step(qtbot, make_window, shared_data):
    w = make_window()
    w.set_input(_rgb(shared_data))
    w.seek_spin.setValue(100)                   # start frame
    w.step()
    qtbot.waitUntil(lambda: w.viewer.frame_count == 1, timeout=20_000)
    assert abs(w.viewer._last_frame.timestamp - 100 / 30) < 1e-6
    w.seek_to(150)                              # jump while running (paused)
    w.step()
    qtbot.waitUntil(lambda: w.viewer.frame_count == 2, timeout=20_000)
    assert abs(w.viewer._last_frame.timestamp - 150 / 30) < 1e-6
    w.stop_run()
    assert wait_finished(qtbot, w)["results"] == 2


def test_loop_replays_a_folder(qtbot, make_window, shared_data, tmp_path):
    import shutil
    folder = tmp_path / "three"
    folder.mkdir()
    for name in ("000000.jpg", "000001.jpg", "000002.jpg"):
        shutil.copy(shared_data / "icl_livingroom_kt3" / "rgb" / name, folder / name)
    w = make_window()
    w.set_input(str(folder))
    w.loop.setChecked(True)
    w.max_frames.setValue(7)
    w.start_run()
    s = wait_finished(qtbot, w)
    assert s["results"] == 7 and w.viewer.frame_count == 7
    assert w.viewer._last_frame.timestamp > 6 / 30 - 1e-6   # timestamps keep increasing

"""Long-run behaviour of the real window: `MainWindow.gui_stats()` (what `--stats-csv` records),
and a CI soak (see test_soak_...) that runs the GUI for minutes at neural-engine rates."""
import numpy as np

from tests.ui.conftest import wait_finished


def test_gui_stats_reports_viewer_and_event_loop(make_window, qtbot):
    w = make_window()
    first = w.gui_stats()
    assert set(first) == {"viewer_fps", "viewer_points", "viewer_buffer_bytes", "loop_gap_p99_ms"}
    assert first["loop_gap_p99_ms"] is None           # the first call starts the probe
    w.set_input(str(_sample()))
    w.max_frames.setValue(6)
    assert w.start_run()
    wait_finished(qtbot, w)
    qtbot.wait(1200)                                  # one viewer-FPS sample, many 10 ms ticks
    s = w.gui_stats()
    assert s["viewer_points"] == w.viewer.point_count > 0
    assert s["viewer_buffer_bytes"] >= 28 * s["viewer_points"]
    assert s["viewer_fps"] >= 0 and 5.0 <= s["loop_gap_p99_ms"] < 5000
    w.point_budget.setValue(0.1)                      # 100k points: saved with the display settings
    w.save_settings()
    assert w.settings.get("display/point_budget") == 100_000
    assert w.viewer.point_budget == 100_000


def _sample():
    from pathlib import Path
    return Path(__file__).resolve().parents[2] / "resources" / "sample" / "icl_livingroom_kt3.mp4"

"""`--stats-csv` in the GUI is written from a thread of its own: rows keep coming while the GUI
thread is blocked (issue #24: its timer was on the GUI thread, 771 rows in 1,199 s under load)."""
import csv
import time

from tests.conftest import REPO
from tests.ui.conftest import wait_finished

SAMPLE = REPO / "resources" / "sample" / "icl_livingroom_kt3.mp4"


def test_rows_keep_coming_while_the_gui_thread_is_blocked(make_window, qtbot, tmp_path):
    from engine.stats_csv import StatsRecorder
    from ui.stats_feed import StatsFeed

    w = make_window()
    feed = StatsFeed(w)
    path = tmp_path / "stats.csv"
    rec = StatsRecorder(path, feed.snapshot)
    w.runFinished.connect(lambda _s: rec.row_now())
    t0 = time.monotonic()
    w.set_input(str(SAMPLE))
    w.loop.setChecked(True)
    assert w.start_run()
    qtbot.waitUntil(lambda: w.viewer.frame_count > 0, timeout=30_000)
    qtbot.wait(1200)
    blocked_from = time.monotonic() - t0
    time.sleep(3.5)                                   # the GUI thread is stuck (a slot that blocks)
    blocked_to = time.monotonic() - t0
    qtbot.wait(1200)
    w.stop_run()
    wait_finished(qtbot, w)
    rec.close()
    rows = list(csv.DictReader(path.open()))
    # t_s counts from the recorder's start, a moment after t0: rows inside the block, with margin
    inside = [r for r in rows[:-1] if blocked_from + 0.2 < float(r["t_s"]) < blocked_to]
    assert len(inside) >= 2, [r["t_s"] for r in rows]
    gaps = [float(b["t_s"]) - float(a["t_s"]) for a, b in zip(rows[:-2], rows[1:-1])]
    assert max(gaps) < 2.5, gaps                       # about one a second (a loaded CI machine may delay one)
    assert all(r["frames"] != "" for r in inside)      # the engine's figures, from the worker thread
    assert rows[-1]["frames"] == str(w.last_summary["results"])   # the final counts
    assert not rec._t.is_alive() and rec.errors == 0

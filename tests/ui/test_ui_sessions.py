"""Sessions in the GUI: retention before a new run (never the session on screen), a cut-short
session says so when reopened, File > Sessions folder shows where runs go and their size, and
`reconstudio gui --loop --stats-csv` (the soak harness) on the synthetic engine."""
import csv
import os
import subprocess
import sys
import time

import numpy as np

from engine.api import FrameResult, SessionConfig
from engine.io.store import SessionStore
from tests.conftest import REPO
from tests.ui.conftest import wait_finished


def _old_session(folder, days, n=2, cut=None):
    s = SessionStore(folder, SessionConfig(), "old")
    for i in range(n):
        s.write(FrameResult(index=i, timestamp=i / 30, is_keyframe=True, c2w=np.eye(4),
                            K=np.array([[50.0, 0, 16], [0, 50, 12], [0, 0, 1]]),
                            image=np.full((24, 32, 3), 90, np.uint8), depth=np.ones((24, 32), np.float32)))
    if cut:
        s.mark_cut_short(cut)
    s.close()
    t = time.time() - days * 86400
    for p in (folder, folder / "config.json", folder / "frames"):
        os.utime(p, (t, t))


def test_retention_before_a_run_keeps_the_shown_session(qtbot, make_window, shared_data, tmp_path):
    root = tmp_path / "sessions"
    _old_session(root / "ancient", 90)
    _old_session(root / "shown", 90, cut="interrupted (SIGTERM) after 2 input frames")
    w = make_window()
    assert w.open_session_folder(str(root / "shown"))
    assert any("cut short" in m and "SIGTERM" in m for _, m in w.messages) or "cut short" in w.banner.label.text()
    c = w.settings_panel.config()               # opening took the session's settings
    c.engine = "ui-test"
    w.settings_panel.set_config(c)
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(3)
    w.start_run()
    s = wait_finished(qtbot, w)
    assert s["results"] == 3, s
    assert not (root / "ancient").exists() and (root / "shown").exists()     # on screen: kept
    dlg = w.sessions_dialog()
    assert str(root) in dlg.path_label.text() and "2 session(s)" in dlg.usage_label.text()
    dlg.max_days.setValue(0)
    dlg.max_gb.setValue(0)
    from app.settings import retention_limits
    assert retention_limits(w.settings) == (0.0, 0.0)                          # saved in the settings
    dlg.close()


def test_gui_loop_and_stats_csv_with_the_synthetic_engine(tmp_path, shared_data):
    folder = tmp_path / "two"
    folder.mkdir()
    import shutil
    for name in ("000000.jpg", "000001.jpg"):
        shutil.copy(shared_data / "icl_livingroom_kt3" / "rgb" / name, folder / name)
    stats = tmp_path / "stats.csv"
    cmd = [sys.executable, "-m", "app", "gui", "--settings", str(tmp_path / "s.ini"),
           "--session-dir", str(tmp_path / "sessions"), "--exit-when-done", "--input", str(folder), "--loop",
           "--engine", "synthetic", "--synthetic-fps", "30", "--max-frames", "75", "--autostart",
           "--stats-csv", str(stats)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    (session,) = list((tmp_path / "sessions").iterdir())
    assert len(list((session / "frames").glob("*.npz"))) == 75                 # looped 2 images 37x
    rows = list(csv.DictReader(open(stats)))
    assert len(rows) >= 2 and rows[-1]["frames"] == "75" and float(rows[-1]["rss_mb"]) > 50

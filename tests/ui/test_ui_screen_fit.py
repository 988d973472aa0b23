"""The first window fits a 1280x720 screen (at most 90 % of its available geometry) and its layout
stays usable there: monitors, review bar and status bar on screen, a timeline wide enough to
scrub (issue #24: the window was larger than the screen and the timeline ~100 px wide).

Each case runs in its own X server of that size (xvfb-run), since the suite's server is larger."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="needs xvfb-run")

PROBE = r"""
import json, sys
from PySide6 import QtCore, QtWidgets
from app.settings import AppSettings
app = QtWidgets.QApplication([])
from ui.main_window import MainWindow
from ui.style import apply_style
from ui.window_fit import place_first_window
apply_style(app)
w = MainWindow(settings=AppSettings(sys.argv[1]))
place_first_window(w)
w.show()
for _ in range(3):
    app.processEvents()
    QtCore.QThread.msleep(100)
def rect(widget):
    top_left = widget.mapTo(w, QtCore.QPoint(0, 0))
    g = QtCore.QRect(w.geometry().topLeft() + top_left, widget.size())
    return [g.x(), g.y(), g.width(), g.height(), widget.isVisible()]
a = w.screen().availableGeometry()
print(json.dumps({"available": [a.x(), a.y(), a.width(), a.height()],
                  "window": rect(w), "monitors": rect(w.monitors), "review": rect(w.review),
                  "status": rect(w.statusBar()), "slider": rect(w.review.slider),
                  "viewer": rect(w.viewer), "plot_h": w.monitors.plots.height()}))
w.grab().save(sys.argv[2])
"""


def _inside(r, a):
    x, y, wd, h, visible = r
    return visible and x >= a[0] and y >= a[1] and x + wd <= a[0] + a[2] and y + h <= a[1] + a[3]


@pytest.mark.parametrize("screen", ["1280x720", "1920x1080"])
def test_first_window_fits_the_screen(tmp_path, screen):
    shot = tmp_path / "window.png"
    out = subprocess.run(["xvfb-run", "-a", "-s", f"-screen 0 {screen}x24", sys.executable, "-c", PROBE,
                          str(tmp_path / "s.ini"), str(shot)], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "QT_QPA_PLATFORM": "xcb"})
    assert out.returncode == 0, out.stderr[-2000:]
    g = json.loads(out.stdout.strip().splitlines()[-1])
    a = g["available"]
    x, y, w, h, _ = g["window"]
    assert w <= 0.9 * a[2] + 1 and h <= 0.9 * a[3] + 1, g
    assert _inside(g["window"], a), g
    for part in ("monitors", "review", "status", "viewer"):
        assert _inside(g[part], a), (part, g)
    assert g["slider"][2] >= 300, g                   # the timeline can be scrubbed
    assert g["plot_h"] >= 90 and g["viewer"][3] >= 300, g
    if screen == "1920x1080":
        assert (w, h) == (1600, 972), g               # the designed size where it fits (972 = 0.9 x 1080)
    assert shot.stat().st_size > 10_000


def test_scripted_gui_first_window_at_1280x720(tmp_path):
    """The same through `reconstudio gui` (no saved geometry): its window screenshot is the window."""
    from PIL import Image
    shot = tmp_path / "win.png"
    out = subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1280x720x24", sys.executable, "-m", "app", "gui",
                          "--settings", str(tmp_path / "s.ini"), "--exit-when-done", "--window-screenshot", str(shot)],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "QT_QPA_PLATFORM": "xcb"})
    assert out.returncode == 0, out.stderr[-2000:]
    w, h = Image.open(shot).size
    assert w <= 1152 and h <= 648

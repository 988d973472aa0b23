"""`reconstudio gui` scripted runs: autostart → screenshot → exit; a bad input exits 1."""
import subprocess
import sys

import numpy as np
from PIL import Image

from tests.conftest import REPO


def _gui(tmp_path, *args):
    cmd = [sys.executable, "-m", "app", "gui", "--settings", str(tmp_path / "s.ini"),
           "--session-dir", str(tmp_path / "sessions"), "--exit-when-done", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_scripted_gui_run_with_screenshot(tmp_path, shared_data):
    shot, win = tmp_path / "shot.png", tmp_path / "win.png"
    out = _gui(tmp_path, "--input", str(shared_data / "icl_livingroom_kt3" / "video.mp4"), "--engine", "geometric",
               "--autostart", "--max-frames", "60", "--screenshot", str(shot), "--window-screenshot", str(win))
    assert out.returncode == 0, out.stderr[-2000:]
    img = np.asarray(Image.open(shot))
    assert img[..., :3].std() > 10
    assert Image.open(win).size[0] >= 800
    assert len(list((tmp_path / "sessions").iterdir())) == 1


def test_scripted_gui_bad_input_exits_1(tmp_path):
    out = _gui(tmp_path, "--input", str(tmp_path / "missing.mp4"), "--autostart")
    assert out.returncode == 1

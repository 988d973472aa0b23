"""SIGTERM / SIGINT end a running GUI as they end `reconstudio run`: the run stops, its session is
closed and marked interrupted (no running.lock left), the settings are written, and the process
exits 143 / 130 with no traceback (issue #24)."""
import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

SAMPLE = REPO / "resources" / "sample" / "icl_livingroom_kt3.mp4"


def _frames(sessions):
    return sum(len(list(f.glob("*.npz"))) for f in sessions.glob("*/frames"))


def _start_gui(tmp_path):
    cmd = [sys.executable, "-m", "app", "gui", "--settings", str(tmp_path / "s.ini"),
           "--session-dir", str(tmp_path / "sessions"), "--input", str(SAMPLE), "--loop",
           "--engine", "synthetic", "--synthetic-fps", "20", "--autostart"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_signal_closes_the_session_saves_settings_and_exits(tmp_path, signum, code, name):
    sessions = tmp_path / "sessions"
    p = _start_gui(tmp_path)
    try:
        deadline = time.monotonic() + 240
        while _frames(sessions) < 10:               # the run has stored frames
            assert p.poll() is None, p.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no frames stored"
            time.sleep(0.5)
    except BaseException:
        p.kill()
        raise
    (tmp_path / "s.ini").unlink()                    # written at Start; must be written again at exit
    p.send_signal(signum)
    try:
        out, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    assert p.returncode == code, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    (folder,) = list(sessions.iterdir())
    info = json.loads((folder / "config.json").read_text())
    assert info["finished"], info
    assert info["cut_short"].startswith(f"interrupted ({name})"), info["cut_short"]
    assert info["frames"] == len(list((folder / "frames").glob("*.npz"))) >= 10
    assert not (folder / "running.lock").exists()
    settings = (tmp_path / "s.ini").read_text()          # rewritten at exit
    assert "geometry" in settings and "point_size" in settings

"""`reconstudio run` interrupted by SIGTERM / Ctrl-C (a real subprocess and a real signal): the
requested exports are written from what was done, the session is marked cut short, and a
re-export says so. Also: --stats-csv rows, and a failed start leaves no session folder."""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO


def _env(tmp_path):
    return {**os.environ, "OMP_NUM_THREADS": "1", "RECONSTUDIO_SESSIONS": str(tmp_path / "sessions"),
            "RECONSTUDIO_SETTINGS": str(tmp_path / "settings.ini"), "PYTHONPATH": str(REPO)}


@pytest.fixture
def three_images(tmp_path, shared_data):
    folder = tmp_path / "three"
    folder.mkdir()
    for name in ("000000.jpg", "000001.jpg", "000002.jpg"):
        shutil.copy(shared_data / "icl_livingroom_kt3" / "rgb" / name, folder / name)
    return folder


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_writes_exports_and_marks_cut_short(tmp_path, three_images, sig):
    sess, out = tmp_path / "sess", tmp_path / "out"
    cmd = [sys.executable, "-m", "app", "run", str(three_images), "--loop", "--engine", "synthetic",
           "--synthetic-fps", "40", "--session-dir", str(sess), "--ply", str(out / "c.ply"),
           "--trajectory", str(out / "t.txt"), "--stats-csv", str(out / "stats.csv"), "--quiet"]
    p = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(list((sess / "frames").glob("*.npz"))) < 15:
        time.sleep(0.1)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    info = json.loads((sess / "config.json").read_text())
    assert info["finished"] and name in info["cut_short"]
    stored = len(list((sess / "frames").glob("*.npz")))
    assert stored >= 15 and info["frames"] == stored
    assert not list(sess.rglob("*.tmp")) and not (sess / "running.lock").exists()
    poses = [ln for ln in (out / "t.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(poses) == stored                       # every frame done is exported
    assert (out / "c.ply").stat().st_size > 1000
    rows = list(csv.DictReader(open(out / "stats.csv")))
    assert rows and rows[0].keys() >= {"frames", "engine_fps", "rss_mb", "dropped", "viewer_points"}
    assert float(rows[-1]["rss_mb"]) > 10 and rows[-1]["viewer_points"] == ""
    # a re-export of the cut-short session says so
    r = subprocess.run([sys.executable, "-m", "app", "run", str(sess), "--trajectory", str(out / "t2.txt")],
                       cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "cut short" in r.stderr and name in r.stderr


def test_failed_start_leaves_no_session_folder(tmp_path, shared_data):
    bad = tmp_path / "tiny"
    bad.mkdir()
    import numpy as np
    import cv2
    cv2.imwrite(str(bad / "a.png"), np.zeros((8, 8, 3), np.uint8))    # too small for the engine
    r = subprocess.run([sys.executable, "-m", "app", "run", str(bad), "--engine", "geometric", "--quiet"],
                       cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "too small" in r.stderr
    root = tmp_path / "sessions"
    assert not root.exists() or not any(root.iterdir())


def test_signal_during_the_exports_leaves_each_whole_or_absent(tmp_path, three_images):
    """A stop signal while `run` writes its exports (e.g. the second SIGTERM of a stop grace):
    the export being written is removed with its temp file, the ones written before stay whole."""
    from plyfile import PlyData

    sess, out = tmp_path / "sess", tmp_path / "out"
    subprocess.run([sys.executable, "-m", "app", "run", str(three_images), "--loop", "--engine", "synthetic",
                    "--max-frames", "40", "--session-dir", str(sess), "--quiet"],
                   cwd=REPO, env=_env(tmp_path), check=True, timeout=300)
    cmd = [sys.executable, "-m", "app", "run", str(sess), "--trajectory", str(out / "t.txt"),
           "--ply", str(out / "c.ply"), "--npz", str(out / "a.npz"), "--stride", "1", "--quiet"]
    p = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and not list(out.glob(".a.npz.*.tmp")):
        time.sleep(0.02)                 # the NPZ (written last) has started
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))
    assert len((out / "t.txt").read_text().splitlines()) == 40                # whole
    assert len(PlyData.read(str(out / "c.ply"))["vertex"].data) > 1000        # whole
    assert not (out / "a.npz").exists()                                       # absent

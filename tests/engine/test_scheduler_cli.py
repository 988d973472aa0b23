"""`reconstudio run A B`: several inputs through the stream scheduler (app/cmd_run.py, `run_many`)."""
import numpy as np
import pytest
import torch
from PIL import Image

from app.cli import main
from engine.model_zoo import build_model
from engine.models.recipe import fill_recipe


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    torch.save(fill_recipe(build_model("lingbot-map-tiny")).state_dict(), path)
    return str(path)


def _folder(root, name, seed, n=5, shape=(60, 80, 3)):
    d = root / name
    d.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(d / f"{i:03d}.png")
    return str(d)


ENGINE = ["--engine", "lingbot-map", "--model", "lingbot-map-tiny", "--device", "cpu", "--image-width", "70",
          "--scale-frames", "2", "--window", "3", "--special-cap", "16", "--camera-iterations", "2", "-q"]


def _tum(path):
    return np.loadtxt(path, comments="#")


def test_two_inputs_run_batched_and_match_single_runs(tmp_path, tiny_ckpt):
    a = _folder(tmp_path, "a", 1)
    b = _folder(tmp_path, "b", 2, n=4, shape=(60, 100, 3))
    rc = main(["run", a, b, "--checkpoint", tiny_ckpt, *ENGINE, "--session-dir", str(tmp_path / "multi"),
               "--trajectory", str(tmp_path / "traj.txt")])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "multi").iterdir()) == ["0-a", "1-b"]
    multi = {n: _tum(tmp_path / f"traj-{n}.txt") for n in ("0-a", "1-b")}
    assert multi["0-a"].shape[0] == 5 and multi["1-b"].shape[0] == 4
    for n, src in (("0-a", a), ("1-b", b)):
        assert main(["run", src, "--checkpoint", tiny_ckpt, *ENGINE, "--session-dir", str(tmp_path / f"one{n}"),
                     "--trajectory", str(tmp_path / f"one{n}.txt")]) == 0
        np.testing.assert_allclose(multi[n], _tum(tmp_path / f"one{n}.txt"), rtol=1e-5, atol=1e-5)


def test_stats_json_is_written_per_input_and_stats_csv_refused(tmp_path, tiny_ckpt, capsys):
    import json
    a, b = _folder(tmp_path, "a", 1, n=4), _folder(tmp_path, "b", 2, n=3)
    rc = main(["run", a, b, "--checkpoint", tiny_ckpt, *ENGINE, "--session-dir", str(tmp_path / "m"),
               "--stats-json", str(tmp_path / "st.json")])
    assert rc == 0
    for name, n in (("0-a", 4), ("1-b", 3)):
        body = json.loads((tmp_path / f"st-{name}.json").read_text())
        assert body["driver"]["frames_in"] == n and body["driver"]["results_total"] == n
        assert body["driver"]["stream"]["name"] == name and body["driver"]["scheduler"]["rounds"] >= 4
        assert body["engine"]["frames"] == n and body["engine"]["kv"]["frames_committed"] == n
        assert "kv_page_map" not in body["engine"]
    capsys.readouterr()
    rc = main(["run", a, b, "--checkpoint", tiny_ckpt, *ENGINE, "--session-dir", str(tmp_path / "m2"),
               "--stats-csv", str(tmp_path / "st.csv")])
    assert rc == 2 and "--stats-csv records one input" in capsys.readouterr().err
    assert not (tmp_path / "st.csv").exists() and not (tmp_path / "m2").exists()


def test_several_inputs_need_lingbot_map(tmp_path, capsys):
    a, b = _folder(tmp_path, "a", 1, n=2), _folder(tmp_path, "b", 2, n=2)
    assert main(["run", a, b, "--engine", "geometric", "-q"]) == 2
    assert "batches LingBot-Map streams" in capsys.readouterr().err


def test_ctrl_c_stops_every_input_keeps_and_exports_what_was_done(tmp_path, tiny_ckpt):
    """Several inputs run on driver threads: a real SIGINT stops them all after their current frame;
    each session is marked cut short and exported from what it holds (exit 130)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    a, b = _folder(tmp_path, "a", 1, n=40), _folder(tmp_path, "b", 2, n=40)
    sess = tmp_path / "m"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "RECONSTUDIO_SETTINGS": str(tmp_path / "settings.ini")}
    cmd = [sys.executable, "-m", "app", "run", a, b, "--checkpoint", tiny_ckpt, *ENGINE, "--fps", "10",
           "--speed", "1", "--session-dir", str(sess), "--trajectory", str(tmp_path / "t.txt")]
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not all(
            len(list((sess / n / "frames").glob("*.npz"))) >= 3 for n in ("0-a", "1-b")):
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    for n in ("0-a", "1-b"):
        info = json.loads((sess / n / "config.json").read_text())
        stored = len(list((sess / n / "frames").glob("*.npz")))
        assert info["finished"] and "Ctrl-C" in info["cut_short"] and 3 <= stored < 40
        assert _tum(tmp_path / f"t-{n}.txt").shape[0] == stored == info["frames"]

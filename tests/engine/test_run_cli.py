"""`reconstudio run` end to end through app.cli.main: a small deterministic engine registered
here (no model, no geometric tracker) drives the whole pipeline — source, store, exports — and
bad inputs must give one error line and exit code 2."""
import numpy as np
import pytest

from app.cli import main
from engine.api import EngineEvent, FrameResult, register_engine
from engine.io.export import read_tum
from engine.io.store import load_session

SHIFT = np.array([0.0, 0.0, 3.0])


class _LineEngine:
    """Camera moving along x; depth = a tilted plane at 48x64; buffers the first 3 frames like a
    scale phase; frames from index 6 on are segment 1, which is re-aligned (moved by SHIFT) once."""

    def __init__(self, config, model=None):
        self.config = config
        self.pending, self.events, self.n = [], [], 0
        self.realigned = False

    def _result(self, image, t):
        i = self.n
        self.n += 1
        c2w = np.eye(4)
        c2w[0, 3] = 0.05 * i
        small = image[::10, ::10][:48, :64]
        yy, xx = np.mgrid[0:48, 0:64]
        return FrameResult(index=i, timestamp=t, is_keyframe=i % 2 == 0, c2w=c2w,
                           K=np.array([[50.0, 0, 31.5], [0, 50.0, 23.5], [0, 0, 1]]),
                           image=np.ascontiguousarray(small), depth=(2.0 + 0.01 * xx).astype(np.float32),
                           conf=(1.0 + (yy % 3)).astype(np.float32), segment=int(i >= 6))

    def push(self, frame, timestamp=None):
        self.pending.append(self._result(frame, timestamp))
        if self.n < 3:
            return []
        out, self.pending = self.pending, []
        if self.n >= 8 and not self.realigned:
            T = np.eye(4)
            T[:3, 3] = SHIFT
            self.events.append(EngineEvent("realign", 1, T))
            self.realigned = True
        return out

    def flush(self):
        out, self.pending = self.pending, []
        return out

    def stats(self):
        return {"frames": self.n, "fps": 123.0, "kv": {"pages": np.int64(4)},
                "kv_page_map": np.zeros(8, np.int8)}

    def poll_events(self):
        out, self.events = self.events, []
        return out

    def close(self):
        pass


register_engine("io-test", _LineEngine, {"label": "io test", "needs_checkpoint": False, "devices": ["cpu"]})


@pytest.fixture
def clip(shared_data):
    return str(shared_data / "icl_livingroom_kt3" / "video.mp4")


def test_run_writes_session_and_exports(clip, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", clip, "--engine", "io-test", "--max-frames", "10", "--stride", "1",
               "--conf-threshold", "2", "--ply", str(out / "a.ply"), "--npz", str(out / "a.npz"),
               "--trajectory", str(out / "t.txt"), "--session-dir", str(tmp_path / "sess")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "wrote" in err and "10 frames" in err

    s = load_session(tmp_path / "sess")
    assert s.complete and [r.index for r in s.results] == list(range(10))
    assert s.info["meta"]["kind"] == "video" and s.config.engine == "io-test"
    assert s.config.intrinsics_file.endswith("icl_livingroom_kt3/intrinsics.txt")
    assert [e.kind for e in s.events] == ["realign"]

    t, c2w = read_tum(out / "t.txt")
    assert len(t) == 10
    np.testing.assert_allclose(t, np.arange(10) / 30.0, atol=1e-6)       # video time
    expect_x = 0.05 * np.arange(10)
    np.testing.assert_allclose(c2w[:, 0, 3], expect_x, atol=1e-7)
    np.testing.assert_allclose(c2w[:, 2, 3], [0] * 6 + [3] * 4, atol=1e-7)   # segment 1 re-aligned

    z = np.load(out / "a.npz")
    assert z["c2w"].shape == (10, 4, 4) and z["depth"].shape == (10, 48, 64)
    # conf 1,2,3 by row: threshold 2 keeps 2 of 3 rows, stride 1 keeps every column
    per_frame = 64 * sum(1 for y in range(48) if 1 + y % 3 >= 2)
    assert z["points"].shape == (10 * per_frame, 3)
    from plyfile import PlyData
    v = PlyData.read(str(out / "a.ply"))["vertex"].data
    assert len(v) == 10 * per_frame
    np.testing.assert_array_equal(np.stack([v["x"], v["y"], v["z"]], 1), z["points"])


def test_run_writes_the_engines_final_stats_as_json(clip, tmp_path, capsys):
    import json
    path = tmp_path / "stats.json"
    rc = main(["run", clip, "--engine", "io-test", "--max-frames", "7", "--quiet", "--stats-json", str(path),
               "--session-dir", str(tmp_path / "sess")])
    assert rc == 0, capsys.readouterr().err
    body = json.loads(path.read_text())
    assert body["engine"]["frames"] == 7 and body["engine"]["kv"] == {"pages": 4}
    assert "kv_page_map" not in body["engine"]                       # the per-page map stays out
    assert body["driver"]["frames_in"] == 7 and body["driver"]["results_total"] == 7
    assert body["driver"]["push_ms"] is not None
    (tmp_path / "a_file").write_text("x")
    rc = main(["run", clip, "--engine", "io-test", "--stats-json", str(tmp_path / "a_file" / "s.json")])
    assert rc == 2 and "--stats-json" in capsys.readouterr().err       # checked before the run


def test_reexport_a_saved_session(clip, tmp_path, capsys):
    assert main(["run", clip, "--engine", "io-test", "--max-frames", "6", "-q",
                 "--session-dir", str(tmp_path / "sess")]) == 0
    rc = main(["run", str(tmp_path / "sess"), "--stride", "4", "--conf-threshold", "3",
               "--npz", str(tmp_path / "again.npz"), "--trajectory", str(tmp_path / "again.txt")])
    assert rc == 0, capsys.readouterr().err
    z = np.load(tmp_path / "again.npz")
    assert z["c2w"].shape == (6, 4, 4)
    assert len(z["points"]) == 6 * 16 * sum(1 for y in range(0, 48, 4) if 1 + y % 3 >= 3)
    assert len(read_tum(tmp_path / "again.txt")[0]) == 6
    assert main(["run", str(tmp_path / "sess")]) == 2          # nothing asked for
    assert "give --ply" in capsys.readouterr().err


def test_run_default_session_root_and_folder_input(shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RECONSTUDIO_SESSIONS", str(tmp_path / "root"))
    rc = main(["run", str(shared_data / "icl_livingroom_kt3" / "rgb"), "--engine", "io-test",
               "--max-frames", "4", "--fps", "10", "-q", "--trajectory", str(tmp_path / "t.txt")])
    assert rc == 0, capsys.readouterr().err
    (folder,) = (tmp_path / "root").iterdir()
    assert folder.name.endswith("_rgb")
    t, _ = read_tum(tmp_path / "t.txt")
    np.testing.assert_allclose(t, [0.0, 0.1, 0.2, 0.3])


@pytest.mark.parametrize("argv, message", [
    (["run", "/nonexistent/clip.mp4"], "not found"),
    (["run", "{clip}", "--engine", "no-such-engine"], "unknown engine"),
    (["run", "{clip}", "--engine", "io-test", "--intrinsics", "1,2,3"], "6 numbers"),
    (["run", "{clip}", "--engine", "io-test", "--intrinsics", "/nonexistent/intr.txt"], "not found"),
    (["run", "{clip}", "--engine", "io-test", "--ply", "{file}/x.ply"], "cannot write"),
    (["run", "{clip}", "--engine", "io-test", "--stride", "0"], "--stride"),
    (["run", "{clip}", "--engine", "io-test", "--prefetch", "-1"], "--prefetch must be 0 or more"),
    (["run", "webcam:97", "--engine", "io-test"], "Webcam 97 is not available"),
    (["run", "{empty}"], "No images"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, clip, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    (tmp_path / "empty").mkdir()
    argv = [a.format(clip=clip, file=blocker, empty=tmp_path / "empty") for a in argv]
    rc = main(argv + ["--session-dir", str(tmp_path / "sess")])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("reconstudio run: error:")


def test_run_with_the_default_geometric_engine(clip, tmp_path, capsys):
    """The real default engine on the first 60 frames of the clip: every output is written and
    consistent with the session store it came from."""
    rc = main(["run", clip, "--max-frames", "60", "--ply", str(tmp_path / "g.ply"),
               "--npz", str(tmp_path / "g.npz"), "--trajectory", str(tmp_path / "g.txt"),
               "--session-dir", str(tmp_path / "sess")])
    err = capsys.readouterr().err
    assert rc == 0, err
    s = load_session(tmp_path / "sess")
    assert s.config.engine == "geometric" and s.complete
    n = len(s.results)
    assert 0 < n <= 60
    t, c2w = read_tum(tmp_path / "g.txt")
    assert len(t) == n and np.all(np.diff(t) > 0)
    z = np.load(tmp_path / "g.npz")
    assert z["c2w"].shape == (n, 4, 4) and z["timestamps"].shape == (n,)
    assert z["depth"].shape[0] == n and z["conf"].shape == z["depth"].shape and z["has_depth"].any()
    assert (z["depth"][~z["has_depth"]] == 0).all()
    from plyfile import PlyData
    v = PlyData.read(str(tmp_path / "g.ply"))["vertex"].data
    assert len(v) == len(z["points"]) > 0
    assert np.isfinite(z["points"]).all()


SIGINT_CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from engine.api import FrameResult, register_engine
class Slow:
    def __init__(self, config, model=None):
        self.config, self.n = config, 0
    def push(self, frame, timestamp=None):
        time.sleep(0.02)          # slow enough that the interrupt lands mid-run
        self.n += 1
        return [FrameResult(self.n - 1, timestamp, True, np.eye(4), np.eye(3), frame[::20, ::20],
                            np.ones((24, 32), np.float32), None)]
    def flush(self): return []
    def stats(self): return {"fps": None}
    def poll_events(self): return []
    def close(self): pass
register_engine("slow-test", Slow, {"devices": ["cpu"]})
from app.cli import main
sys.exit(main(["run", sys.argv[2], "--engine", "slow-test", "--session-dir", sys.argv[3],
              "--trajectory", sys.argv[4]]))
"""


def test_ctrl_c_keeps_and_exports_what_was_done(shared_data, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from tests.conftest import REPO
    rgb = shared_data / "icl_livingroom_kt3" / "rgb"
    sess, traj = tmp_path / "sess", tmp_path / "t.txt"
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_CHILD, str(REPO), str(rgb), str(sess), str(traj)],
                            stderr=subprocess.PIPE, text=True)
    try:
        frames = sess / "frames"
        while proc.poll() is None and len(list(frames.glob("*.npz")) if frames.is_dir() else []) < 5:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    n = len(load_session(sess).results)
    assert 5 <= n < 200
    assert len(read_tum(traj)[0]) == n

"""Evaluation tooling: sequence loading, the report, the TUM trajectory and `reconstudio eval`."""
import json
import shutil

import cv2
import numpy as np
import pytest

from tests.engine.accuracy import check
from engine.evaluate import SequenceError, _gt_depth_on_grid, evaluate_sequence, load_sequence


def _mini_sequence(src, dst, frames):
    """A copy of part of a shared sequence in the README layout."""
    (dst / "rgb").mkdir(parents=True)
    seq = load_sequence(src)
    lines = [l for l in (src / "groundtruth.txt").read_text().splitlines() if not l.startswith("#")]
    for k, i in enumerate(frames):
        shutil.copy(seq.frames[i], dst / "rgb" / f"{k:06d}.jpg")
    (dst / "groundtruth.txt").write_text("# t tx ty tz qx qy qz qw\n" + "\n".join(lines[i] for i in frames) + "\n")
    shutil.copy(src / "intrinsics.txt", dst / "intrinsics.txt")
    return dst


def test_load_sequence_layout(shared_data):
    seq = load_sequence(shared_data / "7scenes_redkitchen_150_199")
    assert len(seq) == 50 and seq.gt_c2w.shape == (50, 4, 4) and len(seq.depth_files) == 50
    assert seq.intrinsics.fx == 525 and seq.depth_intrinsics.fx == 585   # from the file's comment
    assert seq.timestamps[1] - seq.timestamps[0] == pytest.approx(1 / 30, abs=1e-5)


def test_bad_sequences_give_clear_errors(tmp_path, shared_data):
    with pytest.raises(SequenceError, match="not found"):
        load_sequence(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SequenceError, match="no images"):
        load_sequence(tmp_path / "empty")
    seq = _mini_sequence(shared_data / "icl_livingroom_kt3", tmp_path / "s", range(5))
    (seq / "groundtruth.txt").write_text("0 1 2 3\n")
    with pytest.raises(SequenceError, match="8 numbers"):
        load_sequence(seq)
    (seq / "groundtruth.txt").unlink()
    with pytest.raises(SequenceError, match="groundtruth.txt"):
        load_sequence(seq)


def test_gt_depth_resampling_between_cameras():
    K_gt = np.array([[585.0, 0, 320], [0, 585.0, 240], [0, 0, 1]])
    K_res = np.array([[262.5, 0, 159.75], [0, 262.5, 119.75], [0, 0, 1]])   # 525 at half size
    gt = np.zeros((480, 640), np.uint16)
    gt[:, 320:] = 2000                       # right half of the depth camera at 2 m
    out = _gt_depth_on_grid(gt, K_gt, K_res, (320, 240))
    assert out.shape == (240, 320) and out.dtype == np.float32
    assert set(np.unique(out)) <= {0.0, 2.0}
    # same ray → same depth; the depth camera sees less (585 vs 525): beyond u ≈ 303 there is none
    assert out[20:220, 165:300].min() == 2.0 and out[:, :155].max() == 0.0 and out[:, 305:].max() == 0.0
    assert out[:10].max() == 0.0 and out[-10:].max() == 0.0


def test_evaluate_writes_trajectory_and_metrics(shared_data, tmp_path):
    seq = _mini_sequence(shared_data / "icl_livingroom_kt3", tmp_path / "icl", range(30, 90))
    traj = tmp_path / "out" / "traj.txt"
    traj.parent.mkdir()
    rep = evaluate_sequence(seq, trajectory=traj, max_frames=50)
    assert rep["frames"] == 50 and rep["posed"] == 50 and rep["coverage"] == 1.0
    assert rep["rpe_trans_m_per_s"] is not None
    check(("ATE m", rep["ate_rmse_m"], "<", 0.01))
    assert "depth_abs_rel" not in rep          # no depth folder
    rows = np.loadtxt(traj)
    gt_t = load_sequence(seq).timestamps[:50]
    assert rows.shape == (50, 8) and np.allclose(rows[:, 0], gt_t, atol=1e-5)   # input time stamps
    assert np.allclose(np.linalg.norm(rows[:, 4:], axis=1), 1.0, atol=1e-6)


def test_cli_eval_json_and_errors(shared_data, tmp_path, capsys):
    from app.cli import main
    seq = _mini_sequence(shared_data / "icl_livingroom_kt3", tmp_path / "icl", range(40, 80))
    assert main(["eval", str(seq), "--json", "-q", "--set", "depth=false"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["frames"] == 40 and rep["coverage"] == 1.0 and rep["ate_rmse_m"] < 0.01
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["eval", str(seq), "--intrinsics", "1,2,3"]) == 2
    assert "6 numbers" in capsys.readouterr().err


def test_any_engine_and_realignments_are_applied(shared_data, tmp_path, monkeypatch):
    """A stand-in engine that returns ground-truth poses, segment 1 displaced by a similarity it
    later announces as a "realign" event: the evaluation must apply it (ATE ≈ 0)."""
    from engine import api
    from engine.api import EngineEvent, FrameResult, SessionConfig

    seq_dir = _mini_sequence(shared_data / "icl_livingroom_kt3", tmp_path / "icl", range(0, 40))
    gt = load_sequence(seq_dir).gt_c2w
    S = np.eye(4)
    S[:3, :3] = 2.0 * np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1.0]])
    S[:3, 3] = [1.0, 2.0, 3.0]

    class Fake:
        def __init__(self, config, model=None):
            self.config, self.n, self.events = config, 0, []

        def push(self, frame, timestamp=None):
            i, self.n = self.n, self.n + 1
            c2w = gt[i].copy()
            seg = 0 if i < 20 else 1
            if seg:     # displaced: x → S x
                c2w[:3, :3] = S[:3, :3] / 2.0 @ c2w[:3, :3]
                c2w[:3, 3] = S[:3, :3] @ c2w[:3, 3] + S[:3, 3]
            if i == 39:
                self.events.append(EngineEvent("realign", 1, np.linalg.inv(S)))
            return [FrameResult(i, timestamp, False, c2w, np.eye(3), frame, segment=seg)]

        def flush(self):
            return []

        def poll_events(self):
            ev, self.events = self.events, []
            return ev

        def stats(self):
            return {"frames": self.n}

        def close(self):
            pass

    monkeypatch.setitem(api._FACTORIES, "test-fake", Fake)     # registered for this test only
    rep = evaluate_sequence(seq_dir, SessionConfig(engine="test-fake"))
    assert rep["posed"] == 40 and rep["segments"] == 2
    assert rep["ate_rmse_m"] < 1e-6

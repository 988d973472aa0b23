"""Ground truth beside a session (engine/ground_truth.py): `eval --session-dir` stores a session
that names its reference, the overlay aligns it by Sim(3) into the session's world, matches
frames by time or by line, and gives each frame's error in metres."""
import numpy as np
import pytest

from engine.ground_truth import (GroundTruthError, associate, error_colors, find_ground_truth,
                                 ground_truth_overlay)
from engine.io.export import export_tum
from engine.io.session_reader import read_session
from tests.engine.test_eval import _mini_sequence

S = np.eye(4)
S[:3, :3] = 0.5 * np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1.0]])
S[:3, 3] = [1.0, 2.0, 3.0]
BUMP = np.array([0.05, 0.0, 0.0])      # frame 10's centre displaced (session units) = 0.1 m


def _fake_engine(gt):
    from engine.api import FrameResult

    class Fake:
        """Ground-truth poses moved into another frame and scale (S), frame 10 displaced."""
        def __init__(self, config, model=None):
            self.n = 0

        def push(self, frame, timestamp=None):
            i, self.n = self.n, self.n + 1
            c2w = gt[i].copy()
            c2w[:3, :3] = S[:3, :3] / 0.5 @ c2w[:3, :3]
            c2w[:3, 3] = S[:3, :3] @ c2w[:3, 3] + S[:3, 3] + (BUMP if i == 10 else 0)
            return [FrameResult(i, timestamp, i % 5 == 0, c2w, np.eye(3), frame[::8, ::8].copy())]

        def flush(self):
            return []

        def poll_events(self):
            return []

        def stats(self):
            return {"frames": self.n}

        def close(self):
            pass
    return Fake


def test_eval_session_shows_its_ground_truth(shared_data, tmp_path, monkeypatch, capsys):
    from app.cli import main
    from engine import api
    from engine.evaluate import load_sequence

    seq = _mini_sequence(shared_data / "icl_livingroom_kt3", tmp_path / "icl", range(0, 200, 5))
    monkeypatch.setitem(api._FACTORIES, "gt-fake", _fake_engine(load_sequence(seq).gt_c2w))
    assert main(["eval", str(seq), "--engine", "gt-fake", "-q", "--session-dir", str(tmp_path / "sess")]) == 0
    reader = read_session(tmp_path / "sess")
    ref = find_ground_truth(reader.folder, reader.info)
    assert ref is not None and ref.samefile(seq / "groundtruth.txt")
    ov = ground_truth_overlay([p.index for p in reader.poses], [p.timestamp for p in reader.poses],
                              np.array([p.c2w for p in reader.poses]), ref)
    assert ov.association == "timestamp" and len(ov.indices) == 40
    assert abs(ov.scale - 2.0) < 0.01                      # session units -> metres
    worst = int(np.argmax(ov.errors_m))
    assert ov.indices[worst] == 10 and 0.08 < ov.errors_m[worst] < 0.11
    assert np.median(ov.errors_m) < 0.01
    # the reference lies on the estimate (session world) but where the estimate was displaced
    d = np.linalg.norm(ov.reference - ov.estimated, axis=1)
    assert np.median(d) < 0.005 and 0.04 < d[worst] < 0.055
    cols = error_colors(ov.errors_m)
    assert tuple(cols[worst]) == (255, 0, 0) and cols[np.argmin(ov.errors_m)][1] > 200


def test_run_session_finds_the_sequence_and_matches_by_line(shared_data, tmp_path):
    seq = _mini_sequence(shared_data / "icl_livingroom_kt3", tmp_path / "icl", range(0, 12))
    assert find_ground_truth(tmp_path, {"source": str(seq / "rgb")}) == seq / "groundtruth.txt"
    assert find_ground_truth(tmp_path, {"source": str(tmp_path / "elsewhere.mp4")}) is None
    from engine.evaluate import load_sequence
    gt = load_sequence(seq).gt_c2w
    est = gt.copy()
    est[:, :3, 3] *= 3.0
    ov = ground_truth_overlay(np.arange(12), 100.0 + np.arange(12) / 7.0, est, seq / "groundtruth.txt")
    assert ov.association == "index" and ov.errors_m.max() < 1e-9 and abs(ov.scale - 1 / 3) < 1e-9
    # a TUM file written by the exports (other timestamps, subset of the frames) matches by time
    from engine.api import FrameResult
    traj = tmp_path / "t.txt"
    ts = load_sequence(seq).timestamps
    export_tum(traj, [FrameResult(i, float(ts[i]), True, gt[i], np.eye(3), np.zeros((1, 1, 3), np.uint8))
                      for i in range(0, 12, 2)])
    pos, lines, how = associate(ts, np.arange(12), np.loadtxt(traj)[:, 0])
    assert how == "timestamp" and (pos == np.arange(0, 12, 2)).all() and (lines == pos // 2).all()


def test_unusable_reference_is_a_clear_message(tmp_path):
    bad = tmp_path / "gt.txt"
    bad.write_text("0 1 2 3\n")
    with pytest.raises(GroundTruthError, match="expected 8 numbers"):
        ground_truth_overlay([0, 1, 2], [0, 1, 2], np.tile(np.eye(4), (3, 1, 1)), bad)
    with pytest.raises(GroundTruthError, match="cannot read"):
        ground_truth_overlay([0, 1, 2], [0, 1, 2], np.tile(np.eye(4), (3, 1, 1)), tmp_path / "missing.txt")
    short = (np.array([100.0, 101.0]), np.tile(np.eye(4), (2, 1, 1)))
    with pytest.raises(GroundTruthError, match="matches 2 of the session's 5 frames"):
        ground_truth_overlay(np.arange(5), np.arange(5) * 1.0, np.tile(np.eye(4), (5, 1, 1)), short)

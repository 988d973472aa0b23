"""Focal-length self-calibration (engine/geometric/selfcal.py and the session's hold-and-replay):
synthetic tracks with a known focal length, the real ICL clip with no intrinsics, stated
intrinsics winning, and a clip that cannot be calibrated."""
import math

import numpy as np
import pytest

from engine.api import SessionConfig, open_session
from engine.geometric.selfcal import FocalEstimator
from engine.metrics import ate
from tests.engine.accuracy import check
from tests.engine.geometric_drift import rgb_sequence


def _synthetic_tracks(f, n=50, noise=0.3, seed=0, turn_deg=12.0, side=0.3):
    """Tracks (ids, uv) per frame of random points 2–6 m away seen by a 640×480 camera of focal
    length f that turns by `turn_deg` (yaw and some pitch) while moving `side` metres sideways."""
    from scipy.spatial.transform import Rotation
    rng = np.random.default_rng(seed)
    m = 600
    P = np.c_[rng.uniform(-4, 4, m), rng.uniform(-3, 3, m), rng.uniform(2, 6, m)]
    K = np.array([[f, 0, 319.5], [0, f, 239.5], [0, 0, 1.0]])
    out = []
    for k in range(n):
        a = k / (n - 1)
        R = Rotation.from_euler("yxz", [turn_deg * a, 0.4 * turn_deg * math.sin(3 * a), 2 * a], degrees=True).as_matrix()
        c = np.array([side * a, 0.05 * math.sin(4 * a), 0.1 * a])
        Xc = (P - c) @ R            # world → camera (camera-to-world rotation R)
        uv = Xc @ K.T
        uv = uv[:, :2] / uv[:, 2:]
        uv += rng.normal(0, noise, uv.shape)
        vis = (Xc[:, 2] > 0.1) & (uv[:, 0] > 5) & (uv[:, 0] < 635) & (uv[:, 1] > 5) & (uv[:, 1] < 475)
        out.append((np.flatnonzero(vis), uv[vis]))
    return out


@pytest.mark.parametrize("f_true", [420.0, 600.0])
def test_estimator_recovers_a_known_focal_length(f_true):
    est = FocalEstimator(640, 480)
    for ids, uv in _synthetic_tracks(f_true):
        est.add_frame(ids, uv)
    e = est.estimate()
    assert e is not None and e.pairs >= 20
    check(("relative focal error", abs(e.focal / f_true - 1.0), "<", 0.02),
          ("relative sigma", e.rel_sigma, "<", 0.02))
    # the reported spread is honest: the error is within a few sigma
    assert abs(e.focal - f_true) < 4 * e.sigma + 0.005 * f_true


def test_estimator_gives_up_without_motion():
    est = FocalEstimator(640, 480)
    ids, uv = _synthetic_tracks(500.0, n=2)[0]
    for _ in range(30):
        est.add_frame(ids, uv)          # a still camera: no pair has any flow
    assert est.estimate() is None


@pytest.fixture(scope="module")
def icl():
    return rgb_sequence("icl_livingroom_kt3", 100)


def test_session_self_calibrates_the_icl_clip(icl):
    seq, frames = icl
    s = open_session(SessionConfig(engine="geometric", loop_closure=False))   # no intrinsics
    res, held, about = [], [], []
    ev = []
    for f in frames:
        res += s.push(f)
        held.append(s.stats()["self_calibrating_frames"])
        new = s.poll_events()
        about += [(len(res), held[-1]) for e in new if e.message.startswith("Focal length about")]
        ev += new
    res += s.flush()
    st = s.stats()
    ev += s.poll_events()
    s.close()
    assert max(held) > 10 and st["self_calibrating_frames"] == 0     # shown in the view while held
    truth = 0.5 * (seq.intrinsics.fx + seq.intrinsics.fy)
    assert st["focal_source"] == "self-calibrated" and st["focal_sigma_px"] > 0
    assert any("self-calibrated" in e.message for e in ev if e.kind == "info")
    # the two-view estimate is announced once, while the frames are still held (no result yet)
    assert len(about) == 1 and about[0][0] == 0 and about[0][1] >= 20, about
    assert [r.index for r in res] == list(range(len(frames))), "held frames come back, in order"
    assert all(np.isclose(r.K[0, 0], st["focal_px"]) and np.isclose(r.K[1, 1], st["focal_px"]) for r in res)
    a = ate(np.array([r.c2w for r in res]), seq.gt_c2w[:len(frames)])
    check(("relative focal error", abs(st["focal_px"] / truth - 1.0), "<", 0.03),
          ("ATE m", a["rmse"], "<", 0.02))
    # with 100 frames the first keyframes pair up for depth
    assert sum(r.depth is not None for r in res if r.is_keyframe) >= 2


def test_stated_intrinsics_win(icl):
    seq, frames = icl
    given = (500.0, 500.0, 319.5, 239.5, 640, 480)     # deliberately not the truth
    s = open_session(SessionConfig(engine="geometric", intrinsics=given, loop_closure=False, depth=False))
    res = []
    for f in frames[:60]:
        res += s.push(f)
    st = s.stats()
    s.close()
    assert st["focal_source"] == "stated" and st["focal_sigma_px"] is None and st["focal_px"] == 500.0
    assert res and all(r.K[0, 0] == 500.0 for r in res)


def test_eval_without_intrinsics_reports_the_focal_error(shared_data):
    from engine.evaluate import evaluate_sequence, format_report
    rep = evaluate_sequence(shared_data / "icl_livingroom_kt3", SessionConfig(depth=False, loop_closure=False),
                            max_frames=70, use_intrinsics=False)
    assert rep["intrinsics_used"] is False and rep["focal_source"] == "self-calibrated"
    assert rep["focal_true_px"] == pytest.approx(480.6, abs=0.1)
    assert rep["focal_error"] == pytest.approx(rep["focal_px"] / rep["focal_true_px"] - 1)
    check(("relative focal error", abs(rep["focal_error"]), "<", 0.03))
    assert "self-calibrated" in format_report(rep)
    cal = evaluate_sequence(shared_data / "icl_livingroom_kt3", SessionConfig(depth=False, loop_closure=False),
                            max_frames=50)
    assert cal["focal_source"] == "stated" and cal["focal_error"] == pytest.approx(0.0012, abs=1e-3)


def test_a_still_clip_falls_back_to_the_assumed_fov(icl):
    _, frames = icl
    s = open_session(SessionConfig(engine="geometric", depth=False, loop_closure=False))
    for _ in range(65):
        s.push(frames[0])
    s.flush()
    ev = s.poll_events()
    st = s.stats()
    s.close()
    assert any(e.kind == "warning" and "could not be self-calibrated" in e.message for e in ev)
    assert st["focal_source"] == "assumed"
    assert st["focal_px"] == pytest.approx(320 / math.tan(math.radians(30)), rel=1e-6)


def test_a_short_clip_without_intrinsics_gets_depth(icl):
    # 60 frames of a start that mostly turns: the keyframes pair with posed frames (a shorter
    # baseline as the last resort) instead of going out without depth
    _, frames = icl
    s = open_session(SessionConfig(engine="geometric", loop_closure=False))
    res = []
    for f in frames[:60]:
        res += s.push(f)
    res += s.flush()
    s.close()
    kd = [r for r in res if r.is_keyframe and r.depth is not None]
    assert len(res) == 60 and len(kd) >= 2
    # the exporter's default stride 2 keeps a quarter of these: ≥ 10,000 points wanted
    check(("depth pixels", sum(int((r.depth > 0).sum()) for r in kd), ">", 40000))


@pytest.mark.parametrize("n", [100, 130])
def test_a_self_calibrated_run_is_the_run_given_its_focal_length(icl, n):
    """The held frames are tracked again after the hold (not their held tracks replayed), so a
    run without intrinsics is, frame for frame, the run given the self-calibrated focal length:
    how the hold detected its corners leaves no trace in the trajectory. With 100 frames the hold
    ends at the end of the stream (flush), with 130 while frames still arrive (the scratch map
    reaches its keyframes at frame 114 of this clip)."""
    seq, frames = icl if n == len(icl[1]) else rgb_sequence("icl_livingroom_kt3", n)

    def run(**kw):
        s = open_session(SessionConfig(engine="geometric", depth=False, **kw))
        res = []
        for f in frames:
            res += s.push(f)
        live = len(res)              # results before the end of the stream
        res += s.flush()
        st = s.stats()
        s.close()
        return res, st, live

    res, st, live = run()
    assert st["focal_source"] == "self-calibrated"
    assert (live > 0) == (n == 130), "the hold ends at flush for 100 frames, while pushing for 130"
    f = st["focal_px"]
    given, st2, _ = run(intrinsics=(f, f, 319.5, 239.5, 640, 480))
    assert st2["focal_source"] == "stated"
    assert [r.index for r in res] == [r.index for r in given] == list(range(len(frames)))
    assert [r.is_keyframe for r in res] == [r.is_keyframe for r in given]
    diff = max(float(np.abs(a.c2w - b.c2w).max()) for a, b in zip(res, given))
    assert diff < 1e-9, diff

"""Loop closure in the geometric engine: verification with a known answer, the correction
pipeline on real frames (ICL forward then backward), and frame-range re-alignment events."""
import cv2
import numpy as np
import pytest

from engine.align import sim3_inverse, sim3_split, so3_log
from engine.api import EngineEvent, FrameResult, SessionConfig
from engine.geometric.loop import LoopCloser
from engine.geometry import apply_realignments, result_transforms
from engine.metrics import ate
from tests.engine.accuracy import check
from tests.engine.geometric_drift import inject_scale_drift, replay, rgb_sequence


@pytest.fixture(scope="module")
def icl():
    return rgb_sequence("icl_livingroom_kt3")


def _keyframe_points(gray, K, depth_of, n=300):
    pts = cv2.goodFeaturesToTrack(gray, n, 0.01, 12).reshape(-1, 2)
    z = depth_of(pts)
    ok = z > 0
    uv = pts[ok].astype(np.float64)
    ray = np.c_[uv, np.ones(len(uv))] @ np.linalg.inv(K).T
    return uv, ray * z[ok, None]


def test_verification_recovers_a_known_similarity(icl):
    """The same view seen again with a drifted scale (×1.3) and a shifted camera: the loop closer's
    geometric verification returns the known similarity."""
    seq, frames = icl
    K = seq.intrinsics.matrix()
    g0 = cv2.cvtColor(frames[120], cv2.COLOR_RGB2GRAY)
    rng = np.random.default_rng(0)
    uv, P = _keyframe_points(g0, K, lambda p: 1.5 + 0.8 * rng.random(len(p)))   # any depths: same view
    lc = LoopCloser(K)
    lc.add_keyframe(0, 0, np.eye(4), None, uv, P, g0, {}, 0)
    lc.add_keyframe(1, 0, np.eye(4), lambda f: np.eye(4), uv, 1.3 * P, g0.copy(), {}, 0)
    for f in (0, 1):
        lc._features(lc.nodes[f])
    res = lc._verify(lc.nodes[1], lc.nodes[0])
    assert res is not None
    S, n = res
    s, R, t = sim3_split(S)
    assert n > 100
    check(("scale error", abs(s - 1 / 1.3), "<", 1e-3), ("rotation error deg", np.degrees(np.linalg.norm(so3_log(R))), "<", 0.1),
          ("translation error", np.linalg.norm(t), "<", 1e-2))
    # an unrelated view does not verify
    g1 = cv2.cvtColor(frames[0], cv2.COLOR_RGB2GRAY)
    uv1, P1 = _keyframe_points(g1, K, lambda p: np.full(len(p), 2.0))
    lc.add_keyframe(2, 0, np.eye(4), lambda f: np.eye(4), uv1, P1, g1, {}, 0)
    lc._features(lc.nodes[2])
    assert lc._verify(lc.nodes[2], lc.nodes[0]) is None


def _ate(results, seq, order):
    rr = sorted(results, key=lambda r: r.index)
    return ate(np.array([r.c2w for r in rr]), np.array([seq.gt_c2w[order[r.index]] for r in rr]))["rmse"]


def test_forward_backward_closes_loops_and_corrects(icl, monkeypatch, tmp_path):
    """ICL forward then backward (400 frames) with an artificial scale drift of 1 % per keyframe
    (the map is rescaled about the current camera after every keyframe): loops are closed against
    the forward pass, every frame stays in one segment, and the frame-range corrections bring the
    trajectory back (ATE after correction well below the drifted one)."""
    inject_scale_drift(monkeypatch)
    seq, frames = icl
    order = list(range(200)) + list(range(199, -1, -1))
    res, ev, st, _ = replay(seq, frames, order, depth=False)
    assert len(res) == 400 and {r.segment for r in res} == {0}
    assert st["loops_closed"] >= 2
    assert any("Loop closed" in e.message for e in ev)
    realign = [e for e in ev if e.kind == "realign"]
    assert realign and all(e.frames is not None and e.frames[0] <= e.frames[1] for e in realign)
    raw, corrected = _ate(res, seq, order), _ate(apply_realignments(res, ev), seq, order)
    # scene units ≈ metres here (Sim(3)-aligned)
    check(("corrected / raw ATE", corrected / raw, "<", 0.75), ("corrected ATE m", corrected, "<", 0.015))
    # through the session store and the exporter: the exported trajectory is the corrected one
    from engine.io.export import export_results, read_tum
    from engine.io.store import SessionStore, load_session
    store = SessionStore(tmp_path / "s", SessionConfig(engine="geometric"), "loop")
    for r in res:
        store.write(r)
    for e in ev:
        store.write_event(e)
    store.close()
    loaded = load_session(tmp_path / "s")
    assert [e.frames for e in loaded.events if e.kind == "realign"] == [e.frames for e in realign]
    export_results(loaded, {"tum": tmp_path / "t.txt"})
    _, poses = read_tum(tmp_path / "t.txt")
    want = np.array([r.c2w for r in sorted(apply_realignments(res, ev), key=lambda r: r.index)])
    np.testing.assert_allclose(poses[:, :3, 3], want[:, :3, 3], atol=1e-5)


def test_loop_closure_keeps_an_undrifted_run_accurate(icl):
    """Without drift the loops are found, and the ones the map already agrees with move nothing."""
    seq, frames = icl
    order = list(range(200)) + list(range(199, -1, -1))
    res, ev, st, _ = replay(seq, frames, order, depth=False)
    assert st["loops_closed"] + st["loops_consistent"] >= 3 and st["loops_consistent"] >= 1
    check(("ATE m", _ate(apply_realignments(res, ev), seq, order), "<", 0.01))


def test_frame_range_realignment_semantics():
    """Latest event wins per frame; a range only touches its frames; whole-segment events still
    work (backward compatible); other segments are untouched."""
    def fr(i, seg=0):
        return FrameResult(i, float(i), False, np.eye(4), np.eye(3), np.zeros((2, 2, 3), np.uint8), segment=seg)

    T = lambda x: np.diag([1.0, 1, 1, 1]) + np.pad(np.array([[x], [0], [0]]), ((0, 1), (3, 0)))
    results = [fr(i) for i in range(10)] + [fr(10, seg=1)]
    events = [EngineEvent("realign", 0, T(1.0)),                    # whole segment 0
              EngineEvent("realign", 0, T(2.0), frames=(3, 5)),     # then frames 3..5
              EngineEvent("realign", 0, T(3.0), frames=(5, 6))]     # then 5..6 (overrides 5)
    xs = [r.c2w[0, 3] for r in apply_realignments(results, events)]
    assert xs == [1, 1, 1, 2, 2, 3, 3, 1, 1, 1, 0]
    Ts = result_transforms([(0, 4), (1, 10), (0, 99)], events)
    assert Ts[0][0, 3] == 2 and Ts[1] is None and Ts[2][0, 3] == 1


def test_relocalisation_places_a_new_segment_in_the_existing_map(icl):
    """A cut back to an earlier place (frames 0-120, then 30-199) loses tracking; the new segment
    is recognised in the first segment's map and placed there by a whole-segment realign event, so
    the whole trajectory is consistent under one Sim(3)."""
    seq, frames = icl
    order = list(range(0, 121)) + list(range(30, 200))
    res, ev, st, _ = replay(seq, frames, order, depth=False)
    assert len(res) == len(order) and {r.segment for r in res} == {0, 1}
    assert st["segments_relocalised"] == 1
    assert any(e.kind == "info" and "Relocalised" in e.message for e in ev)
    assert any(e.kind == "realign" and e.segment == 1 and e.frames is None for e in ev)
    raw, corrected = _ate(res, seq, order), _ate(apply_realignments(res, ev), seq, order)
    check(("raw ATE m", raw, ">", 0.05), ("corrected ATE m", corrected, "<", 0.02))


def test_a_false_loop_is_rejected_and_a_true_one_closes():
    """A chain of keyframes around a circle with 3 % scale drift per edge, closed once with the true
    loop similarity (accepted: the drift is spread over the chain) and once with a wrong one
    (90° off: it would bend odometry edges beyond drift, so it is dropped with its edge)."""
    from engine.align import sim3_exp, sim3_matrix, so3_exp

    def chain():
        lc = LoopCloser(np.eye(3))
        T_true, T_est = [], []
        for k in range(24):
            a = 2 * np.pi * k / 24
            T_true.append(sim3_matrix(1.0, so3_exp([0, -a, 0]), [np.cos(a), 0, np.sin(a)]))
        T_est = [T_true[0]]
        for k in range(1, 24):
            rel = sim3_inverse(T_true[k - 1]) @ T_true[k]
            T_est.append(T_est[-1] @ rel @ sim3_exp(np.r_[0, 0, 0, 0, 0, 0, 0.03]))
        for k, T in enumerate(T_est):
            lc.add_keyframe(k, 0, T, lambda f: lc.nodes[f].T_produced, np.zeros((0, 2)), np.zeros((0, 3)),
                            None, {}, 0)
        lc._bring_estimates()
        return lc, T_true

    lc, T_true = chain()
    q, c = lc.nodes[23], lc.nodes[0]
    S_true = sim3_inverse(T_true[0]) @ T_true[23]
    lc.edges[0].append((0, 23, S_true, 1.0, 0.5))
    sol = lc._solve(q, c, 50, S_true)
    assert sol is not None and lc.loops_rejected == 0
    lc2, _ = chain()
    bad = S_true @ sim3_matrix(1.0, so3_exp([0, np.pi / 2, 0]), [0.5, 0, 0])
    lc2.edges[0].append((0, 23, bad, 1.0, 0.5))
    assert lc2._solve(lc2.nodes[23], lc2.nodes[0], 50, bad) is None
    assert lc2.loops_rejected == 1 and all(e[4] is None for e in lc2.edges[0])


def test_relocalisation_continues_the_lost_segment(icl):
    """After the cut back (frames 0-120, then 30-199) tracking is relocalised while it goes on:
    from the frame the match is applied, results carry segment 0 again and are already in its
    world (no event needed: the raw poses of segment 0, before and after the loss, agree with the
    ground truth under ONE Sim(3)); only the stretch between the loss and that frame is segment 1,
    placed by a whole-segment realign event; the corrected trajectory is as good as before."""
    seq, frames = icl
    order = list(range(0, 121)) + list(range(30, 200))
    res, ev, st, _ = replay(seq, frames, order, depth=False)
    assert len(res) == len(order) and st["segments_continued"] == 1
    seg1 = [r.index for r in res if r.segment == 1]
    assert seg1 and min(seg1) == 121 and len(seg1) <= 60           # the stretch before the match
    back = [r for r in res if r.segment == 0 and r.index > 121]
    assert len(back) >= len(order) - 121 - 60 and min(r.index for r in back) == max(seg1) + 1
    assert any(e.kind == "info" and "continues segment 0" in e.message for e in ev)
    seg0 = sorted((r for r in res if r.segment == 0), key=lambda r: r.index)
    raw0 = ate(np.array([r.c2w for r in seg0]), np.array([seq.gt_c2w[order[r.index]] for r in seg0]))["rmse"]
    check(("segment 0 raw ATE m", raw0, "<", 0.02), ("corrected ATE m", _ate(apply_realignments(res, ev), seq, order), "<", 0.02))

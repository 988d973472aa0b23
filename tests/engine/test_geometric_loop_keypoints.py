"""Loop verification by the place-recognition corners (engine/geometric/loop.py `_verify_keypoints`):
a revisit from 26-38 cm away, whose two keyframes triangulated their own corners (so the map-point
descriptors do not confirm it), is verified with the known similarity; wrong places are rejected.
Real ICL-NUIM / 7-Scenes frames; the keyframes' 3-D points are triangulated from the ground truth."""
import cv2
import numpy as np
import pytest

from engine.align import sim3_split, so3_log
from engine.evaluate import load_sequence
from engine.geometric.loop import _corner_points
from tests.engine.accuracy import check
from tests.engine.geometric_drift import rgb_sequence
from tests.engine.test_geometric_loop_flow import _revisit, _triangulated


@pytest.fixture(scope="module")
def icl():
    return rgb_sequence("icl_livingroom_kt3")


def test_corner_points_take_the_depth_of_the_map_points_around_them():
    K = np.array([[500.0, 0, 320], [0, 500, 240], [0, 0, 1]])
    uv = np.array([[100.0, 100], [110, 100], [100, 110], [400, 300], [405, 300]])
    z = np.array([2.0, 2.1, 1.9, 1.0, 3.0])
    P = np.c_[(uv - K[:2, 2]) / 500.0 * z[:, None], z]
    kp = np.array([[104.0, 104], [402, 300], [600, 50]])
    out = _corner_points(kp, uv, P, K, 15.0, 0.15)
    assert abs(out[0, 2] - 2.0) < 1e-6                       # the median of the three around it
    assert np.allclose(out[0, :2], (kp[0] - K[:2, 2]) / 500.0 * 2.0, atol=1e-5)
    assert np.isnan(out[1]).all()                            # two neighbours that disagree: a depth edge
    assert np.isnan(out[2]).all()                            # no map point near


@pytest.mark.parametrize("c,q", [(20, 100), (60, 120)])
def test_keypoints_verify_a_revisit_from_elsewhere_that_descriptors_miss(icl, c, q):
    lc, (s_exp, R_exp, t_exp) = _revisit(icl, c=c, q=q, roll=0.0, motion=0)
    qn, cn = lc.nodes[1], lc.nodes[0]
    assert lc._verify(qn, cn) is None                 # the map-point descriptors do not confirm it
    res = lc._verify_keypoints(qn, cn)
    assert res is not None
    S, n = res
    s, R, t = sim3_split(S)
    assert n >= 40
    check(("|log scale error|", abs(np.log(s / s_exp)), "<", 0.06),
          ("rotation error deg", np.degrees(np.linalg.norm(so3_log(R_exp.T @ R))), "<", 1.0),
          ("translation error m", np.linalg.norm(t - t_exp), "<", 0.04))       # of a 26-38 cm baseline


def test_keypoints_reject_wrong_places(icl):
    """7-Scenes kitchen frames against the ICL living-room keyframes, both ways: none verifies,
    although every keyframe has corners with a depth to match."""
    from tests.conftest import DATA
    lc, _ = _revisit(icl, c=100, q=118, roll=0.0, motion=0)
    seq, _frames = icl
    ks = load_sequence(DATA / "7scenes_redkitchen_150_199")
    for f, (i, j) in ((2, (20, 24)), (3, (40, 44))):
        g = cv2.cvtColor(cv2.imread(str(ks.frames[i])), cv2.COLOR_BGR2GRAY)
        g2 = cv2.cvtColor(cv2.imread(str(ks.frames[j])), cv2.COLOR_BGR2GRAY)
        uv, P = _triangulated(g, g2, ks.gt_c2w[i], ks.gt_c2w[j], ks.intrinsics.matrix())
        lc.add_keyframe(f, 0, seq.gt_c2w[100], lambda _f: seq.gt_c2w[100], uv, P, g, {}, 0)
    lc._bring_estimates()
    for f in (2, 3):
        lc._features(lc.nodes[f])
    for f in range(4):
        assert np.isfinite(lc.nodes[f].kp_P[:, 0]).sum() >= 50     # corners with a depth to match
    for a in (2, 3):
        for b in (0, 1):
            assert lc._verify_keypoints(lc.nodes[a], lc.nodes[b]) is None
            assert lc._verify_keypoints(lc.nodes[b], lc.nodes[a]) is None
    assert lc._verify_keypoints(lc.nodes[1], lc.nodes[0]) is not None     # (the true revisit does)


def _loop_edges(seq, frames, **settings):
    """Replay `frames` through one session (depth off) and return the loop edges its closer
    verified, as (candidate frame, query frame), and the keyframes' frames."""
    from engine.api import SessionConfig, open_session
    s = open_session(SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple(), depth=False, **settings))
    try:
        keyframes = []
        for k, img in enumerate(frames):
            keyframes += [r.index for r in s.push(img, k / 30.0) if r.is_keyframe]
        keyframes += [r.index for r in s.flush() if r.is_keyframe]
        lc = s._loop
        edges = [(i, j) for seg in lc.edges.values() for i, j, _Z, _info, hub in seg if hub is not None]
        return edges, sorted(keyframes)
    finally:
        s.close()


def test_coming_back_to_the_start_closes_a_loop_to_the_first_keyframes(icl):
    """ICL forward, then backward to the start rolled by 20 deg, darker and blurred (the hand-held
    revisit of test_geometric_loop_flow): the way back's end is tied to the first keyframes by a
    verified loop edge (default settings); with loop closure's verification limited to the
    map-point descriptors, nothing ties it there."""
    from tests.engine.test_geometric_loop_flow import _hard_revisits
    seq, frames = icl
    seq_frames = _hard_revisits(frames, seq.intrinsics.matrix())
    end = len(seq_frames) - 60                     # the last 60 frames come back to frames 0-60
    edges, kfs = _loop_edges(seq, seq_frames)
    first = set(kfs[:3])
    back = [(i, j) for i, j in edges if j >= end and i in first]
    assert back, f"no loop from frame {end} on to the first keyframes {sorted(first)}: {edges}"
    edges0, kfs0 = _loop_edges(seq, seq_frames, loop_flow_verify=False, extra={"loop_kp_verify": False})
    assert not [(i, j) for i, j in edges0 if j >= end and i in set(kfs0[:3])]

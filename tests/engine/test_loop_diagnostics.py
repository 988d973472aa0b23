"""benchmarks/loop_diagnostics.py scores verified loop transforms against the ground truth: with
a trajectory produced at twice the metric scale, the exact loop transform scores zero error and a
loop whose scale is 10 % off scores that scale error and a translation error of 10 % of its
baseline (synthetic poses, no engine run)."""
import numpy as np

from benchmarks.loop_diagnostics import _local_scale, _transform_errors
from engine.align import sim3_matrix


def _trajectory(n=200):
    """A camera circling at 1 m radius, turning as it goes (c2w)."""
    out = []
    for k in range(n):
        a = 2 * np.pi * k / n
        c, s = np.cos(a), np.sin(a)
        T = np.eye(4)
        T[:3, :3] = np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
        T[:3, 3] = [np.cos(a), 0.1 * np.sin(3 * a), np.sin(a)]
        out.append(T)
    return np.array(out)


def test_transform_errors_against_the_ground_truth():
    gt = _trajectory()
    lam = 2.0                                          # map units per metre
    produced = {k: np.r_[np.c_[T[:3, :3], lam * T[:3, 3]], [[0, 0, 0, 1]]] for k, T in enumerate(gt)}
    assert abs(_local_scale(produced, gt, 100) - lam) < 1e-9
    q, c = 150, 120
    R = gt[c][:3, :3].T @ gt[q][:3, :3]
    t = gt[c][:3, :3].T @ (gt[q][:3, 3] - gt[c][:3, 3])
    exact = sim3_matrix(1.0, R, lam * t)
    off = sim3_matrix(1.1, R, 1.1 * lam * t)         # the query's map read 10 % too large
    always = lambda a, b: True                        # noqa: E731  (every match overlaps)
    for S, scale_err, trans_cm in ((exact, 0.0, 0.0), (off, np.log(1.1), 10.0 * np.linalg.norm(t))):
        detail, med = _transform_errors({q: (c, 50, S, True)}, {(q, c): "flow"}, produced, gt, always)
        rot, trans, dscale, n = med["flow loop"]
        assert n == 1 and rot < 0.01
        assert abs(dscale - scale_err) < 1e-3 and abs(trans - trans_cm) < 0.05
        assert detail[0][:3] == (q, c, "flow")

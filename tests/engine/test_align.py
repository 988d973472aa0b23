"""engine.align: similarity fits and the Sim(3) pose graph on synthetic data with known answers."""
import numpy as np
import pytest

from tests.engine.accuracy import check
from engine.align import (Sim3PoseGraph, apply_to_c2w, apply_to_depth, apply_to_points, correction, irls_sim3,
                          sim3_exp, sim3_inverse, sim3_log, sim3_matrix, sim3_split, so3_exp, so3_log, umeyama)


def _rand_sim3(rng, scale_range=(0.5, 2.0)):
    R = so3_exp(rng.normal(size=3))
    return float(rng.uniform(*scale_range)), R, rng.normal(size=3) * 3


def test_umeyama_exact_and_weighted():
    rng = np.random.default_rng(0)
    s, R, t = _rand_sim3(rng)
    X = rng.normal(size=(50, 3))
    Y = s * X @ R.T + t
    s2, R2, t2 = umeyama(X, Y)
    assert abs(s2 - s) < 1e-10 and np.allclose(R2, R, atol=1e-10) and np.allclose(t2, t, atol=1e-10)
    # zero weights on corrupted points: exact again
    Y2 = Y.copy()
    Y2[:10] += 5.0
    w = np.ones(50)
    w[:10] = 0
    s3, R3, t3 = umeyama(X, Y2, w)
    assert abs(s3 - s) < 1e-9 and np.allclose(R3, R, atol=1e-9)
    s4, _, _ = umeyama(X, Y, with_scale=False)
    assert s4 == 1.0
    with pytest.raises(ValueError):
        umeyama(X, Y[:, :2])
    with pytest.raises(ValueError):
        umeyama(X, Y, np.zeros(50))


def test_irls_beats_umeyama_with_outliers():
    rng = np.random.default_rng(1)
    s, R, t = _rand_sim3(rng)
    X = rng.uniform(-1, 1, size=(300, 3))
    Y = s * X @ R.T + t + rng.normal(scale=0.005, size=X.shape)
    out = rng.choice(300, 60, replace=False)            # 20 % gross outliers
    Y[out] += rng.normal(scale=1.0, size=(60, 3))
    s0, R0, t0 = umeyama(X, Y)
    s1, R1, t1, w = irls_sim3(X, Y)
    err0 = abs(s0 / s - 1) + np.linalg.norm(t0 - t)
    err1 = abs(s1 / s - 1) + np.linalg.norm(t1 - t)
    inl = np.setdiff1d(np.arange(300), out)
    check(("IRLS / Umeyama error", err1 / err0, "<", 0.2), ("scale error", abs(s1 / s - 1), "<", 5e-3),
          ("rotation error deg", np.degrees(np.linalg.norm(so3_log(R1 @ R.T))), "<", 0.3),
          ("outlier / inlier weight", np.median(w[out]) / np.median(w[inl]), "<", 0.2))
    # confidence weights: zero-confidence points stay at weight 0
    conf = np.ones(300)
    conf[out] = 0
    s2, R2, t2, w2 = irls_sim3(X, Y, weights=conf, huber_delta=0.02)
    assert np.all(w2[out] == 0)
    check(("weighted scale error", abs(s2 / s - 1), "<", 2e-3))


def test_matrices_chart_and_corrections():
    rng = np.random.default_rng(2)
    s, R, t = _rand_sim3(rng)
    S = sim3_matrix(s, R, t)
    s2, R2, t2 = sim3_split(S)
    assert abs(s2 - s) < 1e-12 and np.allclose(R2, R) and np.allclose(t2, t)
    assert np.allclose(S @ sim3_inverse(S), np.eye(4), atol=1e-12)
    x = np.r_[rng.normal(size=6), 0.3]
    assert np.allclose(sim3_log(sim3_exp(x)), x, atol=1e-10)
    for ang in (1e-9, 0.5, np.pi - 1e-7):      # so3_log near 0 and π
        w = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8]) * ang
        assert np.allclose(so3_exp(so3_log(so3_exp(w))), so3_exp(w), atol=1e-6)
    # moving a camera and its depth by S == moving its back-projected points by S
    c2w = np.eye(4)
    c2w[:3, :3] = so3_exp(rng.normal(size=3))
    c2w[:3, 3] = rng.normal(size=3)
    pts_cam = rng.uniform(0.5, 2, size=(20, 3))
    depth = pts_cam[:, 2].astype(np.float32)
    world = pts_cam @ c2w[:3, :3].T + c2w[:3, 3]
    c2w2 = apply_to_c2w(S, c2w)
    d2 = apply_to_depth(depth, s)
    rays = pts_cam / pts_cam[:, 2:3]
    world2 = (rays * d2[:, None]) @ c2w2[:3, :3].T + c2w2[:3, 3]
    assert np.allclose(world2, apply_to_points(S, world), atol=1e-5)
    A, B = sim3_matrix(*_rand_sim3(rng)), sim3_matrix(*_rand_sim3(rng))
    assert np.allclose(correction(A, B) @ A, B)


def _loop(n=120, radius=2.0):
    """True camera poses (Sim(3), scale 1) around a circle looking outwards, back at the start."""
    T = []
    for k in range(n):
        a = 2 * np.pi * k / n
        R = so3_exp(np.array([0.0, -a, 0.0]))
        T.append(sim3_matrix(1.0, R, np.array([radius * np.cos(a), 0.1 * np.sin(3 * a), radius * np.sin(a)])))
    return np.array(T)


def _drifting_odometry(T_true, rng, scale_drift=1.006, rot_noise=0.003, trans_noise=0.004):
    """Relative measurements with a steady scale drift and noise, and the chained estimate."""
    Z = []
    for k in range(len(T_true) - 1):
        rel = sim3_inverse(T_true[k]) @ T_true[k + 1]
        noise = sim3_exp(np.r_[rng.normal(scale=rot_noise, size=3), rng.normal(scale=trans_noise, size=3),
                               np.log(scale_drift)])
        Z.append(rel @ noise)
    est = [T_true[0]]
    for z in Z:
        est.append(est[-1] @ z)
    return Z, np.array(est)


@pytest.mark.parametrize("method", ["lm", "scipy"])
def test_pose_graph_closes_a_drifting_loop(method):
    rng = np.random.default_rng(3)
    T_true = _loop()
    Z, est = _drifting_odometry(T_true, rng)
    g = Sim3PoseGraph()
    for k, T in enumerate(est):
        g.add_node(T, fixed=(k == 0))
    for k, z in enumerate(Z):
        g.add_edge(k, k + 1, z, information=1.0)
    # the loop: the last camera seen again from the first, with the true relative similarity
    g.add_edge(0, len(est) - 1, sim3_inverse(T_true[0]) @ T_true[-1], information=100.0)
    centres = lambda P: P[:, :3, 3]
    before = np.linalg.norm(centres(est) - centres(T_true), axis=1)
    info = g.optimize(method=method)
    after = np.linalg.norm(centres(g.poses()) - centres(T_true), axis=1)
    scales = np.array([sim3_split(T)[0] for T in g.poses()])
    check((f"{method} final / initial cost", info["final_cost"] / info["initial_cost"], "<", 0.01),
          (f"{method} drift before m", before.max(), ">", 0.5),                 # metres on a 2 m loop ...
          (f"{method} error after / before", after.max() / before.max(), "<", 0.1),  # ... mostly removed
          (f"{method} end scale error", abs(scales[-1] - 1.0), "<", 0.05))    # back near the start's
    assert np.allclose(g.pose(0), est[0])         # the fixed node did not move


def test_pose_graph_exact_recovery_and_robust_loop():
    """Noise-free edges from a perturbed start: the truth is recovered exactly; a wrong loop edge
    with a Huber kernel moves the solution far less than the same edge without one."""
    T_true = _loop(60)

    def solve(extra_edge):
        rng = np.random.default_rng(4)
        g = Sim3PoseGraph()
        for k, T in enumerate(T_true):
            g.add_node(T @ sim3_exp(np.r_[rng.normal(scale=0.05, size=6), 0.05 * rng.normal()]) if k else T)
        for k in range(len(T_true) - 1):
            g.add_edge(k, k + 1, sim3_inverse(T_true[k]) @ T_true[k + 1], information=100.0)
        g.add_edge(0, len(T_true) - 1, sim3_inverse(T_true[0]) @ T_true[-1], information=100.0)
        if extra_edge is not None:
            g.add_edge(10, 40, *extra_edge)
        g.optimize()
        return np.linalg.norm(g.poses()[:, :3, 3] - T_true[:, :3, 3], axis=1).max()

    bad = sim3_inverse(T_true[10]) @ T_true[40] @ sim3_matrix(1.5, so3_exp([0, 1.0, 0]), [1, 0, 0])
    plain, robust = solve((bad, 1.0, None)), solve((bad, 1.0, 0.05))
    check(("noise-free error", solve(None), "<", 1e-8), ("robust error", robust, "<", 0.02),
          ("robust / plain error", robust / plain, "<", 0.2))


def test_pose_graph_bad_input():
    g = Sim3PoseGraph()
    g.add_node(np.eye(4))
    with pytest.raises(ValueError):
        g.add_edge(0, 0)
    with pytest.raises(ValueError):
        g.add_node(np.diag([-1.0, 1, 1, 1]))
    g.add_node(np.eye(4))
    with pytest.raises(ValueError):
        g.add_edge(0, 1, information=-np.eye(7))
    assert g.optimize()["iterations"] == 0          # nothing to do: consistent graph with no edges


@pytest.mark.parametrize("m,k,with_t", [(3, 3, True), (4, 3, True), (3, 3, False), (2, 4, True)])
def test_affine_rows_equals_the_matrix_product(m, k, with_t):
    """The BLAS-free row transform (points, crops, projections) gives X @ M.T + t to rounding,
    for float32 and float64 input."""
    from engine.geometry import affine_rows
    rng = np.random.default_rng(7 + m + k)
    M, t = rng.normal(size=(m, k)), rng.normal(size=m)
    for X in (rng.normal(size=(1001, k)) * 50, rng.normal(size=(5, k)).astype(np.float32)):
        want = np.asarray(X, np.float64) @ M.T + (t if with_t else 0)
        got = affine_rows(X, M, t if with_t else None)
        assert got.dtype == np.float64 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    assert affine_rows(np.zeros((0, k)), M, t).shape == (0, m)

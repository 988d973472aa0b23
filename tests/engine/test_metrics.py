"""Umeyama / ATE / RPE / depth metrics on hand-made data with known answers."""
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from engine.metrics import apply_sim3, ate, coverage, depth_metrics, rotation_angle_deg, rpe, umeyama


def _trajectory(n=50, seed=0):
    rng = np.random.default_rng(seed)
    T = np.tile(np.eye(4), (n, 1, 1))
    T[:, :3, 3] = np.cumsum(rng.normal(0, 0.05, (n, 3)), 0)
    T[:, :3, :3] = Rotation.from_rotvec(np.cumsum(rng.normal(0, 0.03, (n, 3)), 0)).as_matrix()
    return T


def test_umeyama_recovers_a_known_similarity():
    rng = np.random.default_rng(1)
    src = rng.normal(size=(30, 3))
    R = Rotation.from_euler("xyz", [20, -35, 60], degrees=True).as_matrix()
    s, t = 2.5, np.array([1.0, -2.0, 0.5])
    dst = s * src @ R.T + t
    s2, R2, t2 = umeyama(src, dst)
    assert s2 == pytest.approx(s, rel=1e-9)
    assert np.allclose(R2, R, atol=1e-9)
    assert np.allclose(t2, t, atol=1e-9)
    # without scale the rotation is still found and the scale stays 1
    s3, R3, _ = umeyama(src, dst, with_scale=False)
    assert s3 == 1.0 and np.allclose(R3, R, atol=1e-9)


def test_umeyama_never_returns_a_reflection():
    rng = np.random.default_rng(2)
    src = rng.normal(size=(20, 3))
    dst = src * np.array([1, 1, -1])          # a mirror image: best proper rotation, det +1
    _, R, _ = umeyama(src, dst)
    assert np.linalg.det(R) == pytest.approx(1.0)


def test_ate_is_zero_after_a_similarity_and_measures_noise():
    gt = _trajectory()
    R = Rotation.from_euler("z", 40, degrees=True).as_matrix()
    est = apply_sim3(0.3, R, np.array([5.0, 0, -1]), gt)
    a = ate(est, gt)
    assert a["rmse"] < 1e-9
    assert a["scale"] == pytest.approx(1 / 0.3)
    # a known offset on one axis of every other pose: after alignment the RMSE is bounded by it
    noisy = gt.copy()
    noisy[::2, 0, 3] += 0.02
    noisy[1::2, 0, 3] -= 0.02
    a2 = ate(noisy, gt, with_scale=False)
    assert 0.015 < a2["rmse"] <= 0.0201


def test_rpe_zero_for_identical_and_detects_drift():
    gt = _trajectory(90)
    ts = np.arange(90) / 30.0
    r = rpe(gt, gt, ts, delta_s=1.0)
    assert r["pairs"] == 60 and r["trans_rmse_per_s"] < 1e-12 and r["rot_rmse_deg_per_s"] < 1e-6
    drift = gt.copy()
    drift[:, 0, 3] += 0.1 * ts            # 0.1 m/s extra translation along world x
    r2 = rpe(drift, gt, ts, delta_s=1.0)
    assert r2["trans_rmse_per_s"] == pytest.approx(0.1, rel=1e-6)


def test_rotation_angle():
    R = Rotation.from_rotvec([0, 0, np.radians(30)]).as_matrix()
    assert rotation_angle_deg(R) == pytest.approx(30)


def test_depth_metrics_median_scale_and_values():
    rng = np.random.default_rng(3)
    gt = rng.uniform(1, 5, (2, 40, 50)).astype(np.float32)
    pred = gt / 7.0                                    # arbitrary monocular scale
    m = depth_metrics(list(pred), list(gt))
    assert m["abs_rel"] < 1e-6 and m["delta1"] == 1.0 and m["scale"] == pytest.approx(7.0, rel=1e-5)
    # 10% relative error on 30% of the pixels (the median scale stays 7), invalid pixels ignored
    p2 = pred.copy()
    p2[:, :12] *= 1.1
    p2[0, 0, 0] = 0          # no prediction
    g2 = gt.copy()
    g2[1, 5, 5] = 0          # no ground truth
    m2 = depth_metrics(list(p2), list(g2))
    assert m2["pixels"] == 2 * 40 * 50 - 2
    assert m2["scale"] == pytest.approx(7.0, rel=1e-5)
    assert m2["abs_rel"] == pytest.approx(0.1 * (2 * 12 * 50 - 2) / (2 * 40 * 50 - 2), rel=1e-4)  # both holes are in perturbed rows
    assert m2["delta1"] == 1.0
    m3 = depth_metrics(list(pred * 2.0), list(gt), align=False)      # unaligned: 2x too deep
    assert m3["abs_rel"] == pytest.approx(5 / 7, rel=1e-5)
    assert depth_metrics([np.zeros((4, 4))], [np.ones((4, 4))])["abs_rel"] is None


def test_coverage_and_shape_errors():
    assert coverage(50, 200) == 0.25 and coverage(0, 0) == 0.0
    with pytest.raises(ValueError):
        ate(np.zeros((5, 4, 4)), np.zeros((4, 4, 4)))
    with pytest.raises(ValueError):
        umeyama(np.zeros((5, 2)), np.zeros((5, 2)))


def test_scale_drift_known_answer():
    """A straight path whose estimate grows 5 % in scale every 100 frames (and is offset / rotated,
    which the per-window Sim(3) removes): drift 5 % per 100 frames, range 1.05³ over 4 windows."""
    from engine.metrics import scale_drift
    n = 400
    gt = np.tile(np.eye(4), (n, 1, 1))
    gt[:, 0, 3] = np.linspace(0, 4, n)
    gt[:, 1, 3] = 0.3 * np.sin(np.linspace(0, 6, n))
    est = gt.copy()
    k = np.arange(n) // 100
    # piecewise: inside window k the estimate is gt scaled by 1/1.05^k (so the aligning scale is 1.05^k)
    est[:, :3, 3] = gt[:, :3, 3] / (1.05 ** k)[:, None] + np.array([1.0, 2.0, 3.0])
    d = scale_drift(est, gt, window=100)
    assert d["windows"] == 4
    assert np.allclose(d["scales"], [1, 1.05, 1.05 ** 2, 1.05 ** 3], rtol=1e-6)
    assert abs(d["drift_rms"] - np.log(1.05)) < 1e-6 and abs(d["range"] - 1.05 ** 3) < 1e-6
    static = np.tile(np.eye(4), (150, 1, 1))
    assert scale_drift(static, static)["drift_rms"] is None      # no motion: not observable

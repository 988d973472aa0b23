"""Pose encoding <-> c2w / K (engine/pose.py)."""
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from engine.geometry import invert_se3
from engine.pose import decode_pose, encode_pose, intrinsics_from_fov, quat_to_matrix


def _random_poses(n, seed=0):
    rng = np.random.default_rng(seed)
    T = np.tile(np.eye(4), (n, 1, 1))
    T[:, :3, :3] = Rotation.random(n, random_state=seed).as_matrix()
    T[:, :3, 3] = rng.normal(size=(n, 3))
    fov = rng.uniform(0.3, 2.0, size=(n, 2))
    return T, fov


@pytest.mark.parametrize("convention", ["c2w", "w2c"])
def test_round_trip(convention):
    T, fov = _random_poses(20)
    H, W = 392, 518
    K = intrinsics_from_fov(fov[:, 0], fov[:, 1], H, W)
    enc = encode_pose(T, K, (H, W), convention)
    T2, K2 = decode_pose(enc, (H, W), convention)
    np.testing.assert_allclose(T2, T, atol=1e-12)
    np.testing.assert_allclose(K2, K, rtol=1e-12)
    np.testing.assert_allclose(enc[:, 7:], fov, atol=1e-12)


def test_decoded_rt_is_c2w_for_lingbot():
    # a camera at (1, 2, 3) rotated 90 degrees about y: the decoded [R|t] is used as c2w as-is
    q = Rotation.from_euler("y", 90, degrees=True).as_quat()          # x, y, z, w
    enc = np.concatenate([[1.0, 2.0, 3.0], q, [1.0, 1.2]])
    c2w, K = decode_pose(enc, (100, 200))
    np.testing.assert_allclose(c2w[:3, 3], [1, 2, 3])
    np.testing.assert_allclose(c2w[:3, 2], [1, 0, 0], atol=1e-12)     # optical axis -> world +x
    w2c, _ = decode_pose(enc, (100, 200), convention="w2c")
    np.testing.assert_allclose(w2c, invert_se3(c2w), atol=1e-12)
    assert K[0, 0] == pytest.approx(100 / np.tan(0.6)) and K[1, 1] == pytest.approx(50 / np.tan(0.5))
    assert (K[0, 2], K[1, 2]) == (100.0, 50.0)


def test_unnormalised_and_degenerate_predictions():
    q = np.array([0.0, 0.0, 0.3, 0.3])                                 # not unit: normalised
    np.testing.assert_allclose(quat_to_matrix(q), Rotation.from_euler("z", 90, degrees=True).as_matrix(), atol=1e-12)
    np.testing.assert_allclose(quat_to_matrix(np.zeros(4)), np.eye(3))
    enc = np.array([0, 0, 0, 0, 0, 0, 0, 0.0, 0.0], dtype=np.float32)   # ReLU'd fov of 0
    c2w, K = decode_pose(enc, (140, 182))
    assert np.isfinite(K).all() and np.isfinite(c2w).all()
    with pytest.raises(ValueError):
        decode_pose(np.zeros(8), (10, 10))

"""Small pose / projection helpers shared by the tracker, the bundle adjuster and the depth
worker. Internally poses are world-to-camera (R, t): x_cam = R x_world + t."""
from __future__ import annotations

import numpy as np

from ..geometry import so3_exp as _so3_exp


def skew(v: np.ndarray) -> np.ndarray:
    """N×3 → N×3×3 cross-product matrices."""
    v = np.atleast_2d(v)
    z = np.zeros(len(v))
    return np.stack([np.stack([z, -v[:, 2], v[:, 1]], -1),
                     np.stack([v[:, 2], z, -v[:, 0]], -1),
                     np.stack([-v[:, 1], v[:, 0], z], -1)], 1)


def so3_exp(w: np.ndarray) -> np.ndarray:
    """Rodrigues for N×3 rotation vectors → N×3×3 (engine.geometry.so3_exp on a 2-D batch)."""
    return _so3_exp(np.atleast_2d(np.asarray(w, np.float64)))


def c2w_from_rt(R: np.ndarray, t: np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = R.T
    T[:3, 3] = -R.T @ t
    return T


def rt_from_c2w(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    R = T[:3, :3].T.copy()
    return R, -R @ T[:3, 3]


def camera_center(R: np.ndarray, t: np.ndarray) -> np.ndarray:
    return -R.T @ t


def project(K: np.ndarray, R: np.ndarray, t: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """World points N×3 → (pixels N×2, depths N)."""
    Xc = X @ R.T + t
    z = Xc[:, 2]
    zs = np.where(np.abs(z) < 1e-9, 1e-9, z)
    uv = np.stack([K[0, 0] * Xc[:, 0] / zs + K[0, 2], K[1, 1] * Xc[:, 1] / zs + K[1, 2]], 1)
    return uv, z


def triangulate(K: np.ndarray, R0: np.ndarray, t0: np.ndarray, uv0: np.ndarray,
                R1: np.ndarray, t1: np.ndarray, uv1: np.ndarray):
    """Linear (DLT) triangulation of N correspondences; R0/t0 may be per point (N×3×3, N×3).
    Returns world points N×3 and the parallax angle in degrees between the two viewing rays."""
    Kinv = np.linalg.inv(K)
    n = len(uv0)
    R0 = np.broadcast_to(R0, (n, 3, 3))
    t0 = np.broadcast_to(t0, (n, 3))
    R1 = np.broadcast_to(R1, (n, 3, 3))
    t1 = np.broadcast_to(t1, (n, 3))
    x0 = np.c_[uv0, np.ones(n)] @ Kinv.T
    x1 = np.c_[uv1, np.ones(n)] @ Kinv.T
    P0 = np.concatenate([R0, t0[:, :, None]], 2)
    P1 = np.concatenate([R1, t1[:, :, None]], 2)
    A = np.stack([x0[:, 0:1] * P0[:, 2] - P0[:, 0], x0[:, 1:2] * P0[:, 2] - P0[:, 1],
                  x1[:, 0:1] * P1[:, 2] - P1[:, 0], x1[:, 1:2] * P1[:, 2] - P1[:, 1]], 1)
    _, _, Vt = np.linalg.svd(A)
    Xh = Vt[:, -1]
    w = Xh[:, 3:4]
    X = Xh[:, :3] / np.where(np.abs(w) < 1e-12, 1e-12, w)
    c0 = -np.einsum("nji,nj->ni", R0, t0)
    c1 = -np.einsum("nji,nj->ni", R1, t1)
    r0, r1 = X - c0, X - c1
    cosang = np.sum(r0 * r1, 1) / (np.linalg.norm(r0, axis=1) * np.linalg.norm(r1, axis=1) + 1e-12)
    return X, np.degrees(np.arccos(np.clip(cosang, -1.0, 1.0)))


def slerp_pose(Ta: np.ndarray, Tb: np.ndarray, a: float) -> np.ndarray:
    """Interpolate two 4×4 poses (rotation by the geodesic, translation linearly)."""
    from scipy.spatial.transform import Rotation, Slerp
    rots = Rotation.from_matrix(np.stack([Ta[:3, :3], Tb[:3, :3]]))
    out = np.eye(4)
    out[:3, :3] = Slerp([0.0, 1.0], rots)([a]).as_matrix()[0]
    out[:3, 3] = (1 - a) * Ta[:3, 3] + a * Tb[:3, 3]
    return out

"""Similarity transforms: fitting (Umeyama, robust IRLS), 4×4 matrices, a minimal chart for
optimisation, and helpers that move camera poses / depth maps by a similarity.

A similarity here maps x → s·R·x + t; as a 4×4 matrix it is [[s·R, t], [0, 1]]. Camera poses are
camera-to-world 4×4 rigid transforms (OpenCV axes); moving one by a similarity keeps it rigid
(rotation R·R_c, centre mapped by the similarity) and multiplies its depth by s, so
back-projecting the moved camera gives exactly the similarity applied to the old points.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["umeyama", "irls_sim3", "sim3_matrix", "sim3_split", "sim3_inverse", "sim3_exp", "sim3_log",
           "so3_exp", "so3_log", "apply_to_c2w", "apply_to_points", "apply_to_depth", "correction"]


def umeyama(src: np.ndarray, dst: np.ndarray, weights: Optional[np.ndarray] = None,
            with_scale: bool = True) -> tuple[float, np.ndarray, np.ndarray]:
    """Least-squares similarity (s, R, t) minimising Σ w_i‖dst_i − (s·R·src_i + t)‖² (Umeyama 1991,
    weighted). src, dst: N×3; weights: N non-negative (None = all 1). Degenerate input (fewer than
    3 non-collinear points) still returns a valid rotation; zero spread gives s = 1."""
    src = np.asarray(src, np.float64)
    dst = np.asarray(dst, np.float64)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 3:
        raise ValueError(f"umeyama needs two N×3 arrays of the same shape, got {src.shape} and {dst.shape}")
    if len(src) < 2:
        raise ValueError("umeyama needs at least 2 points")
    w = np.ones(len(src)) if weights is None else np.asarray(weights, np.float64).ravel()
    if w.shape != (len(src),) or not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError("umeyama weights must be N finite non-negative numbers")
    ws = w.sum()
    if ws <= 0:
        raise ValueError("umeyama weights are all zero")
    w = w / ws
    mu_s, mu_d = w @ src, w @ dst
    xs, xd = src - mu_s, dst - mu_d
    cov = (xd * w[:, None]).T @ xs
    U, D, Vt = np.linalg.svd(cov)
    S = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        S[2, 2] = -1.0
    R = U @ S @ Vt
    var_s = float(w @ (xs ** 2).sum(1))
    s = float(np.trace(np.diag(D) @ S) / var_s) if (with_scale and var_s > 1e-300) else 1.0
    t = mu_d - s * R @ mu_s
    return s, R, t


def irls_sim3(src: np.ndarray, dst: np.ndarray, weights: Optional[np.ndarray] = None,
              huber_delta: Optional[float] = None, iterations: int = 20,
              with_scale: bool = True) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Robust similarity dst ≈ s·R·src + t by iteratively reweighted least squares with Huber
    weights on the residual distances, multiplied by the confidence `weights` (N, ≥ 0).

    huber_delta: the residual (in dst units) beyond which a point is down-weighted; None picks
    1.345 × a robust sigma (1.4826 × the weighted median residual of the current fit), re-estimated
    each iteration and never below 1e-9 × the scene size. Returns (s, R, t, w_final) where w_final
    are the per-point weights of the last solve (confidence × Huber, 0 for zero-confidence points)."""
    src = np.asarray(src, np.float64)
    dst = np.asarray(dst, np.float64)
    conf = np.ones(len(src)) if weights is None else np.asarray(weights, np.float64).ravel()
    s, R, t = umeyama(src, dst, conf, with_scale)
    w = conf.copy()
    size = max(float(np.linalg.norm(dst - dst.mean(0), axis=1).mean()), 1e-12)
    for _ in range(max(int(iterations), 0)):
        r = np.linalg.norm(dst - (s * src @ R.T + t), axis=1)
        if huber_delta is None:
            valid = conf > 0
            sigma = 1.4826 * _weighted_median(r[valid], conf[valid]) if valid.any() else 0.0
            delta = max(1.345 * sigma, 1e-9 * size)
        else:
            delta = float(huber_delta)
        hub = np.where(r <= delta, 1.0, delta / np.maximum(r, 1e-300))
        w_new = conf * hub
        if w_new.sum() <= 0:
            break
        s, R, t = umeyama(src, dst, w_new, with_scale)
        done = np.max(np.abs(w_new - w)) < 1e-6 * max(conf.max(), 1e-12)
        w = w_new
        if done:
            break
    return s, R, t, w


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(x)
    cw = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cw, 0.5 * cw[-1])])


# --- matrices ---------------------------------------------------------------------------------

def sim3_matrix(s: float, R: np.ndarray, t: np.ndarray) -> np.ndarray:
    """4×4 [[s·R, t], [0, 1]]."""
    T = np.eye(4)
    T[:3, :3] = float(s) * np.asarray(R, np.float64)
    T[:3, 3] = np.asarray(t, np.float64).ravel()
    return T


def sim3_split(T: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R, t) of a 4×4 similarity; raises ValueError for a reflection or a singular matrix."""
    T = np.asarray(T, np.float64)
    s = float(np.cbrt(np.linalg.det(T[:3, :3])))
    if not np.isfinite(s) or s <= 0:
        raise ValueError("not a proper similarity (det <= 0)")
    return s, T[:3, :3] / s, T[:3, 3].copy()


def sim3_inverse(T: np.ndarray) -> np.ndarray:
    s, R, t = sim3_split(T)
    return sim3_matrix(1.0 / s, R.T, -(R.T @ t) / s)


def so3_exp(w: np.ndarray) -> np.ndarray:
    """Rotation vectors (…×3) → rotation matrices (…×3×3), stable near zero."""
    w = np.asarray(w, np.float64)
    th = np.linalg.norm(w, axis=-1)[..., None, None]
    small = th < 1e-8
    ths = np.where(small, 1.0, th)
    a = np.where(small, 1.0 - th ** 2 / 6.0, np.sin(ths) / ths)
    b = np.where(small, 0.5 - th ** 2 / 24.0, (1.0 - np.cos(ths)) / ths ** 2)
    z = np.zeros(w.shape[:-1])
    W = np.stack([np.stack([z, -w[..., 2], w[..., 1]], -1),
                  np.stack([w[..., 2], z, -w[..., 0]], -1),
                  np.stack([-w[..., 1], w[..., 0], z], -1)], -2)
    return np.eye(3) + a * W + b * (W @ W)


def so3_log(R: np.ndarray) -> np.ndarray:
    """Rotation matrices (…×3×3) → rotation vectors (…×3); handles angles near 0 and π."""
    R = np.asarray(R, np.float64)
    c = np.clip((np.trace(R, axis1=-2, axis2=-1) - 1.0) / 2.0, -1.0, 1.0)
    th = np.arccos(c)
    v = np.stack([R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1)
    sin = np.sin(th)
    small = sin < 1e-6
    k = np.where(small, 0.5 + th ** 2 / 12.0, th / (2.0 * np.where(small, 1.0, sin)))
    out = v * k[..., None]
    near_pi = small & (th > 1.0)
    if np.any(near_pi):   # axis from the symmetric part: R + I = 2 n nᵀ at θ = π
        Rp = R[near_pi]
        B = (Rp + np.eye(3)) / 2.0
        j = np.argmax(np.einsum("nii->ni", B), axis=1)
        n = B[np.arange(len(Rp)), :, j] / np.sqrt(np.maximum(B[np.arange(len(Rp)), j, j], 1e-12))[:, None]
        out[near_pi] = n * th[near_pi][:, None]
    return out


def sim3_exp(x: np.ndarray) -> np.ndarray:
    """The optimisation chart: x = (ω[3], u[3], σ) (…×7) → 4×4 [[e^σ·exp(ω), u], [0, 1]].
    (Not the group exponential — a simple, global-enough chart; identity at 0.)"""
    x = np.asarray(x, np.float64)
    T = np.zeros(x.shape[:-1] + (4, 4))
    T[..., :3, :3] = np.exp(x[..., 6])[..., None, None] * so3_exp(x[..., :3])
    T[..., :3, 3] = x[..., 3:6]
    T[..., 3, 3] = 1.0
    return T


def sim3_log(T: np.ndarray) -> np.ndarray:
    """Inverse of `sim3_exp` (…×4×4 → …×7)."""
    T = np.asarray(T, np.float64)
    s = np.cbrt(np.linalg.det(T[..., :3, :3]))
    R = T[..., :3, :3] / s[..., None, None]
    return np.concatenate([so3_log(R), T[..., :3, 3], np.log(s)[..., None]], -1)


# --- moving poses, points and depth by a similarity -------------------------------------------

def apply_to_c2w(S: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    """Camera-to-world pose(s) (4×4 or N×4×4) moved by the similarity S: still rigid, rotation
    R_S·R, centre mapped by S. Pair it with `apply_to_depth(depth, s)`."""
    s, R, t = sim3_split(S)
    P = np.array(c2w, np.float64, copy=True)
    P[..., :3, :3] = R @ P[..., :3, :3]
    P[..., :3, 3] = s * (P[..., :3, 3] @ R.T) + t
    return P


def apply_to_points(S: np.ndarray, X: np.ndarray) -> np.ndarray:
    """N×3 points mapped by the similarity S."""
    S = np.asarray(S, np.float64)
    return np.asarray(X, np.float64) @ S[:3, :3].T + S[:3, 3]


def apply_to_depth(depth: Optional[np.ndarray], s: float) -> Optional[np.ndarray]:
    """A depth map of a camera moved by a similarity of scale s (0 = no depth stays 0)."""
    if depth is None:
        return None
    return (np.asarray(depth, np.float32) * np.float32(s)).astype(np.float32)


def correction(old_pose: np.ndarray, new_pose: np.ndarray) -> np.ndarray:
    """The world similarity C with new_pose = C · old_pose (both 4×4 similarities, e.g. a
    keyframe's pose before and after a pose-graph optimisation): apply C to everything that
    keyframe anchors (its depth, its points, the frames tracked from it)."""
    return np.asarray(new_pose, np.float64) @ sim3_inverse(old_pose)

"""Fitting a similarity to 3-D correspondences: Umeyama (weighted least squares) and a robust
IRLS with Huber weights. A similarity maps x → s·R·x + t; its 4×4 form and every operation on it
(compose, invert, split, apply to poses / points / depth) are engine.geometry's.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["umeyama", "irls_sim3"]


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

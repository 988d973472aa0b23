"""Placing one reconstruction onto another from the frames both saw (the overlap): the same pixels
back-projected in both give 3-D correspondences, fitted by a confidence-weighted robust
similarity. Used by windowed mode (engine/windowed.py: each window onto the previous one) and by
VGGT's chunked session (each chunk onto the previous one).
"""
from __future__ import annotations

import numpy as np

from ..api import EngineError
from ..geometry import apply_to_points, rays_at, sim3_matrix
from .sim3 import irls_sim3


def _sample_points(c2w: np.ndarray, K: np.ndarray, depth: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """World points [N, 3] of every `step`-th pixel (engine.geometry's rays: integer pixel
    centres) and their flat pixel indices."""
    h, w = depth.shape
    v, u = np.mgrid[step // 2:h:step, step // 2:w:step]
    idx = (v * w + u).ravel()
    z = depth.ravel()[idx].astype(np.float64)
    rx, ry = rays_at(u.ravel(), v.ravel(), K)
    cam = np.stack((rx * z, ry * z, z), axis=1)
    return apply_to_points(c2w, cam), idx


def overlap_correspondences(prev: list, new: list, points_per_frame: int = 4096):
    """3D correspondences of the same pixels of the overlap frames: `prev` and `new` are lists of
    (c2w, K, depth, conf) of the same frames in two reconstructions. Returns (src = new points,
    dst = prev points, weights = sqrt((conf_prev - 1)(conf_new - 1)), the confidences' excess over
    their floor of 1), keeping pixels with positive, finite depth in both."""
    src, dst, wts = [], [], []
    for (c2w_p, K_p, d_p, c_p), (c2w_n, K_n, d_n, c_n) in zip(prev, new):
        h, w = d_n.shape
        step = max(1, int(np.sqrt(h * w / points_per_frame)))
        Xp, idx = _sample_points(c2w_p, K_p, d_p, step)
        Xn, _ = _sample_points(c2w_n, K_n, d_n, step)
        if c_p is None or c_n is None:
            cw = np.ones(len(idx))
        else:
            cw = np.sqrt(np.clip(c_p.ravel()[idx] - 1.0, 0, None) * np.clip(c_n.ravel()[idx] - 1.0, 0, None))
        ok = (np.isfinite(Xp).all(1) & np.isfinite(Xn).all(1) & np.isfinite(cw)
              & (d_p.ravel()[idx] > 0) & (d_n.ravel()[idx] > 0))
        src.append(Xn[ok])
        dst.append(Xp[ok])
        wts.append(cw[ok])
    return np.concatenate(src), np.concatenate(dst), np.concatenate(wts)


def overlap_similarity(prev: list, new: list, points_per_frame: int = 4096) -> tuple[np.ndarray, dict]:
    """4x4 similarity S placing reconstruction `new` onto `prev` (x_prev ≈ S x_new) from their
    overlap frames (see `overlap_correspondences`), by confidence-weighted Huber IRLS
    (engine.align.irls_sim3) with rejection of residuals beyond 3 robust sigmas. Returns (S, info)
    with info = {"scale", "points", "inliers" (share at full weight), "rms" (weighted residual)}."""
    src, dst, wts = overlap_correspondences(prev, new, points_per_frame)
    if len(src) < 3 or wts.sum() <= 0:
        raise EngineError("the overlap frames carry no usable depth to align the next window/chunk")
    # Huber IRLS alone holds up to ~10 % gross outliers (wrong depths along the rays); beyond that
    # its start (plain Umeyama) is too far off, so points past 3 robust sigmas of the fit are
    # dropped and the fit repeated, until the kept set stops changing (at most 3 rounds).
    keep = wts
    for _ in range(4):
        s, R, t, w_final = irls_sim3(src, dst, keep)
        res = np.linalg.norm(dst - (s * src @ R.T + t), axis=1)
        live = keep > 0
        sigma = 1.4826 * float(np.median(res[live]))
        new_keep = np.where(res <= 3.0 * max(sigma, 1e-12), wts, 0.0)
        if (new_keep > 0).sum() < 3 or np.array_equal(new_keep > 0, live):
            break
        keep = new_keep
    used = wts > 0
    info = {"scale": float(s), "points": int(used.sum()),
            "inliers": float((w_final[used] >= 0.999 * wts[used]).mean()) if used.any() else 0.0,
            "rms": float(np.sqrt(np.average(res ** 2, weights=np.maximum(w_final, 1e-300))))}
    return sim3_matrix(s, R, t), info

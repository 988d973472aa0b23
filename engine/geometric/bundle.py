"""Sliding-window bundle adjustment with scipy.optimize.least_squares.

Variables: a left rotation increment and a translation per free keyframe (world-to-camera), and
each point's position. Residuals: pixel reprojection errors. The Jacobian is taken by finite
differences over a sparse `jac_sparsity` pattern (each residual touches one camera and one
point), and a Huber loss tames the outliers that slip through tracking."""
from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares
from scipy.sparse import coo_matrix

from .geometry import so3_exp


def bundle_adjust(K, Rs, ts, fixed, X, cam_idx, pt_idx, uv, f_scale=1.5, max_nfev=12):
    """Refine poses (Rs n×3×3, ts n×3, world-to-camera; `fixed` n bools) and points X (m×3) from
    observations (cam_idx, pt_idx, uv). Returns (Rs, ts, X, per-observation error in px)."""
    Rs = np.asarray(Rs, np.float64)
    ts = np.asarray(ts, np.float64)
    X = np.asarray(X, np.float64)
    fixed = np.asarray(fixed, bool)
    free = np.flatnonzero(~fixed)
    nf, m = len(free), len(X)
    slot = np.full(len(Rs), -1)
    slot[free] = np.arange(nf)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    n_obs = len(cam_idx)

    def unpack(p):
        dw = p[:3 * nf].reshape(nf, 3)
        dt = p[3 * nf:6 * nf].reshape(nf, 3)
        R = Rs.copy()
        t = ts.copy()
        if nf:
            R[free] = so3_exp(dw) @ Rs[free]
            t[free] = ts[free] + dt
        return R, t, X + p[6 * nf:].reshape(m, 3)

    def residuals(p):
        R, t, P = unpack(p)
        Xc = np.einsum("nij,nj->ni", R[cam_idx], P[pt_idx]) + t[cam_idx]
        z = np.maximum(Xc[:, 2], 1e-6)
        r = np.empty((n_obs, 2))
        r[:, 0] = fx * Xc[:, 0] / z + cx - uv[:, 0]
        r[:, 1] = fy * Xc[:, 1] / z + cy - uv[:, 1]
        return r.ravel()

    # sparsity: rows 2k, 2k+1 depend on the camera's 6 parameters (if free) and the point's 3
    rows, cols = [], []
    obs = np.arange(n_obs)
    s = slot[cam_idx]
    has = s >= 0
    for d in range(2):
        r = 2 * obs + d
        for j in range(3):
            rows += [r[has], r[has]]
            cols += [3 * s[has] + j, 3 * nf + 3 * s[has] + j]
            rows.append(r)
            cols.append(6 * nf + 3 * pt_idx + j)
    rows = np.concatenate(rows)
    cols = np.concatenate(cols)
    sparsity = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(2 * n_obs, 6 * nf + 3 * m)).tocsr()
    sol = least_squares(residuals, np.zeros(6 * nf + 3 * m), jac_sparsity=sparsity, method="trf",
                        loss="huber", f_scale=f_scale, max_nfev=max_nfev, x_scale="jac",
                        tr_solver="lsmr", xtol=1e-6, ftol=1e-6)
    R, t, P = unpack(sol.x)
    err = np.linalg.norm(residuals(sol.x).reshape(-1, 2), axis=1)
    return R, t, P, err

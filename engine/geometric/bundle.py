"""Sliding-window bundle adjustment.

Variables: a left rotation increment and a translation per free keyframe (world-to-camera), and
each point's position. Residuals: pixel reprojection errors; each touches one camera and one
point, so the Jacobian is sparse and is computed analytically.

Two solvers share that model:
- `method="schur"` (default): Levenberg-Marquardt with the points eliminated by the Schur
  complement (a dense 6k×6k camera system, k ≤ window) and a Huber loss by iterative
  reweighting. Faster than the scipy path at the same accuracy (figures: docs/geometric.md).
- `method="scipy"`: scipy.optimize.least_squares (trf) with the sparse Jacobian (or finite
  differences over the `jac_sparsity` pattern) and a soft-L1 loss. It is exact but its inner
  LSMR solves dominate (hundreds of sparse mat-vecs per step; truncating them lost most of the
  accuracy), so it stays as the reference the tests compare against.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares
from scipy.sparse import coo_matrix

from .geometry import skew, so3_exp


def bundle_adjust(K, Rs, ts, fixed, X, cam_idx, pt_idx, uv, f_scale=1.5, max_nfev=20, analytic=True,
                  loss="soft_l1", tr_options=None, method="schur"):
    """Refine poses (Rs n×3×3, ts n×3, world-to-camera; `fixed` n bools) and points X (m×3) from
    observations (cam_idx, pt_idx, uv). Returns (Rs, ts, X, per-observation error in px)."""
    Rs = np.asarray(Rs, np.float64)
    ts = np.asarray(ts, np.float64)
    X = np.asarray(X, np.float64)
    fixed = np.asarray(fixed, bool)
    cam_idx = np.asarray(cam_idx)
    pt_idx = np.asarray(pt_idx)
    uv = np.asarray(uv, np.float64)
    if method == "schur":
        return _lm_schur(K, Rs, ts, fixed, X, cam_idx, pt_idx, uv, f_scale, max_nfev)
    if method != "scipy":
        raise ValueError(f"unknown bundle adjustment method {method!r} (schur or scipy)")
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
    shape = (2 * n_obs, 6 * nf + 3 * m)
    sparsity = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=shape)

    # analytic Jacobian with the same (rows, cols) layout as the sparsity pattern above
    def jacobian(p):
        R, t, P = unpack(p)
        Xc = np.einsum("nij,nj->ni", R[cam_idx], P[pt_idx]) + t[cam_idx]
        z = np.maximum(Xc[:, 2], 1e-6)
        Jp = np.zeros((n_obs, 2, 3))           # d(u, v) / d Xc
        Jp[:, 0, 0] = fx / z
        Jp[:, 0, 2] = -fx * Xc[:, 0] / z ** 2
        Jp[:, 1, 1] = fy / z
        Jp[:, 1, 2] = -fy * Xc[:, 1] / z ** 2
        RX = Xc - t[cam_idx]                     # d Xc / d dw = -[R X]x (left increment)
        Jw = -np.einsum("nij,njk->nik", Jp, skew(RX))
        Jx = np.einsum("nij,njk->nik", Jp, R[cam_idx])
        data = []
        for d in range(2):
            for j in range(3):
                data += [Jw[has, d, j], Jp[has, d, j], Jx[:, d, j]]
        return coo_matrix((np.concatenate(data), (rows, cols)), shape=shape).tocsr()

    sol = least_squares(residuals, np.zeros(shape[1]), jac=jacobian if analytic else "2-point",
                        jac_sparsity=None if analytic else sparsity.tocsr(), method="trf",
                        loss=loss, f_scale=f_scale, max_nfev=max_nfev, x_scale=1.0,
                        tr_solver="lsmr", tr_options=tr_options or {}, xtol=1e-6, ftol=1e-6)
    R, t, P = unpack(sol.x)
    err = np.linalg.norm(residuals(sol.x).reshape(-1, 2), axis=1)
    return R, t, P, err


def _project_jac(K, R, t, P, cam_idx, pt_idx, uv, want_jac=True):
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    Xc = np.einsum("nij,nj->ni", R[cam_idx], P[pt_idx]) + t[cam_idx]
    z = np.maximum(Xc[:, 2], 1e-6)
    r = np.stack([fx * Xc[:, 0] / z + cx - uv[:, 0], fy * Xc[:, 1] / z + cy - uv[:, 1]], 1)
    if not want_jac:
        return r, None, None
    Jp = np.zeros((len(r), 2, 3))
    Jp[:, 0, 0] = fx / z
    Jp[:, 0, 2] = -fx * Xc[:, 0] / z ** 2
    Jp[:, 1, 1] = fy / z
    Jp[:, 1, 2] = -fy * Xc[:, 1] / z ** 2
    Jc = np.concatenate([-np.einsum("nij,njk->nik", Jp, skew(Xc - t[cam_idx])), Jp], 2)   # 2×6
    Jx = np.einsum("nij,njk->nik", Jp, R[cam_idx])                                        # 2×3
    return r, Jc, Jx


def _huber(e, delta):
    cost = np.where(e <= delta, 0.5 * e * e, delta * (e - 0.5 * delta)).sum()
    w = np.where(e <= delta, 1.0, delta / np.maximum(e, 1e-12))
    return cost, w


def _lm_schur(K, Rs, ts, fixed, X, cam_idx, pt_idx, uv, delta, max_iter):
    free = np.flatnonzero(~fixed)
    nf, m = len(free), len(X)
    slot = np.full(len(Rs), -1)
    slot[free] = np.arange(nf)
    R, t, P = Rs.copy(), ts.copy(), X.copy()
    fo = np.flatnonzero(slot[cam_idx] >= 0)          # observations in free cameras
    fs, fp = slot[cam_idx[fo]], pt_idx[fo]
    # pairs of free observations of the same point (for the Schur complement), built once
    order = np.argsort(fp, kind="stable")
    counts = np.bincount(fp, minlength=m)
    kmax = int(counts.max()) if len(fo) else 0
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    rank = np.arange(len(order)) - starts[fp[order]]
    table = np.full((m, max(kmax, 1)), -1)
    table[fp[order], rank] = order
    r, Jc, Jx = _project_jac(K, R, t, P, cam_idx, pt_idx, uv)
    cost, w = _huber(np.linalg.norm(r, axis=1), delta)
    lam = 1e-4
    for _ in range(max_iter):
        wr = w[:, None] * r
        Hpp = np.zeros((m, 3, 3))
        np.add.at(Hpp, pt_idx, w[:, None, None] * np.einsum("nki,nkj->nij", Jx, Jx))
        gp = np.zeros((m, 3))
        np.add.at(gp, pt_idx, np.einsum("nki,nk->ni", Jx, wr))
        Jcf, Jxf, wf = Jc[fo], Jx[fo], w[fo]
        Hcc = np.zeros((nf, 6, 6))
        np.add.at(Hcc, fs, wf[:, None, None] * np.einsum("nki,nkj->nij", Jcf, Jcf))
        gc = np.zeros((nf, 6))
        np.add.at(gc, fs, np.einsum("nki,nk->ni", Jcf, wr[fo]))
        Hcp = wf[:, None, None] * np.einsum("nki,nkj->nij", Jcf, Jxf)                 # 6×3 per obs
        improved = False
        for _trial in range(6):
            Hpp_d = Hpp + (lam * np.einsum("nii->ni", Hpp) + 1e-9)[:, :, None] * np.eye(3)
            Hpp_inv = np.linalg.inv(Hpp_d)
            if nf:
                A = np.einsum("nij,njk->nik", Hcp, Hpp_inv[fp])                        # 6×3
                S4 = np.zeros((nf, nf, 6, 6))
                Hcc_d = Hcc + (lam * np.einsum("nii->ni", Hcc) + 1e-9)[:, :, None] * np.eye(6)
                S4[np.arange(nf), np.arange(nf)] += Hcc_d
                for a in range(kmax):
                    ia = table[:, a]
                    for b in range(kmax):
                        ib = table[:, b]
                        v = (ia >= 0) & (ib >= 0)
                        if not v.any():
                            continue
                        i, j = ia[v], ib[v]
                        np.add.at(S4, (fs[i], fs[j]), -np.einsum("nij,nkj->nik", A[i], Hcp[j]))
                S = S4.transpose(0, 2, 1, 3).reshape(6 * nf, 6 * nf)
                bvec = gc.copy()
                np.add.at(bvec, fs, -np.einsum("nij,nj->ni", A, gp[fp]))
                try:
                    dc = np.linalg.solve(S, -bvec.ravel()).reshape(nf, 6)
                except np.linalg.LinAlgError:
                    lam *= 10
                    continue
                rhs = gp.copy()
                np.add.at(rhs, fp, np.einsum("nji,nj->ni", Hcp, dc[fs]))
            else:
                dc = np.zeros((0, 6))
                rhs = gp
            dp = -np.einsum("nij,nj->ni", Hpp_inv, rhs)
            R2, t2 = R.copy(), t.copy()
            if nf:
                R2[free] = so3_exp(dc[:, :3]) @ R[free]
                t2[free] = t[free] + dc[:, 3:]
            P2 = P + dp
            r2, _, _ = _project_jac(K, R2, t2, P2, cam_idx, pt_idx, uv, want_jac=False)
            cost2, w2 = _huber(np.linalg.norm(r2, axis=1), delta)
            if cost2 < cost:
                step_small = np.abs(dp).max(initial=0) < 1e-10 and np.abs(dc).max(initial=0) < 1e-10
                rel = (cost - cost2) / max(cost, 1e-12)
                R, t, P, cost, w = R2, t2, P2, cost2, w2
                lam = max(lam / 3.0, 1e-7)
                improved = True
                break
            lam *= 4.0
        if not improved or rel < 1e-6 or step_small:
            break
        r, Jc, Jx = _project_jac(K, R, t, P, cam_idx, pt_idx, uv)
    r, _, _ = _project_jac(K, R, t, P, cam_idx, pt_idx, uv, want_jac=False)
    return R, t, P, np.linalg.norm(r, axis=1)


def refine_focal(K, Rs, ts, fixed, X, cam_idx, pt_idx, uv, f_scale=1.0, max_nfev=30):
    """Bundle adjustment with one shared focal length (square pixels, principal point kept):
    self-calibration once the map is well conditioned. Same model as `bundle_adjust` plus the
    log focal scale a (fx, fy = e^a · K's); soft-L1 loss, analytic sparse Jacobian.

    Returns (K', Rs, ts, X, per-observation error in px, sigma of log f) -- sigma from the
    Gauss-Newton information of a with every pose and point marginalised (the residuals' robust
    spread as the noise level), so it says how well these views constrain the focal length."""
    from scipy.sparse import diags
    from scipy.sparse.linalg import spsolve
    Rs = np.asarray(Rs, np.float64)
    ts = np.asarray(ts, np.float64)
    X = np.asarray(X, np.float64)
    fixed = np.asarray(fixed, bool)
    cam_idx, pt_idx, uv = np.asarray(cam_idx), np.asarray(pt_idx), np.asarray(uv, np.float64)
    free = np.flatnonzero(~fixed)
    nf, m, n_obs = len(free), len(X), len(cam_idx)
    slot = np.full(len(Rs), -1)
    slot[free] = np.arange(nf)
    fx0, fy0, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    s = slot[cam_idx]
    has = s >= 0
    obs = np.arange(n_obs)
    rows, cols = [], []
    for d in range(2):
        r = 2 * obs + d
        for j in range(3):
            rows += [r[has], r[has], r]
            cols += [3 * s[has] + j, 3 * nf + 3 * s[has] + j, 6 * nf + 3 * pt_idx + j]
        rows.append(r)
        cols.append(np.full(n_obs, 6 * nf + 3 * m))
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    shape = (2 * n_obs, 6 * nf + 3 * m + 1)

    def unpack(p):
        R, t = Rs.copy(), ts.copy()
        if nf:
            R[free] = so3_exp(p[:3 * nf].reshape(nf, 3)) @ Rs[free]
            t[free] = ts[free] + p[3 * nf:6 * nf].reshape(nf, 3)
        return R, t, X + p[6 * nf:6 * nf + 3 * m].reshape(m, 3), np.exp(p[-1])

    def residuals(p):
        R, t, P, e = unpack(p)
        Xc = np.einsum("nij,nj->ni", R[cam_idx], P[pt_idx]) + t[cam_idx]
        z = np.maximum(Xc[:, 2], 1e-6)
        return np.stack([e * fx0 * Xc[:, 0] / z + cx - uv[:, 0], e * fy0 * Xc[:, 1] / z + cy - uv[:, 1]], 1).ravel()

    def jacobian(p):
        R, t, P, e = unpack(p)
        fx, fy = e * fx0, e * fy0
        Xc = np.einsum("nij,nj->ni", R[cam_idx], P[pt_idx]) + t[cam_idx]
        z = np.maximum(Xc[:, 2], 1e-6)
        Jp = np.zeros((n_obs, 2, 3))
        Jp[:, 0, 0] = fx / z
        Jp[:, 0, 2] = -fx * Xc[:, 0] / z ** 2
        Jp[:, 1, 1] = fy / z
        Jp[:, 1, 2] = -fy * Xc[:, 1] / z ** 2
        Jw = -np.einsum("nij,njk->nik", Jp, skew(Xc - t[cam_idx]))
        Jx = np.einsum("nij,njk->nik", Jp, R[cam_idx])
        Ja = np.stack([fx * Xc[:, 0] / z, fy * Xc[:, 1] / z], 1)      # d(u, v) / d log f
        data = []
        for d in range(2):
            for j in range(3):
                data += [Jw[has, d, j], Jp[has, d, j], Jx[:, d, j]]
            data.append(Ja[:, d])
        return coo_matrix((np.concatenate(data), (rows, cols)), shape=shape).tocsr()

    sol = least_squares(residuals, np.zeros(shape[1]), jac=jacobian, method="trf", loss="soft_l1",
                        f_scale=f_scale, max_nfev=max_nfev, x_scale="jac", tr_solver="lsmr",
                        xtol=1e-8, ftol=1e-8)
    R, t, P, e = unpack(sol.x)
    res = residuals(sol.x)
    err = np.linalg.norm(res.reshape(-1, 2), axis=1)
    # information of log f with the rest marginalised: J_a'J_a - J_a'J_o (J_o'J_o)^-1 J_o'J_a over
    # the inlier observations (gauge freedoms get a tiny prior so the solve is defined)
    inl = np.repeat(err < 3.0 * f_scale, 2)
    J = jacobian(sol.x)[inl]
    Jo, Ja = J[:, :-1], J[:, -1]
    A = (Jo.T @ Jo + diags(np.full(Jo.shape[1], 1e-6))).tocsc()
    b = Jo.T @ Ja.toarray().ravel()
    info = float((Ja.T @ Ja).toarray().ravel()[0]) - float(b @ spsolve(A, b))
    sigma_px = 1.4826 * float(np.median(np.abs(res[inl]))) if inl.any() else 1.0
    sigma = sigma_px / np.sqrt(max(info, 1e-18))
    K2 = np.array(K, np.float64).copy()
    K2[0, 0], K2[1, 1] = e * fx0, e * fy0
    return K2, R, t, P, err, float(sigma)

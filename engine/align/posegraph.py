"""A sparse Sim(3) pose graph: nodes are similarity poses (node frame → world), edges are
measured relative similarities with information weights. Used by loop closure (keyframes of a
monocular map whose scale drifts) and by the windowed neural mode (chunks placed in one world).

Residual of an edge (i, j, Z): r = log(Z⁻¹ · T_i⁻¹ · T_j) in the chart of `sim3_exp`
(ω, u, log s), whitened by the information matrix. Nodes are updated on the right,
T_i ← T_i · exp(δ_i), so the scale of every node is a free variable: a loop edge carrying the
measured scale spreads the scale drift along the loop (Strasdat et al. 2010).

Two solvers of the same problem:
- `method="lm"` (default): Levenberg-Marquardt; the 7×14 Jacobian blocks of all edges are taken by
  vectorised central differences, the normal equations (block-sparse, 7n×7n) are solved with a
  sparse LU (scipy.sparse.linalg.splu). Optional Huber kernels on edges by reweighting.
- `method="scipy"`: scipy.optimize.least_squares (trf) over the same residuals with the sparsity
  pattern (finite differences grouped by it), kept as the reference.
See docs/geometric.md for which is faster (measured).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

from ..geometry import sim3_exp, sim3_inverse, sim3_log

__all__ = ["Sim3PoseGraph"]


@dataclass
class _Edge:
    i: int
    j: int
    Z: np.ndarray          # measured T_i⁻¹ T_j
    sqrt_info: np.ndarray  # 7×7, r_w = sqrt_info @ r
    huber: Optional[float]


class Sim3PoseGraph:
    """Build with `add_node` / `add_edge`, then `optimize()`; read the result with `pose(i)` /
    `poses()`. If no node is fixed, node 0 is held fixed (the gauge)."""

    def __init__(self):
        self._T: list[np.ndarray] = []
        self._fixed: list[bool] = []
        self.edges: list[_Edge] = []

    # --- building -----------------------------------------------------------------------------
    def add_node(self, T: np.ndarray, fixed: bool = False) -> int:
        """Add a node with initial pose T (4×4 similarity, node frame → world); returns its index."""
        T = np.asarray(T, np.float64).reshape(4, 4)
        if not np.all(np.isfinite(T)) or np.linalg.det(T[:3, :3]) <= 0:
            raise ValueError("pose-graph node must be a finite proper similarity")
        self._T.append(T.copy())
        self._fixed.append(bool(fixed))
        return len(self._T) - 1

    def set_fixed(self, i: int, fixed: bool = True) -> None:
        self._fixed[i] = bool(fixed)

    def add_edge(self, i: int, j: int, Z: Optional[np.ndarray] = None, information=1.0,
                 huber: Optional[float] = None) -> None:
        """Constraint T_i⁻¹ T_j ≈ Z (None = the current relative pose, e.g. odometry).
        information: a scalar, 7 diagonal weights (ω, u, log s order) or a 7×7 matrix.
        huber: robust kernel threshold on the whitened residual norm (None = plain squares)."""
        n = len(self._T)
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise ValueError(f"pose-graph edge ({i}, {j}) needs two different existing nodes")
        Z = sim3_inverse(self._T[i]) @ self._T[j] if Z is None else np.asarray(Z, np.float64).reshape(4, 4)
        info = np.asarray(information, np.float64)
        if info.ndim == 0:
            info = np.eye(7) * float(info)
        elif info.shape == (7,):
            info = np.diag(info)
        if info.shape != (7, 7):
            raise ValueError("information must be a scalar, 7 weights or a 7×7 matrix")
        try:
            L = np.linalg.cholesky(info)
        except np.linalg.LinAlgError:
            raise ValueError("information matrix must be symmetric positive definite") from None
        self.edges.append(_Edge(i, j, Z, L.T.copy(), huber))

    def pose(self, i: int) -> np.ndarray:
        return self._T[i].copy()

    def poses(self) -> np.ndarray:
        return np.array(self._T)

    def __len__(self) -> int:
        return len(self._T)

    # --- residuals ------------------------------------------------------------------------------
    def _arrays(self):
        E = self.edges
        return (np.array([e.i for e in E]), np.array([e.j for e in E]),
                sim3_inverse(np.array([e.Z for e in E])), np.array([e.sqrt_info for e in E]))

    @staticmethod
    def _res(Ti, Tj, Zinv, L):
        r = sim3_log(Zinv @ sim3_inverse(Ti) @ Tj)
        return np.einsum("nij,nj->ni", L, r)

    def cost(self) -> float:
        if not self.edges:
            return 0.0
        I, J, Zinv, L = self._arrays()
        T = np.array(self._T)
        r = self._res(T[I], T[J], Zinv, L)
        return float(0.5 * self._robust_weights(r)[1])

    def _robust_weights(self, r):
        e = np.linalg.norm(r, axis=1)
        hub = np.array([np.inf if ed.huber is None else ed.huber for ed in self.edges])
        inside = e <= hub
        hf = np.where(inside, 0.0, hub)                 # finite where used
        w = np.where(inside, 1.0, hf / np.maximum(e, 1e-300))
        cost = np.where(inside, e * e, 2 * hf * e - hf * hf).sum()
        return w, cost

    # --- solving --------------------------------------------------------------------------------
    def optimize(self, iterations: int = 30, method: str = "lm", tol: float = 1e-10) -> dict:
        """Optimise all free nodes. Returns {"initial_cost", "final_cost", "iterations", "time_s",
        "method"} (costs are ½ Σ robustified squared whitened residuals)."""
        t0 = time.perf_counter()
        if not any(self._fixed) and self._T:
            self._fixed[0] = True
        c0 = self.cost()
        if not self.edges or all(self._fixed):
            return {"initial_cost": c0, "final_cost": c0, "iterations": 0, "time_s": 0.0, "method": method}
        if method == "lm":
            it = self._lm(iterations, tol)
        elif method == "scipy":
            it = self._scipy(iterations)
        else:
            raise ValueError(f"unknown pose-graph method {method!r} (lm or scipy)")
        return {"initial_cost": c0, "final_cost": self.cost(), "iterations": it,
                "time_s": time.perf_counter() - t0, "method": method}

    def _free_slots(self):
        slot = -np.ones(len(self._T), int)
        free = np.flatnonzero(~np.array(self._fixed))
        slot[free] = np.arange(len(free))
        return slot, len(free)

    def _jacobian_blocks(self, T, I, J, Zinv, L, eps=1e-6):
        """Residuals (E×7) and their derivatives w.r.t. δ_i and δ_j (E×7×7 each), by central
        differences vectorised over all edges."""
        Ti, Tj = T[I], T[J]
        r = self._res(Ti, Tj, Zinv, L)
        Ji = np.empty((len(I), 7, 7))
        Jj = np.empty((len(I), 7, 7))
        for k in range(7):
            d = np.zeros(7)
            d[k] = eps
            Ep, Em = sim3_exp(d), sim3_exp(-d)
            Ji[:, :, k] = (self._res(Ti @ Ep, Tj, Zinv, L) - self._res(Ti @ Em, Tj, Zinv, L)) / (2 * eps)
            Jj[:, :, k] = (self._res(Ti, Tj @ Ep, Zinv, L) - self._res(Ti, Tj @ Em, Zinv, L)) / (2 * eps)
        return r, Ji, Jj

    def _lm(self, iterations, tol):
        I, J, Zinv, L = self._arrays()
        slot, nf = self._free_slots()
        T = np.array(self._T)
        si, sj = slot[I], slot[J]
        # sparse layout of Jᵀ W J: the (a, b) 7×7 blocks for a, b ∈ {i, j} of every edge
        lam = 1e-4
        r = self._res(T[I], T[J], Zinv, L)
        w, cost = self._robust_weights(r)
        it = 0
        for it in range(1, iterations + 1):
            r, Ji, Jj = self._jacobian_blocks(T, I, J, Zinv, L)
            rows, cols, vals = [], [], []
            g = np.zeros(7 * nf)
            for sa, Ja in ((si, Ji), (sj, Jj)):
                ok = sa >= 0
                ga = np.einsum("nki,nk->ni", Ja[ok], w[ok, None] * r[ok])
                np.add.at(g.reshape(nf, 7), sa[ok], ga)
                for sb, Jb in ((si, Ji), (sj, Jj)):
                    ok2 = ok & (sb >= 0)
                    blk = np.einsum("nki,nkj->nij", Ja[ok2], w[ok2, None, None] * Jb[ok2])
                    rr = (7 * sa[ok2])[:, None, None] + np.arange(7)[None, :, None]
                    cc = (7 * sb[ok2])[:, None, None] + np.arange(7)[None, None, :]
                    rows.append(np.broadcast_to(rr, blk.shape).ravel())
                    cols.append(np.broadcast_to(cc, blk.shape).ravel())
                    vals.append(blk.ravel())
            H = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                              shape=(7 * nf, 7 * nf)).tocsc()
            diag = H.diagonal()
            improved = False
            for _ in range(8):
                A = (H + sp.diags(lam * np.maximum(diag, 1e-9) + 1e-12)).tocsc()
                try:
                    dx = -splu(A).solve(g)
                except RuntimeError:
                    lam *= 10
                    continue
                T2 = T.copy()
                free = slot >= 0
                T2[free] = T[free] @ sim3_exp(dx.reshape(nf, 7)[slot[free]])
                r2 = self._res(T2[I], T2[J], Zinv, L)
                w2, cost2 = self._robust_weights(r2)
                if cost2 <= cost:
                    rel = (cost - cost2) / max(cost, 1e-300)
                    T, cost, w = T2, cost2, w2
                    lam = max(lam / 5.0, 1e-9)
                    improved = True
                    break
                lam *= 5.0
            if not improved or rel < tol or np.abs(dx).max() < 1e-12:
                break
        self._T = [x for x in T]
        return it

    def _scipy(self, iterations):
        from scipy.optimize import least_squares
        I, J, Zinv, L = self._arrays()
        slot, nf = self._free_slots()
        T0 = np.array(self._T)
        free = slot >= 0
        hub = [e.huber for e in self.edges]
        if any(h is not None for h in hub):
            # least_squares has one global loss; use the smallest threshold for all edges
            loss, f_scale = "huber", float(min(h for h in hub if h is not None))
        else:
            loss, f_scale = "linear", 1.0

        def poses(x):
            T = T0.copy()
            T[free] = T0[free] @ sim3_exp(x.reshape(nf, 7)[slot[free]])
            return T

        def fun(x):
            T = poses(x)
            return self._res(T[I], T[J], Zinv, L).ravel()

        E = len(I)
        rows, cols = [], []
        for sa in (slot[I], slot[J]):
            ok = np.flatnonzero(sa >= 0)
            rr = (7 * ok)[:, None, None] + np.arange(7)[None, :, None]
            cc = (7 * sa[ok])[:, None, None] + np.arange(7)[None, None, :]
            rows.append(np.broadcast_to(rr, (len(ok), 7, 7)).ravel())
            cols.append(np.broadcast_to(cc, (len(ok), 7, 7)).ravel())
        pattern = sp.coo_matrix((np.ones(sum(len(r) for r in rows)), (np.concatenate(rows), np.concatenate(cols))),
                                shape=(7 * E, 7 * nf)).tocsr()
        sol = least_squares(fun, np.zeros(7 * nf), jac_sparsity=pattern, method="trf", loss=loss,
                            f_scale=f_scale, max_nfev=max(iterations, 1) * 3, x_scale=1.0,
                            tr_solver="lsmr", xtol=1e-10, ftol=1e-10)
        T = poses(sol.x)
        self._T = [x for x in T]
        return int(sol.nfev)

"""Focal-length self-calibration from KLT tracks (no intrinsics given).

Model: square pixels, principal point at the image centre, one unknown focal length f.

For a pair of frames the fundamental matrix F (RANSAC, then the 8-point fit on its inliers) does
not depend on f; with the right f, E = Kᵀ F K is an essential matrix, whose two non-zero singular
values are equal (Mendonça & Cipolla). Each pair contributes the cost (σ₁ − σ₂)/(σ₁ + σ₂) of
Kᵀ F K as a function of f; the estimate minimises the sum over many pairs (gaps of 4–24 frames,
so both rotation-heavy and translation-heavy pairs count) on a fine log grid with a parabolic
refinement. Its uncertainty is the spread of the minimiser over a seeded bootstrap of the pairs,
so a clip whose pairs disagree reports a large uncertainty instead of a confident wrong number.

The session holds the first frames (the tracker is not started) until the estimate is certain
enough or `max_frames` have been seen, then starts the tracker with the estimate and tracks the
held frames again through it (see GeometricSession).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import cv2
import numpy as np

__all__ = ["FocalEstimate", "FocalEstimator"]


@dataclass(frozen=True)
class FocalEstimate:
    focal: float          # px, at the working resolution
    sigma: float          # px, one standard deviation (bootstrap over frame pairs)
    pairs: int            # frame pairs that contributed
    frames: int           # frames looked at

    @property
    def rel_sigma(self) -> float:
        return self.sigma / self.focal


class FocalEstimator:
    GAPS = (4, 8, 12, 16, 24)      # frame gaps of the pairs (every second frame as the first)
    MIN_FLOW_PX = 4.0              # a pair needs this median track motion (at 640 wide)
    MIN_INLIERS = 30

    def __init__(self, width: int, height: int, fov_range_deg=(20.0, 120.0), bootstrap: int = 200):
        self.w, self.h = int(width), int(height)
        self.cx, self.cy = (width - 1) / 2.0, (height - 1) / 2.0
        lo = (width / 2.0) / math.tan(math.radians(fov_range_deg[1]) / 2.0)
        hi = (width / 2.0) / math.tan(math.radians(fov_range_deg[0]) / 2.0)
        self.grid = np.exp(np.linspace(math.log(lo), math.log(hi), 241))
        self.px = width / 640.0
        self.bootstrap = bootstrap
        self.frames: list[dict] = []          # per frame: track id → uv
        self._curves: dict[tuple, Optional[np.ndarray]] = {}

    def add_frame(self, ids, uv) -> None:
        self.frames.append({int(i): np.asarray(q, np.float64) for i, q in zip(np.asarray(ids).tolist(), uv)})

    def _curve(self, i: int, j: int) -> Optional[np.ndarray]:
        key = (i, j)
        if key in self._curves:
            return self._curves[key]
        a, b = self.frames[i], self.frames[j]
        common = [k for k in a if k in b]
        out = None
        if len(common) >= 2 * self.MIN_INLIERS:
            p0 = np.array([a[k] for k in common])
            p1 = np.array([b[k] for k in common])
            if np.median(np.linalg.norm(p1 - p0, axis=1)) >= self.MIN_FLOW_PX * self.px:
                F, m = cv2.findFundamentalMat(p0, p1, cv2.FM_RANSAC, 1.0 * self.px, 0.999)
                if F is not None and F.shape == (3, 3) and m is not None and int(m.sum()) >= self.MIN_INLIERS:
                    m = m.ravel() > 0
                    F8, _ = cv2.findFundamentalMat(p0[m], p1[m], cv2.FM_8POINT)
                    if F8 is not None and F8.shape == (3, 3):
                        F = F8
                    out = self._mc_cost(F)
        self._curves[key] = out
        return out

    def _mc_cost(self, F: np.ndarray) -> np.ndarray:
        f = self.grid
        K = np.zeros((len(f), 3, 3))
        K[:, 0, 0] = K[:, 1, 1] = f
        K[:, 0, 2], K[:, 1, 2], K[:, 2, 2] = self.cx, self.cy, 1.0
        E = np.einsum("nji,jk,nkl->nil", K, F, K)
        sv = np.linalg.svd(E, compute_uv=False)
        return (sv[:, 0] - sv[:, 1]) / np.maximum(sv[:, 0] + sv[:, 1], 1e-300)

    def _argmin(self, c: np.ndarray) -> float:
        k = int(np.argmin(c))
        if 0 < k < len(c) - 1:        # parabola through the three grid values (in log f)
            den = c[k - 1] - 2 * c[k] + c[k + 1]
            off = 0.5 * (c[k - 1] - c[k + 1]) / den if den > 0 else 0.0
            lg = np.log(self.grid)
            return float(np.exp(lg[k] + float(np.clip(off, -1, 1)) * (lg[1] - lg[0])))
        return float(self.grid[k])

    def estimate(self) -> Optional[FocalEstimate]:
        n = len(self.frames)
        curves = []
        for gap in self.GAPS:
            for i in range(0, n - gap, 2):
                c = self._curve(i, i + gap)
                if c is not None:
                    curves.append(c)
        if len(curves) < 3:
            return None
        C = np.array(curves)
        f = self._argmin(C.sum(0))
        rng = np.random.default_rng(0)
        boot = [self._argmin(C[rng.integers(0, len(C), len(C))].sum(0)) for _ in range(self.bootstrap)]
        sigma = float(np.std(np.log(boot))) * f
        # a minimum at the edge of the searched range is no estimate
        if f <= self.grid[1] or f >= self.grid[-2]:
            return None
        return FocalEstimate(f, max(sigma, 1e-3 * f), len(C), n)

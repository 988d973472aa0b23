"""Similarity geometry for every engine (numpy/scipy only, no torch, no Qt): fitting and
optimising similarities. The group operations are engine.geometry's, re-exported here beside
the estimators that use them.

- `umeyama(src, dst, weights=None, with_scale=True) -> (s, R, t)` with dst ≈ s·R·src + t.
- `irls_sim3(src, dst, weights=None, huber_delta=None, iterations=20) -> (s, R, t, w_final)`:
  confidence-weighted IRLS with Huber weights (robust to outliers).
- `sim3_matrix(s, R, t) -> 4×4`, `sim3_split`, `sim3_inverse`, the optimisation chart
  `sim3_exp` / `sim3_log`.
- `Sim3PoseGraph`: nodes = Sim(3) poses, relative-constraint edges with information weights,
  `optimize()` (sparse Levenberg-Marquardt, or scipy least_squares as reference).
- Applying corrections: `apply_to_c2w`, `apply_to_points`, `apply_to_depth`, `correction`.
- `overlap_similarity(prev, new)`: one reconstruction placed onto another from their overlap frames.
"""
from .overlap import overlap_correspondences, overlap_similarity
from .posegraph import Sim3PoseGraph
from ..geometry import (apply_to_c2w, apply_to_depth, apply_to_points, correction, sim3_exp, sim3_inverse,
                        sim3_log, sim3_matrix, sim3_split, so3_exp, so3_log)
from .sim3 import irls_sim3, umeyama

__all__ = ["umeyama", "irls_sim3", "sim3_matrix", "sim3_split", "sim3_inverse", "sim3_exp", "sim3_log",
           "so3_exp", "so3_log", "Sim3PoseGraph", "apply_to_c2w", "apply_to_points", "apply_to_depth",
           "correction", "overlap_similarity", "overlap_correspondences"]

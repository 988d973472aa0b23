"""Trajectory and depth accuracy metrics (numpy only).

- `umeyama(src, dst)` — least-squares similarity dst ≈ s·R·src + t (Umeyama 1991).
- `ate(est, gt)` — absolute trajectory error: RMSE of camera centres after Sim(3) alignment.
- `rpe(est, gt, timestamps)` — relative pose error per second of input time (translation after
  the Sim(3) scale, rotation in degrees).
- `scale_drift(est, gt, window=100)` — Sim(3) scale of each window of `window` consecutive frames
  (each aligned on its own), and how much it changes from one window to the next.
- `depth_metrics(preds, gts)` — AbsRel and δ<1.25 after ONE median scale for the whole sequence
  (monocular depth has the trajectory's arbitrary scale).
- `coverage(n_with_pose, n_frames)`.

Poses are 4×4 camera-to-world matrices.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

from .align.sim3 import umeyama as _align_umeyama

__all__ = ["umeyama", "apply_sim3", "ate", "rpe", "scale_drift", "depth_metrics", "coverage", "rotation_angle_deg"]


def umeyama(src: np.ndarray, dst: np.ndarray, with_scale: bool = True) -> tuple[float, np.ndarray, np.ndarray]:
    """Similarity (s, R, t) minimising Σ‖dst_i − (s R src_i + t)‖² (the one implementation lives in
    `engine.align.umeyama`, which also takes per-point weights)."""
    return _align_umeyama(src, dst, None, with_scale)


def apply_sim3(s: float, R: np.ndarray, t: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """Move camera-to-world poses (N×4×4) by the similarity x → sRx + t (rotation part stays
    orthonormal, translations are scaled)."""
    out = np.array(poses, np.float64, copy=True)
    out[:, :3, :3] = R @ out[:, :3, :3]
    out[:, :3, 3] = s * (out[:, :3, 3] @ R.T) + t
    return out


def rotation_angle_deg(R: np.ndarray) -> np.ndarray:
    """Rotation angle(s) in degrees of 3×3 (or N×3×3) rotation matrices."""
    R = np.asarray(R)
    tr = np.trace(R, axis1=-2, axis2=-1)
    return np.degrees(np.arccos(np.clip((tr - 1.0) / 2.0, -1.0, 1.0)))


def _as_poses(x) -> np.ndarray:
    a = np.asarray(x, np.float64)
    if a.ndim != 3 or a.shape[1:] != (4, 4):
        raise ValueError(f"expected N×4×4 camera-to-world poses, got shape {a.shape}")
    return a


def ate(est, gt, with_scale: bool = True) -> dict:
    """ATE RMSE (in gt units) of camera centres after aligning `est` to `gt` with Sim(3)
    (SE(3) if with_scale=False). Returns rmse, mean, median, max, the similarity and the
    aligned poses."""
    est, gt = _as_poses(est), _as_poses(gt)
    if len(est) != len(gt):
        raise ValueError(f"ATE needs matching pose lists, got {len(est)} and {len(gt)}")
    if len(est) < 3:
        raise ValueError("ATE needs at least 3 poses")
    s, R, t = umeyama(est[:, :3, 3], gt[:, :3, 3], with_scale)
    aligned = apply_sim3(s, R, t, est)
    err = np.linalg.norm(aligned[:, :3, 3] - gt[:, :3, 3], axis=1)
    return {
        "rmse": float(np.sqrt(np.mean(err ** 2))), "mean": float(err.mean()),
        "median": float(np.median(err)), "max": float(err.max()),
        "scale": s, "R": R, "t": t, "aligned": aligned, "errors": err,
    }


def rpe(est, gt, timestamps: Sequence[float], delta_s: float = 1.0, scale: float = 1.0) -> dict:
    """Relative pose error over pairs (i, j) whose input times differ by ≈ `delta_s` (the first
    frame j with t_j − t_i ≥ delta_s). `scale` multiplies estimated translations (use the Sim(3)
    scale from `ate`). Returns RMSE translation per second (gt units/s) and rotation in deg/s."""
    est, gt = _as_poses(est), _as_poses(gt)
    ts = np.asarray(timestamps, np.float64)
    if not (len(est) == len(gt) == len(ts)):
        raise ValueError("RPE needs poses and timestamps of the same length")
    trans, rot, dts = [], [], []
    j = 0
    for i in range(len(ts)):
        j = max(j, i + 1)
        while j < len(ts) and ts[j] - ts[i] < delta_s:
            j += 1
        if j >= len(ts):
            break
        dt = ts[j] - ts[i]
        if dt <= 0:
            continue
        rel_e = np.linalg.inv(est[i]) @ est[j]
        rel_g = np.linalg.inv(gt[i]) @ gt[j]
        rel_e[:3, 3] *= scale
        err = np.linalg.inv(rel_g) @ rel_e
        trans.append(np.linalg.norm(err[:3, 3]) / dt)
        rot.append(float(rotation_angle_deg(err[:3, :3])) / dt)
        dts.append(dt)
    if not trans:
        return {"trans_rmse_per_s": None, "rot_rmse_deg_per_s": None, "pairs": 0, "delta_s": delta_s}
    trans, rot = np.array(trans), np.array(rot)
    return {
        "trans_rmse_per_s": float(np.sqrt(np.mean(trans ** 2))),
        "rot_rmse_deg_per_s": float(np.sqrt(np.mean(rot ** 2))),
        "pairs": len(trans), "delta_s": float(np.mean(dts)),
    }


def scale_drift(est, gt, window: int = 100, min_spread: float = 0.01) -> dict:
    """Scale drift of a monocular trajectory: the Sim(3) scale that aligns each run of `window`
    consecutive poses to the ground truth on its own (windows whose ground-truth camera centres
    spread less than `min_spread` gt units are skipped: their scale is not observable). Returns
    {"window", "scales" (per window, divided by the first usable one), "drift_rms" (RMS of
    |log(s_k+1 / s_k)|, i.e. the typical relative scale change per `window` frames),
    "drift_max" (the largest such change), "range" (max / min window scale)}; None values when
    fewer than 2 windows are usable."""
    est, gt = _as_poses(est), _as_poses(gt)
    if len(est) != len(gt):
        raise ValueError("scale drift needs matching pose lists")
    window = max(int(window), 3)
    scales = []
    for a in range(0, len(est) - window // 2, window):   # a last window of ≥ half the size counts
        e, g = est[a:a + window, :3, 3], gt[a:a + window, :3, 3]
        if len(e) < 3 or np.linalg.norm(g - g.mean(0), axis=1).mean() < min_spread \
                or np.linalg.norm(e - e.mean(0), axis=1).mean() <= 0:
            scales.append(None)
            continue
        scales.append(umeyama(e, g)[0])
    usable = [x for x in scales if x is not None and x > 0]
    out = {"window": window, "scales": None, "drift_rms": None, "drift_max": None, "range": None,
           "windows": len(usable)}
    if len(usable) < 2:
        return out
    logs = np.log(np.array(usable))
    steps = np.abs(np.diff(logs))
    out.update(scales=[float(np.exp(x - logs[0])) for x in logs], drift_rms=float(np.sqrt(np.mean(steps ** 2))),
               drift_max=float(steps.max()), range=float(np.exp(logs.max() - logs.min())))
    return out


def depth_metrics(preds: Iterable[np.ndarray], gts: Iterable[np.ndarray],
                  masks: Optional[Iterable[np.ndarray]] = None, align: bool = True,
                  max_depth: float = np.inf) -> dict:
    """AbsRel = mean |s·d − d*| / d* and δ1 = fraction with max(s·d/d*, d*/(s·d)) < 1.25 over every
    pixel where both depths are valid (> 0, finite, gt ≤ max_depth) in all frames. `s` is ONE
    median ratio median(d*/d) over the whole sequence when align=True, else 1."""
    ps, gs = [], []
    masks = list(masks) if masks is not None else None
    for k, (p, g) in enumerate(zip(preds, gts)):
        p = np.asarray(p, np.float64)
        g = np.asarray(g, np.float64)
        if p.shape != g.shape:
            raise ValueError(f"depth pair {k}: shapes differ {p.shape} vs {g.shape}")
        m = np.isfinite(p) & np.isfinite(g) & (p > 0) & (g > 0) & (g <= max_depth)
        if masks is not None:
            m &= np.asarray(masks[k], bool)
        ps.append(p[m])
        gs.append(g[m])
    p = np.concatenate(ps) if ps else np.zeros(0)
    g = np.concatenate(gs) if gs else np.zeros(0)
    if p.size == 0:
        return {"abs_rel": None, "delta1": None, "scale": None, "pixels": 0}
    s = float(np.median(g / p)) if align else 1.0
    q = s * p
    ratio = np.maximum(q / g, g / q)
    return {
        "abs_rel": float(np.mean(np.abs(q - g) / g)),
        "delta1": float(np.mean(ratio < 1.25)),
        "scale": s, "pixels": int(p.size),
    }


def coverage(n_with_pose: int, n_frames: int) -> float:
    """Fraction of input frames that received a pose."""
    return float(n_with_pose) / n_frames if n_frames > 0 else 0.0
